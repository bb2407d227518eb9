#include "codegen/launch.h"

#include <atomic>
#include <cstdlib>
#include <list>
#include <optional>

#include <spdlog/spdlog.h>
#include <mutex>
#include <unordered_map>

#include "device/profiling.h"
#include "device/sim_device.h"
#include "device/plugin_loader.h"
#include "device/sim_driver.h"
#include "sim/serialize.h"
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
  // Per target (see Target::cache_key: a sim device rebuilt with another chip starts empty).
  std::map<std::pair<uint64_t, uint64_t>, DeviceCache> cache;
  // The serial of the sim device last seen at each index: a device rebuilt at that index drops
  // the old one's programs (their device is gone, so they are not unloaded).
  std::map<int, uint64_t> sim_serials;
  // Runs through a driver whose stats are not in yet.
  std::vector<std::pair<std::string, std::shared_ptr<device::ProgramStats>>> pending;
  // Chips of the tpu devices, by (driver instance, device index); never dropped.
  std::map<std::pair<uint64_t, int>, std::unique_ptr<sim::ChipConfig>> plugin_chips;
};
State& state() {
  static State* s = new State();
  return *s;
}
std::atomic<bool> g_timing_only{false};

void add_run_stats_locked(State& s, const std::string& kernel, double cycles, uint64_t hbm, double flops) {
  s.stats.cycles += cycles;
  s.stats.cycles_by_kernel[kernel] += cycles;
  s.stats.hbm_bytes += hbm;
  s.stats.mxu_flops += flops;
}

// Where a device's programs go: a SimDevice directly, or a driver (a tpu plugin).
struct Target {
  device::SimDevice* sim = nullptr;
  device::Driver* driver = nullptr;
  const sim::ChipConfig* chip = nullptr;
  std::pair<uint64_t, uint64_t> cache_key;
  int index = 0;
  uint64_t load(sim::Program p) const {
    if (sim) return sim->load_program(std::move(p));
    return driver->load_program(index, sim::program_to_json_text(p));
  }
  void unload(uint64_t id) const {
    if (sim) sim->unload_program(id);
    else driver->unload_program(index, id);
  }
};

// The chip of a driver's device, parsed once from its program_target.
const sim::ChipConfig* plugin_chip(device::Driver& drv, int index) {
  State& s = state();
  const auto key = std::make_pair(drv.instance_id(), index);
  {
    std::lock_guard<std::mutex> lk(s.mu);
    auto it = s.plugin_chips.find(key);
    if (it != s.plugin_chips.end()) return it->second.get();
  }
  const std::string text = drv.program_target(index);
  std::unique_ptr<sim::ChipConfig> c;
  if (!text.empty()) {
    try {
      c = std::make_unique<sim::ChipConfig>(sim::config_from_json_text(text));
    } catch (const std::exception& e) {
      fail("{}: the driver's chip description (program_target) is not a valid chip config: {}",
           Device(drv.type(), index).str(), e.what());
    }
  }
  std::lock_guard<std::mutex> lk(s.mu);
  auto& slot = s.plugin_chips[key];
  if (!slot && c) slot = std::move(c);
  return slot.get();  // null: the device runs no generated programs
}

std::optional<Target> try_target(const Device& d) {
  Target t;
  t.index = d.index;
  if (d.type == DeviceType::sim) {
    t.sim = &device::sim_device(d.index);
    t.chip = &t.sim->config();
    t.cache_key = {0, t.sim->serial()};
    return t;
  }
  if (d.type != DeviceType::tpu || !device::has_driver(d.type)) return std::nullopt;
  device::Driver& drv = device::driver_for(d);
  if (!drv.runs_programs()) return std::nullopt;
  t.driver = &drv;
  t.chip = plugin_chip(drv, d.index);
  if (!t.chip) return std::nullopt;
  t.cache_key = {drv.instance_id(), uint64_t(d.index)};
  return t;
}

Target target_of(const Device& d) {
  auto t = try_target(d);
  TPU_CHECK(t.has_value(), "codegen: device {} does not run generated programs", d.str());
  return *t;
}

}  // namespace

