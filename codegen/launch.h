// Running generated programs on chip devices: a cache of programs per key (op, shapes, dtypes,
// attrs), loaded once per device, run on the calling thread's current stream of the device with
// the operands' HBM addresses passed in scalar registers r0.. (so one program serves any
// buffers); and the codegen counters (programs built, cache hits, runs, simulated cycles).
//
// Chip devices: `sim:N` (the in-tree SimDevice, directly) and `tpu:N` when its driver plugin
// describes its chip (Driver::program_target, ABI version 2): programs then go through the
// driver as JSON text and run with their arguments through the ABI; their stats come back when
// the device is synchronized.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sim/config.h"
#include "sim/program.h"
#include "sim/stats.h"
#include "tpucore/core/tensor.h"

namespace tpu::device {
class SimDevice;
}

namespace tpu::codegen {

struct CodegenStats {
  uint64_t programs_built = 0;  // cache misses: programs generated and loaded
  uint64_t cache_hits = 0;
  uint64_t programs_evicted = 0;  // least recently used programs dropped to stay within the capacity
  uint64_t runs = 0;            // programs run (eager kernels and compiled regions)
  uint64_t host_fallbacks = 0;  // calls a lowering declined (shape, dtype, layout) and sent to the host
  double cycles = 0;            // simulated cycles of the finished runs
  uint64_t hbm_bytes = 0;       // HBM bytes read + written by the finished runs
  double mxu_flops = 0;
  std::map<std::string, uint64_t> runs_by_kernel;  // kernel name ("add", "matmul", "region:...")
  std::map<std::string, double> cycles_by_kernel;  // simulated cycles of the finished runs, per kernel name
  // The counted work of the finished sim:N runs in finishing order (sim::Stats::work; the first
  // kMaxWorks since the last reset), so a tool can re-price them under other timing constants.
  std::vector<sim::CountedWork> works;
  static constexpr size_t kMaxWorks = 4096;
};
CodegenStats stats();  // call after synchronizing for complete cycle counts
void reset_stats();

// Timing-only: generated programs skip the arithmetic (same cycles), so model-sized work costs
// seconds; results are then garbage. Off by default.
void set_timing_only(bool on);
bool timing_only();

// The HBM byte address of a tensor's first element (chip tensors only).
int64_t hbm_address(const Tensor& t);
device::SimDevice& sim_device_of(const Tensor& t);

// True when `d` runs generated programs (sim, or a tpu plugin that describes its chip).
bool runs_generated_programs(const Device& d);
// The chip `d`'s programs are generated for (a tpu::Error when it runs none).
const sim::ChipConfig& chip_config(const Device& d);

struct LoadedProgram {
  uint64_t id = 0;
  std::string name;
  int num_args = 0;
};

// The program for `key` on sim:index, built by `build` (and loaded) on the first request. Each
// device keeps at most program_cache_capacity() programs: past it, the least recently used one
// is unloaded (runs already queued keep it alive until they finish).
LoadedProgram cached_program(const Device& d, const std::string& key, const std::function<sim::Program()>& build);
inline LoadedProgram cached_program(int sim_index, const std::string& key, const std::function<sim::Program()>& build) {
  return cached_program(Device(DeviceType::sim, sim_index), key, build);
}

// Programs kept per device (default 4096, or TPU_SIM_PROGRAM_CACHE; at least 1). Lowering the
// capacity evicts at the next build.
size_t program_cache_capacity();
void set_program_cache_capacity(size_t programs);
// Programs currently cached for a device (an int: sim:index).
size_t cached_programs(const Device& d);
// Programs cached over every device; a sim device rebuilt at an index no longer counts the
// programs of the one it replaced.
size_t cached_programs_all_devices();
inline size_t cached_programs(int sim_index) { return cached_programs(Device(DeviceType::sim, sim_index)); }

// Runs a loaded program on the current stream of sim:index with `args` in r0.. . A profiler sees
// the run under the enqueuing op's name, or under `kernel` when no op is active (compiled regions).
void launch(const Device& d, const LoadedProgram& p, const std::string& kernel, std::vector<int64_t> args);
inline void launch(int sim_index, const LoadedProgram& p, const std::string& kernel, std::vector<int64_t> args) {
  launch(Device(DeviceType::sim, sim_index), p, kernel, std::move(args));
}

void count_host_fallback();

}  // namespace tpu::codegen
