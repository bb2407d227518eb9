// A PJRT client: loads a PJRT plugin (any shared library exporting GetPjrtApi: libtpu, a CPU
// plugin, or our libpjrt_tpucore_sim.so), checks its API version, creates a client, lists its
// devices, compiles StableHLO modules (format "mlir", e.g. from tpu::export_stablehlo) and runs
// them on host tensors. The C declarations are device/pjrt/pjrt_c_api.h (PJRT C API 0.33).
//
// Not (yet) a `pjrt` device type: tensors live on the host between calls and every execute
// copies its inputs in and its outputs out.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tpucore/core/tensor.h"

struct PJRT_Api;
struct PJRT_Client;
struct PJRT_LoadedExecutable;

namespace tpu::pjrt {

class Executable;

class Client : public std::enable_shared_from_this<Client> {
 public:
  // Loads the plugin at `path` (empty: TPU_PJRT_PLUGIN; a bare name is also looked up next to
  // libtpucore). A library that cannot be loaded, does not export GetPjrtApi, has another major
  // version or a minor version older than 0.33, or fails to create a client is a tpu::Error
  // saying which.
  static std::shared_ptr<Client> load(const std::string& path = {});
  ~Client();

  const std::string& platform_name() const { return platform_; }
  int device_count() const { return int(devices_.size()); }
  int api_major() const;
  int api_minor() const;

  // Compiles a module; errors of the plugin's compiler are a tpu::Error with its message.
  std::shared_ptr<Executable> compile(const std::string& mlir_text);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

 private:
  friend class Executable;
  Client() = default;
  void check(void* err, const char* what) const;  // PJRT_Error*

  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  std::string path_, platform_;
  std::vector<void*> devices_;  // PJRT_Device*
};

class Executable {
 public:
  ~Executable();
  size_t num_outputs() const { return num_outputs_; }
  // Runs on device `device` of the client with host tensors (any device: copied to the host
  // first); returns the outputs as cpu tensors.
  std::vector<Tensor> execute(const std::vector<Tensor>& inputs, int device = 0);

 private:
  friend class Client;
  Executable() = default;
  std::shared_ptr<Client> client_;
  PJRT_LoadedExecutable* exe_ = nullptr;
  size_t num_outputs_ = 0;
};

}  // namespace tpu::pjrt
