#include <array>
#include <mutex>

#include "device/driver.h"
#include "tpucore/error.h"

namespace tpu::device {
namespace {

struct Registry {
  std::mutex mu;
  std::array<std::unique_ptr<Driver>, kNumDeviceTypes> drivers;
};
Registry& registry() {
  static Registry* r = new Registry();  // leaked: storages may be freed during static destruction
  return *r;
}

}  // namespace

std::unique_ptr<Driver> make_cpu_driver();

void register_driver(std::unique_ptr<Driver> d) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.drivers[static_cast<int>(d->type())] = std::move(d);
}

bool has_driver(DeviceType t) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (t == DeviceType::cpu) return true;
  return r.drivers[static_cast<int>(t)] != nullptr;
}

Driver& driver_for(DeviceType t) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto& slot = r.drivers[static_cast<int>(t)];
  if (!slot && t == DeviceType::cpu) slot = make_cpu_driver();
  if (!slot) {
    if (t == DeviceType::tpu)
      fail("device 'tpu': no driver is loaded. A real chip needs an out-of-tree driver plugin: build one "
           "against device/plugin_abi.h and point TPU_DRIVER_PATH at the shared library (or call "
           "tpu::load_driver_plugin(path)); use 'sim' for the simulated chip");
    fail("device '{}': no driver is available in this build", device_type_name(t));
  }
  return *slot;
}

Driver& driver_for(const Device& d) {
  Driver& drv = driver_for(d.type);
  int n = drv.device_count();
  TPU_CHECK(d.index >= 0 && d.index < n, "device '{}': index out of range ({} {} device(s) available)", d.str(), n,
            device_type_name(d.type));
  return drv;
}

}  // namespace tpu::device
