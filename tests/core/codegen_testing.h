// Helpers of the codegen tests: sim:1 on the tiny chip for one test, and the counters that show
// an op ran as a chip program (codegen runs, simulated cycles) rather than on the host.
#pragma once

#include <string>

#include "codegen/launch.h"
#include "codegen/matmul_kernel.h"
#include "device/sim_driver.h"
#include "ops/fallback.h"
#include "testing.h"
#include "tpucore/devices.h"
#include "tpucore/streams.h"

namespace tpu::testing {

// sim:1 built on the tiny chip (VMEM 256 KiB, HBM 4 MiB, 2 MXUs of 8x8) for the test's duration.
// Every TinySim starts from a new device (empty program cache, empty HBM), so a test never sees
// programs or memory of an earlier one; a tensor an earlier test left on sim:1 (a global, a
// static) makes the constructor throw the tpu::Error of set_sim_chip naming the live
// allocations, instead of the test silently running on the old device.
struct TinySim {
  std::string prev;
  TinySim() : prev(device::sim_chip(1)) { set_sim_chip("tiny", 1); }
  ~TinySim() {
    try {
      if (prev != "tiny") set_sim_chip(prev, 1);
    } catch (...) {
    }
  }
  Device dev() const { return Device("sim:1"); }
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
