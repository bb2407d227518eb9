// The in-tree `sim` driver: devices sim:0 .. sim:N-1, each a simulated chip (SimDevice) with
// tensors in its HBM (Storage::data holds the HBM byte address cast to void*; the host never
// dereferences it). Registered automatically when libtpucore loads.
//
// Environment: TPU_SIM_DEVICES (how many, default 2), TPU_SIM_CHIP (preset name, JSON file path
// or JSON text; default "v5e"). Both are read when a sim device is first used.
#pragma once

#include <memory>
#include <string>

#include "device/driver.h"
#include "device/sim_device.h"

namespace tpu::device {

inline constexpr const char* kDefaultSimChip = "v5e";
inline constexpr int kDefaultSimDevices = 2;

// Chooses the chip of sim:index (every sim device when index < 0). Validated at once (a bad
// name is a tpu::Error listing the presets). A device already in use is rebuilt with the new
// chip; that is an error while tensors still live on it (its streams and events are dropped).
void set_sim_chip(const std::string& chip, int index = -1);
// The chip spec sim:index uses (or will use).
std::string sim_chip(int index);
int sim_device_count();

// The SimDevice behind sim:index (created on first use); a tpu::Error for a bad index. For
// codegen and tests: native programs (sim::Program) and full run results with traces.
SimDevice& sim_device(int index);

std::unique_ptr<Driver> make_sim_driver();

}  // namespace tpu::device
