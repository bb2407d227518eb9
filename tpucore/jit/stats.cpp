// tpu::jit::stats(): counters of every compiled function in the process.
#include "tpucore/jit/internal.h"

namespace tpu::jit {
namespace detail {
namespace {
struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<StatsRecord>> all;
};
Registry& registry() {
  static auto* r = new Registry();
  return *r;
}
}  // namespace

std::shared_ptr<StatsRecord> register_stats(const std::string& name) {
  auto rec = std::make_shared<StatsRecord>();
  rec->s.name = name;
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.all.push_back(rec);
  return rec;
}
}  // namespace detail

const FunctionStats* Stats::find(std::string_view name) const& {
  for (auto it = functions.rbegin(); it != functions.rend(); ++it)
    if (it->name == name) return &*it;
  return nullptr;
}

Stats stats() {
  auto& r = detail::registry();
  std::lock_guard<std::mutex> lk(r.mu);
  Stats s;
  for (auto& rec : r.all) {
    std::lock_guard<std::mutex> lk2(rec->mu);
    FunctionStats f = rec->s;
    f.hits = rec->hits.load(std::memory_order_relaxed);
    s.functions.push_back(std::move(f));
  }
  return s;
}

void reset_stats() {
  auto& r = detail::registry();
  std::lock_guard<std::mutex> lk(r.mu);
  for (auto& rec : r.all) {
    std::lock_guard<std::mutex> lk2(rec->mu);
    const std::string name = rec->s.name;
    rec->s = FunctionStats{};
    rec->s.name = name;
    rec->hits.store(0);
  }
}

}  // namespace tpu::jit
