// Helpers of the codegen tests: sim:1 on the tiny chip for one test, and the counters that show
// an op ran as a chip program (codegen runs, simulated cycles) rather than on the host.
#pragma once

#include <string>
#include <utility>

#include "codegen/launch.h"
#include "codegen/matmul_kernel.h"
#include "device/sim_driver.h"
#include "ops/fallback.h"
#include "testing.h"
#include "tpucore/devices.h"
#include "tpucore/streams.h"

namespace tpu::testing {

// sim:1 built on a chip preset for the test's duration (or the scope's), the previous preset
// restored after. Every one starts from a new device (empty program cache, empty HBM), so a test
// never sees programs or memory of an earlier one; a tensor an earlier test left on sim:1 (a
// global, a static) makes the constructor throw the tpu::Error of set_sim_chip naming the live
// allocations, instead of the test silently running on the old device.
struct SimChip1 {
  std::string prev, preset;
  explicit SimChip1(std::string p) : prev(device::sim_chip(1)), preset(std::move(p)) { set_sim_chip(preset, 1); }
  ~SimChip1() {
    try {
      if (prev != preset) set_sim_chip(prev, 1);
    } catch (...) {
    }
  }
  SimChip1(const SimChip1&) = delete;
  SimChip1& operator=(const SimChip1&) = delete;
  Device dev() const { return Device("sim:1"); }
};

// sim:1 on the tiny chip (VMEM 256 KiB, HBM 4 MiB, 2 MXUs of 8x8).
struct TinySim : SimChip1 {
  TinySim() : SimChip1("tiny") {}
};

// Restores the f32 matmul precision (set_float32_matmul_precision) when the test ends.
struct KeepPrecision {
  std::string prev = float32_matmul_precision();
  ~KeepPrecision() { set_float32_matmul_precision(prev); }
};

// Snapshot of the counters; `ran_on_chip` after the code under test.
struct ChipRunProbe {
  uint64_t runs, fallbacks, host_fallbacks;
  double cycles;
  ChipRunProbe() {
    sync_all();
    const codegen::CodegenStats s = codegen::stats();
    runs = s.runs;
    cycles = s.cycles;
    host_fallbacks = s.host_fallbacks;
    fallbacks = ops::total_fallbacks();
  }
  uint64_t new_runs() const { return codegen::stats().runs - runs; }
  uint64_t new_fallbacks() const { return ops::total_fallbacks() - fallbacks; }
  static void sync_all() {
    for (int i = 0; i < device::sim_device_count(); ++i) synchronize(Device(DeviceType::sim, i));
  }
  double new_cycles() const {
    sync_all();
    return codegen::stats().cycles - cycles;
  }
};

}  // namespace tpu::testing
