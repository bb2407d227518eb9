// A small key-value store over TCP for the rendezvous of tpu::dist (internal). Rank 0 serves it
// on MASTER_ADDR:MASTER_PORT from a background thread; every rank (rank 0 too) is a client that
// connects with a timeout. It only carries the Gloo rendezvous (addresses, a few bytes per rank);
// tensors never pass through it.
#pragma once

#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tpu::dist {

class TcpStoreServer {
 public:
  // Binds host:port (a tpu::Error when the port is in use or the address is not local).
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();
  int port() const { return port_; }

 private:
  void serve();
  bool handle(int fd);
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::map<std::string, std::vector<char>> data_;
  std::thread thread_;
};

class TcpStoreClient : public ::gloo::rendezvous::Store {
 public:
  // Connects within `timeout` (retrying while the server is not up yet).
  TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TcpStoreClient() override;
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;  // waits for the key up to the timeout
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  bool check(const std::string& key);

 private:
  std::optional<std::vector<char>> request(char cmd, const std::string& key, const std::vector<char>& value);
  std::string where_;
  int fd_ = -1;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
};

}  // namespace tpu::dist