bool runs_generated_programs(const Device& d) {
  if (d.type == DeviceType::sim) return true;
  if (d.type != DeviceType::tpu || !device::driver_present(d.type)) return false;
  return try_target(d).has_value();
}

const sim::ChipConfig& chip_config(const Device& d) { return *target_of(d).chip; }

CodegenStats stats() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  for (size_t i = 0; i < s.pending.size();) {
    const auto& [kernel, st] = s.pending[i];
    if (!st->done) {
      ++i;
      continue;
    }
    add_run_stats_locked(s, kernel, st->cycles, st->hbm_bytes_read + st->hbm_bytes_written, st->mxu_flops);
    s.pending[i] = std::move(s.pending.back());
    s.pending.pop_back();
  }
  return s.stats;
}

void reset_stats() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.stats = {};
  s.pending.clear();
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

// The program cache of target t (s.mu held); a sim device that replaced another at its index
// first drops the cache of the one it replaced.
DeviceCache& device_cache_locked(State& s, const Target& t) {
  if (t.sim) {
    auto [it, fresh] = s.sim_serials.try_emplace(t.index, t.cache_key.second);
    if (!fresh && it->second != t.cache_key.second) {
      s.cache.erase({0, it->second});
      it->second = t.cache_key.second;
    }
  }
  return s.cache[t.cache_key];
}

LoadedProgram cached_program(const Device& d, const std::string& key, const std::function<sim::Program()>& build) {
  Target t = target_of(d);
  State& s = state();
  {
    std::lock_guard<std::mutex> lk(s.mu);
    DeviceCache& c = device_cache_locked(s, t);
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
  lp.id = t.load(std::move(p));
  tpu::log().debug("codegen: built program '{}' for {} (key {})", lp.name, d.str(), key);
  std::vector<uint64_t> evicted;
  LoadedProgram result;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    ++s.stats.programs_built;
    DeviceCache& c = device_cache_locked(s, t);
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
  for (uint64_t id : evicted) t.unload(id);
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

size_t cached_programs_all_devices() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  size_t n = 0;
  for (const auto& [key, c] : s.cache) n += c.lru.size();
  return n;
}

size_t cached_programs(const Device& d) {
  const Target t = target_of(d);
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  auto it = s.cache.find(t.cache_key);
  return it == s.cache.end() ? 0 : it->second.lru.size();
}

void launch(const Device& d, const LoadedProgram& p, const std::string& kernel, std::vector<int64_t> args) {
  const Target t = target_of(d);
  {
    State& s = state();
    std::lock_guard<std::mutex> lk(s.mu);
    ++s.stats.runs;
    ++s.stats.runs_by_kernel[kernel];
  }
  const device::StreamId stream = device::current_stream(d);
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
  if (t.sim) {
    device::SimProgramOptions o;
    o.timing_only = timing_only();
    o.registers = std::move(args);
    t.sim->run_program(stream, p.id, o, [kernel](const sim::RunResult& r) {
      State& s = state();
      std::lock_guard<std::mutex> lk(s.mu);
      add_run_stats_locked(s, kernel, r.stats.cycles, r.stats.hbm_bytes_read + r.stats.hbm_bytes_written, r.stats.mxu_flops);
      if (s.stats.works.size() < CodegenStats::kMaxWorks) s.stats.works.push_back(r.stats.work);
    });
    return;
  }
  // Through the driver: the stats are filled when the run finished and the driver noticed
  // (synchronization, a blocking read); stats() adds the finished ones.
  auto st = std::make_shared<device::ProgramStats>();
  {
    State& s = state();
    std::lock_guard<std::mutex> lk(s.mu);
    s.pending.emplace_back(kernel, st);
  }
  device::ProgramOptions o;
  o.timing_only = timing_only();
  o.args = std::move(args);
  t.driver->enqueue_program(d.index, stream, p.id, o, std::move(st));
}

}  // namespace tpu::codegen
