#include "tpucore/devices.h"

#include "codegen/launch.h"
#include "device/plugin_loader.h"
#include "device/sim_driver.h"

namespace tpu {

int device_count(DeviceType type) {
  if (!device::driver_present(type)) return 0;
  return device::driver_for(type).device_count();
}

DeviceProperties device_properties(Device d) { return device::driver_for(d).properties(d.index); }

size_t memory_free(Device d) { return device::driver_for(d).memory_free(d.index); }

void set_sim_chip(const std::string& chip, int index) { device::set_sim_chip(chip, index); }

std::string load_driver_plugin(const std::string& path, DeviceType type) {
  return device::load_driver_plugin(path, type);
}

SimStats sim_stats() {
  const codegen::CodegenStats c = codegen::stats();
  SimStats s;
  s.programs_built = c.programs_built;
  s.cache_hits = c.cache_hits;
  s.programs_evicted = c.programs_evicted;
  s.runs = c.runs;
  s.host_fallbacks = c.host_fallbacks;
  s.cycles = c.cycles;
  s.hbm_bytes = c.hbm_bytes;
  s.mxu_flops = c.mxu_flops;
  s.runs_by_kernel = c.runs_by_kernel;
  s.cycles_by_kernel = c.cycles_by_kernel;
  return s;
}

void reset_sim_stats() { codegen::reset_stats(); }

void set_sim_timing_only(bool on) { codegen::set_timing_only(on); }
bool sim_timing_only() { return codegen::timing_only(); }

}  // namespace tpu
