// Rendezvous of a Gloo world (internal): the store (TCP store served by rank 0, or Gloo's file
// store), an arrival check (every rank present, all agreeing on the world size; a rank that finds
// a problem posts it so the others fail at once with the same reason) and the full-mesh connect.
#pragma once

#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include <chrono>
#include <memory>
#include <string>

namespace tpu::dist {

class TcpStoreServer;

class Rendezvous {
 public:
  // store_spec: "tcp://host:port" (rank 0 serves) or "file:///dir".
  Rendezvous(int rank, int world_size, const std::string& store_spec, std::chrono::milliseconds timeout);
  Rendezvous(Rendezvous&&) noexcept;
  ~Rendezvous();
  void arrive();
  std::shared_ptr<::gloo::Context> connect(int rank, int size, const std::string& prefix,
                                           std::shared_ptr<::gloo::transport::Device>& device);
  // A flag in the store (a group's ranks use it to tell an abort they caused from a dead peer).
  void set_flag(const std::string& key);
  bool has_flag(const std::string& key) { return has(key); }

 private:
  bool has(const std::string& key);
  [[noreturn]] void abort_all(const std::string& why);
  int rank_, world_;
  std::string spec_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<::gloo::rendezvous::Store> store_;
  bool is_tcp_ = false;
};

}  // namespace tpu::dist
