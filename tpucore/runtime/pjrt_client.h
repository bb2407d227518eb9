/// @file
/// A PJRT client: loads a PJRT plugin (any shared library exporting GetPjrtApi: libtpu, a CPU
/// plugin, or our libpjrt_tpucore_sim.so), checks its API version, creates a client, lists its
/// devices, compiles StableHLO modules (format "mlir", e.g. from tpu::export_stablehlo) and runs
/// them on host tensors. The C declarations are device/pjrt/pjrt_c_api.h (PJRT C API 0.33).
///
/// Executable::execute takes and returns host tensors (copies in and out on every call);
/// execute_buffers keeps the data in PJRT buffers (what the `pjrt` device type uses, see
/// tpucore/runtime/pjrt_device.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tpucore/core/tensor.h"

struct PJRT_Api;
struct PJRT_Client;
struct PJRT_LoadedExecutable;
struct PJRT_Buffer;

namespace tpu::pjrt {

class Executable;
class Client;

/// A PJRT buffer on one device of a client (typed, dense, major to minor); destroyed with the
/// last reference. The client outlives its buffers.
class Buffer {
 public:
  ~Buffer();
  /// Element type.
  DType dtype() const { return dtype_; }
  /// Dimension sizes.
  const std::vector<int64_t>& dims() const { return dims_; }
  /// Index of the client's device holding it.
  int device() const { return device_; }
  /// Size in bytes (elements times element size).
  size_t nbytes() const;
  /// Copies the whole buffer to `dst` (n must be nbytes()).
  void to_host(void* dst, size_t n) const;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

 private:
  friend class Client;
  friend class Executable;
  Buffer() = default;
  std::shared_ptr<Client> client_;
  PJRT_Buffer* buf_ = nullptr;
  DType dtype_ = DType::f32;
  std::vector<int64_t> dims_;
  int device_ = 0;
};
/// Shared handle of a Buffer.
using BufferPtr = std::shared_ptr<Buffer>;

/// A loaded PJRT plugin and the client it created (shared: buffers and executables keep it alive).
class Client : public std::enable_shared_from_this<Client> {
 public:
  /// Loads the plugin at `path` (empty: TPU_PJRT_PLUGIN; a bare name is also looked up next to
  /// libtpucore). A library that cannot be loaded, does not export GetPjrtApi, has another major
  /// version or a minor version older than 0.33, or fails to create a client is a tpu::Error
  /// saying which.
  static std::shared_ptr<Client> load(const std::string& path = {});
  ~Client();

  /// The plugin's platform name (e.g. "cpu", "tpu").
  const std::string& platform_name() const { return platform_; }
  /// Number of addressable devices.
  int device_count() const { return int(devices_.size()); }
  /// The plugin's PJRT C API version, major and minor.
  ///@{
  int api_major() const;
  int api_minor() const;
  ///@}

  /// The path the plugin was loaded from.
  const std::string& path() const { return path_; }
  /// A new buffer on device `device` holding a copy of `data` (dense, major to minor).
  BufferPtr upload(const void* data, DType dtype, const std::vector<int64_t>& dims, int device);

  /// Compiles a module; errors of the plugin's compiler are a tpu::Error with its message.
  std::shared_ptr<Executable> compile(const std::string& mlir_text);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

 private:
  friend class Executable;
  friend class Buffer;
  void await_and_destroy(void* event, const char* what) const;  ///< PJRT_Event*
  Client() = default;
  void check(void* err, const char* what) const;  ///< PJRT_Error*

  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  std::string path_, platform_;
  std::vector<void*> devices_;  ///< PJRT_Device*
};

/// A compiled module of a Client.
class Executable {
 public:
  ~Executable();
  /// Number of results of the module.
  size_t num_outputs() const { return num_outputs_; }
  /// Runs on device `device` of the client with host tensors (any device: copied to the host
  /// first); returns the outputs as cpu tensors.
  std::vector<Tensor> execute(const std::vector<Tensor>& inputs, int device = 0);
  /// Runs on device `device` with buffers of this client; the outputs stay on the device.
  std::vector<BufferPtr> execute_buffers(const std::vector<BufferPtr>& inputs, int device = 0);

 private:
  friend class Client;
  Executable() = default;
  std::shared_ptr<Client> client_;
  PJRT_LoadedExecutable* exe_ = nullptr;
  size_t num_outputs_ = 0;
};

}  // namespace tpu::pjrt

namespace tpu {

// ---- the `pjrt` device type (tpucore/runtime/pjrt_device.cpp) ----
/// Loads a PJRT plugin as the driver of `pjrt:N` (one device per addressable device of the
/// plugin's client), replacing any previous one; returns the plugin's platform name. Without a
/// call, TPU_PJRT_PLUGIN names the plugin, loaded on the first use of a pjrt device. A library
/// that cannot be loaded, lacks GetPjrtApi, has another API version or cannot create a client is
/// a tpu::Error; the previous driver (or none) stays in place.
///
/// Eager ops on pjrt tensors run as single-op StableHLO executables (tpu::export_stablehlo of
/// the one op), compiled once per op, attributes, input shapes and dtypes and cached. An op
/// without a StableHLO counterpart (or one the plugin's compiler refuses) runs through the host
/// fallback (ops/fallback.h: counted, logged once per op); set_pjrt_host_fallback(false) (or
/// TPU_PJRT_HOST_FALLBACK=0) makes that a tpu::Error naming the op instead. A tpu::compile'd
/// function whose inputs are on a pjrt device is one executable per cache entry (its traced graph
/// exported whole); a graph with an unmapped op runs node by node instead (each node as above).
std::string load_pjrt_plugin(const std::string& path);

/// Counters of the `pjrt` device type since the start or reset_pjrt_stats().
struct PjrtStats {
  uint64_t compiles = 0;        ///< executables compiled (cache misses that mapped)
  uint64_t cache_hits = 0;      ///< eager op calls that reused a cached executable
  uint64_t executions = 0;      ///< executables run
  uint64_t uploads = 0;         ///< host -> device buffer transfers
  uint64_t downloads = 0;       ///< device -> host buffer transfers
  uint64_t host_fallbacks = 0;  ///< op calls that ran on the host (no StableHLO counterpart)
  uint64_t unmapped = 0;        ///< distinct op signatures found not to map
  uint64_t graph_compiles = 0;  ///< tpu::compile'd graphs compiled as one executable
  uint64_t graph_runs = 0;      ///< runs of those executables
};
/// The counters now.
PjrtStats pjrt_stats();
/// Zeroes the counters.
void reset_pjrt_stats();
/// Allows (true, the default) or forbids the host fallback of pjrt ops (see load_pjrt_plugin).
void set_pjrt_host_fallback(bool on);
/// Whether the host fallback is allowed.
bool pjrt_host_fallback();

}  // namespace tpu
