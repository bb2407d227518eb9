#include "device/stream.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace tpu::device {
namespace {

thread_local std::vector<StreamId> t_current[kNumDeviceTypes];

bool env_sync() {
  const char* v = std::getenv("TPU_SYNC");
  return v && *v && std::strcmp(v, "0") != 0 && std::strcmp(v, "false") != 0 && std::strcmp(v, "off") != 0;
}
std::atomic<bool>& sync_flag() {
  static std::atomic<bool> f{env_sync()};
  return f;
}

}  // namespace

StreamId current_stream(const Device& d) {
  const auto& v = t_current[static_cast<int>(d.type)];
  const size_t i = static_cast<size_t>(d.index);
  return i < v.size() ? v[i] : kDefaultStream;
}

void set_current_stream(const Device& d, StreamId s) {
  auto& v = t_current[static_cast<int>(d.type)];
  const size_t i = static_cast<size_t>(d.index);
  if (i >= v.size()) v.resize(i + 1, kDefaultStream);
  v[i] = s;
}

bool sync_mode() { return sync_flag().load(std::memory_order_relaxed); }
void set_sync_mode(bool on) { sync_flag().store(on, std::memory_order_relaxed); }

}  // namespace tpu::device
