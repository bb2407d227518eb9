/// @file
/// Devices and drivers: how many devices a type has, their properties and free memory, the
/// simulated chip behind `sim` devices, and loading out-of-tree driver plugins.
///
///   tpu::set_sim_chip("tiny");                         // or TPU_SIM_CHIP=tiny
///   tpu::load_driver_plugin("libtpusim_plugin.so");    // `tpu:N` now runs on the plugin
///   tpu::Tensor x = tpu::ones({4, 4}, tpu::Device("tpu:0"));
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "device/driver.h"
#include "tpucore/core/device.h"

namespace tpu {

/// Name, memory size and capabilities of a device (device::DeviceProperties, device/driver.h).
using DeviceProperties = device::DeviceProperties;

/// Devices of a type; 0 when no driver is present for it.
int device_count(DeviceType type);
/// The properties of `device`; a tpu::Error when it has no driver or the index is out of range.
DeviceProperties device_properties(Device device);
/// Free device memory in bytes (after memory released by finished work).
size_t memory_free(Device device);

/// The chip of sim:index (every sim device when index < 0): a preset name (tiny, v4, v5e,
/// v5p, v6e, v7), a JSON file path or JSON text. A bad name is a tpu::Error listing the
/// presets; changing the chip of a device with live tensors is an error.
void set_sim_chip(const std::string& chip, int index = -1);

/// Loads a driver plugin (a shared library implementing device/plugin_abi.h) as the driver of
/// `type`; a bare file name is also looked up next to libtpucore. Returns the plugin's name.
/// Errors (not loadable, not a plugin, wrong ABI version) are tpu::Errors saying which.
std::string load_driver_plugin(const std::string& path, DeviceType type = DeviceType::tpu);

// ---- the simulated chip: counters and timing-only mode ----
/// Counters of the programs the library generated and ran on the `sim` devices (all of them
/// together) since the start or the last reset_sim_stats(). Cycles and bytes count finished runs:
/// call synchronize() on the devices first for complete figures.
struct SimStats {
  uint64_t programs_built = 0;    ///< programs generated and loaded (program cache misses)
  uint64_t cache_hits = 0;        ///< program cache hits
  uint64_t programs_evicted = 0;  ///< least recently used programs dropped from the cache
  uint64_t runs = 0;              ///< programs run (eager kernels and compiled regions)
  uint64_t host_fallbacks = 0;    ///< calls no chip kernel took (shape, dtype, layout): ran on the host
  double cycles = 0;              ///< simulated cycles of the finished runs
  uint64_t hbm_bytes = 0;         ///< HBM bytes read + written by the finished runs
  double mxu_flops = 0;           ///< MXU FLOPs of the finished runs
  std::map<std::string, uint64_t> runs_by_kernel;  ///< by kernel name ("add", "matmul", "region:...")
  std::map<std::string, double> cycles_by_kernel;  ///< simulated cycles per kernel name
};
/// The counters now.
SimStats sim_stats();
/// Zeroes the counters.
void reset_sim_stats();

/// Timing-only mode of the `sim` devices: the programs the library generates skip their
/// arithmetic but take the same simulated cycles, so model-sized work is costed in seconds of
/// host time. Tensor values computed meanwhile are garbage. Off by default; applies to every sim
/// device and every thread. SimTimingOnly turns it on for a scope (and restores the old mode).
void set_sim_timing_only(bool on);
/// Whether timing-only mode is on.
bool sim_timing_only();
/// Turns timing-only mode on for its scope, then restores the previous mode.
class SimTimingOnly {
 public:
  SimTimingOnly() : was_(sim_timing_only()) { set_sim_timing_only(true); }
  ~SimTimingOnly() { set_sim_timing_only(was_); }
  SimTimingOnly(const SimTimingOnly&) = delete;
  SimTimingOnly& operator=(const SimTimingOnly&) = delete;

 private:
  bool was_;
};

/// f32 matmul precision on the chip (sim and tpu devices), as torch.set_float32_matmul_precision:
/// "default" (also "medium": one bf16 pass, the TPU default of JAX and PyTorch/XLA), "high" (three
/// bf16 passes) or "highest" (six: f32-accurate products); each pass costs an MXU pass in cycles.
/// Process-wide; TPU_F32_MATMUL_PRECISION sets the starting value. Host matmuls are unaffected.
/// Details: codegen/precision.h.
void set_float32_matmul_precision(const std::string& precision);
/// The current f32 matmul precision ("default", "high" or "highest").
std::string float32_matmul_precision();

}  // namespace tpu
