#include "tpucore/streams.h"

#include <cmath>
#include <mutex>

#include <fmt/format.h>

#include "device/driver.h"
#include "device/stream.h"
#include "tpucore/core/error.h"

namespace tpu {

Stream Stream::create(Device device) {
  device::Driver& drv = device::driver_for(device);
  return Stream(device, drv.create_stream(device.index));
}

Stream Stream::default_stream(Device device) {
  device::driver_for(device);
  return Stream(device, device::kDefaultStream);
}

void Stream::synchronize() const { device::driver_for(device_).synchronize_stream(device_.index, id_); }
bool Stream::query() const { return device::driver_for(device_).query_stream(device_.index, id_); }
std::string Stream::str() const {
  return id_ == 0 ? device_.str() + "/default stream" : fmt::format("{}/stream {}", device_.str(), id_);
}

Stream current_stream(Device device) {
  device::driver_for(device);
  return Stream(device, device::current_stream(device));
}

void set_current_stream(const Stream& s) { device::set_current_stream(s.device(), s.id()); }

StreamGuard::StreamGuard(const Stream& s) : prev_(current_stream(s.device())) { set_current_stream(s); }
StreamGuard::~StreamGuard() { device::set_current_stream(prev_.device(), prev_.id()); }

// An event: a driver handle on the device it was last recorded on.
struct Event::State {
  std::mutex mu;
  bool recorded = false;
  Device device;
  device::EventHandle handle = 0;

  ~State() {
    if (handle) {
      try {
        device::driver_for(device.type).destroy_event(device.index, handle);
      } catch (...) {
      }
    }
  }
};

Event::Event() : s_(std::make_shared<State>()) {}

void Event::record(const Stream& st) {
  device::Driver& drv = device::driver_for(st.device());
  std::lock_guard<std::mutex> lk(s_->mu);
  if (s_->handle && s_->device != st.device()) {
    device::driver_for(s_->device.type).destroy_event(s_->device.index, s_->handle);
    s_->handle = 0;
  }
  if (!s_->handle) {
    s_->handle = drv.create_event(st.device().index);
    s_->device = st.device();
  }
  drv.record_event(st.device().index, st.id(), s_->handle);
  s_->recorded = true;
}

void Event::wait(const Stream& st) const {
  Device ed;
  device::EventHandle h;
  {
    std::lock_guard<std::mutex> lk(s_->mu);
    if (!s_->recorded) return;
    ed = s_->device;
    h = s_->handle;
  }
  device::Driver& drv = device::driver_for(st.device());
  if (ed.type == st.device().type) {
    drv.wait_event(st.device().index, st.id(), ed.index, h);
  } else {
    // Another driver cannot wait on this one's event inside its queue: the host waits for it,
    // so everything queued on `st` after this call starts after the event.
    device::driver_for(ed.type).synchronize_event(ed.index, h);
  }
}

void Event::synchronize() const {
  std::lock_guard<std::mutex> lk(s_->mu);
  if (s_->recorded) device::driver_for(s_->device.type).synchronize_event(s_->device.index, s_->handle);
}

bool Event::query() const {
  std::lock_guard<std::mutex> lk(s_->mu);
  return !s_->recorded || device::driver_for(s_->device.type).query_event(s_->device.index, s_->handle);
}

bool Event::recorded() const {
  std::lock_guard<std::mutex> lk(s_->mu);
  return s_->recorded;
}

Device Event::device() const {
  std::lock_guard<std::mutex> lk(s_->mu);
  return s_->device;
}

double Event::time_seconds() const {
  std::lock_guard<std::mutex> lk(s_->mu);
  TPU_CHECK(s_->recorded, "Event::time_seconds: the event was never recorded");
  device::Driver& drv = device::driver_for(s_->device.type);
  drv.synchronize_event(s_->device.index, s_->handle);
  const double t = drv.event_time(s_->device.index, s_->handle);
  TPU_CHECK(!std::isnan(t), "Event::time_seconds: device {} reports no time for the event", s_->device.str());
  return t;
}

double Event::elapsed_ms(const Event& end) const {
  TPU_CHECK(recorded() && end.recorded(), "Event::elapsed_ms: both events must be recorded first (start {}, end {})",
            recorded() ? "recorded" : "not recorded", end.recorded() ? "recorded" : "not recorded");
  const Device a = device(), b = end.device();
  TPU_CHECK(a.type == b.type,
            "Event::elapsed_ms: events on {} and {} use different clocks (simulated vs host time); record both on "
            "the same kind of device",
            a.str(), b.str());
  return (end.time_seconds() - time_seconds()) * 1e3;
}

void synchronize(Device device) { device::driver_for(device).synchronize(device.index); }

void set_synchronous_mode(bool on) { device::set_sync_mode(on); }
bool synchronous_mode() { return device::sync_mode(); }

}  // namespace tpu
