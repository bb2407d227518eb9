// Devices and drivers: how many devices a type has, their properties and free memory, the
// simulated chip behind `sim` devices, and loading out-of-tree driver plugins.
//
//   tpu::set_sim_chip("tiny");                         // or TPU_SIM_CHIP=tiny
//   tpu::load_driver_plugin("libtpusim_plugin.so");    // `tpu:N` now runs on the plugin
//   tpu::Tensor x = tpu::ones({4, 4}, tpu::Device("tpu:0"));
#pragma once

#include <cstddef>
#include <string>

#include "device/driver.h"
#include "tpucore/device.h"

namespace tpu {

using DeviceProperties = device::DeviceProperties;

// Devices of a type; 0 when no driver is present for it.
int device_count(DeviceType type);
DeviceProperties device_properties(Device device);
// Free device memory in bytes (after memory released by finished work).
size_t memory_free(Device device);

// The chip of sim:index (every sim device when index < 0): a preset name (tiny, v4, v5e,
// v5p, v6e, v7), a JSON file path or JSON text. A bad name is a tpu::Error listing the
// presets; changing the chip of a device with live tensors is an error.
void set_sim_chip(const std::string& chip, int index = -1);

// Loads a driver plugin (a shared library implementing device/plugin_abi.h) as the driver of
// `type`; a bare file name is also looked up next to libtpucore. Returns the plugin's name.
// Errors (not loadable, not a plugin, wrong ABI version) are tpu::Errors saying which.
std::string load_driver_plugin(const std::string& path, DeviceType type = DeviceType::tpu);

}  // namespace tpu
