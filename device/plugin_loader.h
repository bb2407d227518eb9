// Out-of-tree drivers: loads a shared library implementing device/plugin_abi.h and wraps it as
// a Driver for one device type. At start-up, TPU_DRIVER_PATH (a plugin path) installs a driver
// for the `tpu` device type that loads the plugin on first use.
#pragma once

#include <memory>
#include <string>

#include "device/driver.h"

namespace tpu::device {

// Loads the plugin at `path` now. A bare file name is looked up by the dynamic loader and then
// next to libtpucore. A path that cannot be loaded, a library that is not a plugin, or one
// built for another ABI version is a tpu::Error saying which and why.
std::unique_ptr<Driver> load_plugin_driver(const std::string& path, DeviceType type);

// Loads and registers the plugin as the driver of `type` (replacing any previous one); returns
// the plugin's name.
std::string load_driver_plugin(const std::string& path, DeviceType type);

// Undoes load_driver_plugin for `type`: the type goes back to its TPU_DRIVER_PATH driver, or
// to "no driver" (every use is the missing-driver error). Tensors of the unloaded driver stay
// valid to free (the library is never closed). False when no explicit load was active. For
// tests that need each case to start from the same drivers.
bool unload_driver_plugin(DeviceType type);
// has_driver(type), except after unload_driver_plugin left "no driver".
bool driver_present(DeviceType type);

}  // namespace tpu::device
