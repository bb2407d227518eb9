#include "codegen/launch.h"

#include <atomic>
#include <cstdlib>
#include <list>

#include <spdlog/spdlog.h>
#include <mutex>
#include <unordered_map>

#include "device/profiling.h"
#include "device/sim_device.h"
#include "device/sim_driver.h"
#include "device/stream.h"
#include "tpucore/core/error.h"
#include "tpucore/core/env.h"
#include "tpucore/core/log.h"

namespace tpu::codegen {
namespace {

// One device's programs, least recently used last.
struct DeviceCache {
  std::list<std::pair<std::string, LoadedProgram>> lru;
  std::unordered_map<std::string, std::list<std::pair<std::string, LoadedProgram>>::iterator> index;
};

size_t capacity_from_env() {
  const auto v = env_int("TPU_SIM_PROGRAM_CACHE", 1, int64_t{1} << 30, "keeping 4096 programs per device");
  return v ? static_cast<size_t>(*v) : 4096;
}

struct State {
  std::mutex mu;
  CodegenStats stats;
  size_t capacity = capacity_from_env();
  // Per SimDevice (by serial: a device rebuilt with another chip starts empty).
  std::map<uint64_t, DeviceCache> cache;
};
State& state() {
  static State* s = new State();
  return *s;
}
std::atomic<bool> g_timing_only{false};

}  // namespace

CodegenStats stats() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.stats;
}

void reset_stats() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.stats = {};
}

void set_timing_only(bool on) { g_timing_only.store(on); }
bool timing_only() { return g_timing_only.load(); }

int64_t hbm_address(const Tensor& t) {
  const TensorImpl& im = t.impl();
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(im.storage->data)) +
         im.offset * static_cast<int64_t>(dtype_size(im.dtype));
}

device::SimDevice& sim_device_of(const Tensor& t) { return device::sim_device(t.device().index); }

void count_host_fallback() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  ++s.stats.host_fallbacks;
}

LoadedProgram cached_program(int device_index, const std::string& key, const std::function<sim::Program()>& build) {
  device::SimDevice& dev = device::sim_device(device_index);
  State& s = state();
  {
    std::lock_guard<std::mutex> lk(s.mu);
    DeviceCache& c = s.cache[dev.serial()];
    auto it = c.index.find(key);
    if (it != c.index.end()) {
      ++s.stats.cache_hits;
      c.lru.splice(c.lru.begin(), c.lru, it->second);  // most recently used first
      return it->second->second;
    }
  }
  sim::Program p = build();
  LoadedProgram lp;
  lp.name = p.name;
  lp.id = dev.load_program(std::move(p));
  tpu::log().debug("codegen: built program '{}' for {} (key {})", lp.name, dev.name(), key);
  std::vector<uint64_t> evicted;
  LoadedProgram result;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    ++s.stats.programs_built;
    DeviceCache& c = s.cache[dev.serial()];
    auto it = c.index.find(key);
    if (it != c.index.end()) {  // another thread built it meanwhile: keep theirs
      evicted.push_back(lp.id);
      c.lru.splice(c.lru.begin(), c.lru, it->second);
      result = it->second->second;
    } else {
      c.lru.emplace_front(key, lp);
      c.index[key] = c.lru.begin();
      result = lp;
    }
    while (c.lru.size() > s.capacity) {
      evicted.push_back(c.lru.back().second.id);
      c.index.erase(c.lru.back().first);
      c.lru.pop_back();
      ++s.stats.programs_evicted;
    }
  }
  for (uint64_t id : evicted) dev.unload_program(id);
  return result;
}

size_t program_cache_capacity() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.capacity;
}

void set_program_cache_capacity(size_t programs) {
  TPU_CHECK(programs >= 1, "codegen: the program cache must keep at least 1 program per device, got {}", programs);
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.capacity = programs;
}

size_t cached_programs(int device_index) {
  device::SimDevice& dev = device::sim_device(device_index);
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  auto it = s.cache.find(dev.serial());
  return it == s.cache.end() ? 0 : it->second.lru.size();
}

void launch(int device_index, const LoadedProgram& p, const std::string& kernel, std::vector<int64_t> args) {
  device::SimDevice& dev = device::sim_device(device_index);
  device::SimProgramOptions o;
  o.timing_only = timing_only();
  o.registers = std::move(args);
  {
    State& s = state();
    std::lock_guard<std::mutex> lk(s.mu);
    ++s.stats.runs;
    ++s.stats.runs_by_kernel[kernel];
  }
  const device::StreamId stream = device::current_stream(Device(DeviceType::sim, device_index));
  // A profiler names a run after the host op that enqueued it; a compiled function's regions run
  // outside any op, so they are named after their kernel ("region:mlp") instead.
  const char* op_tag = device::work_tag();
  const bool own_tag = *op_tag == '\0';
  if (own_tag) device::set_work_tag(kernel.c_str());
  struct RestoreTag {
    bool on;
    ~RestoreTag() {
      if (on) device::set_work_tag(nullptr);
    }
  } restore{own_tag};
  dev.run_program(stream, p.id, o, [kernel](const sim::RunResult& r) {
    State& s = state();
    std::lock_guard<std::mutex> lk(s.mu);
    s.stats.cycles += r.stats.cycles;
    s.stats.cycles_by_kernel[kernel] += r.stats.cycles;
    s.stats.hbm_bytes += r.stats.hbm_bytes_read + r.stats.hbm_bytes_written;
    s.stats.mxu_flops += r.stats.mxu_flops;
  });
}

}  // namespace tpu::codegen
