#include "tpucore/devices.h"

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

}  // namespace tpu
