#include <array>
#include <atomic>
#include <mutex>
#include <vector>

#include "device/driver.h"
#include "tpucore/core/error.h"

namespace tpu::device {
namespace {

// Drivers are installed rarely and looked up on every allocation, so lookups read an atomic
// pointer; replaced drivers are kept alive (storages may still point at them).
struct Registry {
  std::mutex mu;
  std::array<std::atomic<Driver*>, kNumDeviceTypes> drivers{};
  std::vector<std::unique_ptr<Driver>> owned;
};
Registry& registry() {
  static Registry* r = new Registry();  // leaked: storages may be freed during static destruction
  return *r;
}

}  // namespace

std::unique_ptr<Driver> make_cpu_driver();

uint64_t Driver::next_instance_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

void register_driver(std::unique_ptr<Driver> d) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  Driver* p = d.get();
  r.owned.push_back(std::move(d));
  r.drivers[static_cast<int>(p->type())].store(p, std::memory_order_release);
}

bool has_driver(DeviceType t) {
  if (t == DeviceType::cpu) return true;
  return registry().drivers[static_cast<int>(t)].load(std::memory_order_acquire) != nullptr;
}

Driver& driver_for(DeviceType t) {
  Registry& r = registry();
  Driver* p = r.drivers[static_cast<int>(t)].load(std::memory_order_acquire);
  if (p) [[likely]] return *p;
  if (t == DeviceType::cpu) {
    std::lock_guard<std::mutex> lk(r.mu);
    p = r.drivers[0].load(std::memory_order_acquire);
    if (!p) {
      r.owned.push_back(make_cpu_driver());
      p = r.owned.back().get();
      r.drivers[0].store(p, std::memory_order_release);
    }
    return *p;
  }
  if (t == DeviceType::tpu)
    fail("device 'tpu': no driver is loaded. A chip is driven by an out-of-tree driver plugin: point "
         "TPU_DRIVER_PATH at one (e.g. libtpusim_plugin.so, the simulator built as a plugin) or call "
         "tpu::load_driver_plugin(path); or use 'sim' for the simulated chip");
  if (t == DeviceType::pjrt)
    fail("device 'pjrt': no PJRT plugin is loaded. Point TPU_PJRT_PLUGIN at a PJRT plugin (libtpu.so on a TPU VM, "
         "or libpjrt_tpucore_sim.so, the simulator as a PJRT plugin) or call tpu::load_pjrt_plugin(path)");
  fail("device '{}': no driver is available in this build", device_type_name(t));
}

Driver& driver_for(const Device& d) {
  Driver& drv = driver_for(d.type);
  if (d.type == DeviceType::cpu) [[likely]] return drv;
  int n = drv.device_count();
  TPU_CHECK(d.index >= 0 && d.index < n, "device '{}': index out of range ({} {} device(s) available)", d.str(), n,
            device_type_name(d.type));
  return drv;
}

}  // namespace tpu::device

namespace tpu {

StoragePtr allocate_storage(Device device, size_t nbytes) {
  return device::driver_for(device).allocate(device.index, nbytes);
}

}  // namespace tpu
