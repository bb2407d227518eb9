// Default stream/event/program methods of Driver, for drivers that run everything
// synchronously on the host (cpu): streams are plain ids and events carry host time.
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <unordered_map>

#include "device/driver.h"
#include "tpucore/core/error.h"

namespace tpu::device {
namespace {

std::atomic<uint64_t> g_next_id{1};

struct HostEvents {
  std::mutex mu;
  std::unordered_map<EventHandle, double> time;  // NaN until recorded
};
HostEvents& host_events() {
  static HostEvents* h = new HostEvents();  // leaked: events may die during static destruction
  return *h;
}

double host_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

StreamId Driver::create_stream(int) { return g_next_id.fetch_add(1); }

EventHandle Driver::create_event(int) {
  EventHandle e = g_next_id.fetch_add(1);
  HostEvents& h = host_events();
  std::lock_guard<std::mutex> lk(h.mu);
  h.time[e] = NAN;
  return e;
}

void Driver::destroy_event(int, EventHandle e) {
  HostEvents& h = host_events();
  std::lock_guard<std::mutex> lk(h.mu);
  h.time.erase(e);
}

void Driver::record_event(int, StreamId, EventHandle e) {
  const double t = host_seconds();
  HostEvents& h = host_events();
  std::lock_guard<std::mutex> lk(h.mu);
  h.time[e] = t;
}

double Driver::event_time(int, EventHandle e) {
  HostEvents& h = host_events();
  std::lock_guard<std::mutex> lk(h.mu);
  auto it = h.time.find(e);
  return it == h.time.end() ? NAN : it->second;
}

ProgramHandle Driver::load_program(int index, std::string_view) {
  fail("device '{}:{}': this driver does not run chip programs (use a 'sim' device or a driver plugin)", name(), index);
}

void Driver::enqueue_program(int index, StreamId, ProgramHandle, const ProgramOptions&, std::shared_ptr<ProgramStats>) {
  fail("device '{}:{}': this driver does not run chip programs (use a 'sim' device or a driver plugin)", name(), index);
}

}  // namespace tpu::device
