// Buffer planning by liveness. Every materialized intermediate (a standalone node's output or
// a region output that is not a graph output and not aliased by one) gets a slot; a slot is
// reused once all readers of its value (including readers of views of it) have run. Slots
// are picked best-fit, growing the largest free slot when none fits. The plan reports the
// planned peak bytes next to what one buffer per value would take.
#include <algorithm>

#include "graph/async_ops.h"
#include "graph/passes/passes.h"
#include "graph/schedule.h"

namespace tpu::graph {
namespace {
constexpr int64_t kAlign = 64;
int64_t bytes_of(const ValueMeta& m) {
  int64_t b = m.shape.numel() * static_cast<int64_t>(dtype_size(m.dtype));
  return (b + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

int plan_buffers(Graph& g) {
  BufferPlan plan;
  plan.slot_of.assign(g.values.size(), -1);
  const std::vector<Step> steps = schedule(g);
  const size_t nv = g.values.size();
  std::vector<int32_t> def(nv, -1), last(nv, -1);
  std::vector<char> candidate(nv, 0), pinned(nv, 0);
  for (ValueId o : g.outputs) pinned[static_cast<size_t>(alias_root(g, o))] = 1;
  // Buffers an asynchronous node (a collective) reads or writes in the background are its own.
  for (const Node& n : g.nodes)
    if (is_async(n)) {
      for (ValueId v : n.inputs) pinned[static_cast<size_t>(alias_root(g, v))] = 1;
      for (ValueId v : n.outputs) pinned[static_cast<size_t>(v)] = 1;
    }
  auto touch = [&](ValueId v, int32_t s) {
    ValueId r = alias_root(g, v);
    last[static_cast<size_t>(r)] = std::max(last[static_cast<size_t>(r)], s);
  };
  for (size_t s = 0; s < steps.size(); ++s) {
    const Step& st = steps[s];
    auto visit = [&](const Node& n, bool materialized) {
      for (ValueId in : n.inputs) touch(in, static_cast<int32_t>(s));
      for (ValueId o : n.outputs) {
        touch(o, static_cast<int32_t>(s));
        if (materialized && !n.op->has(ops::kView) && g.meta(o).device.is_cpu()) {
          candidate[static_cast<size_t>(o)] = 1;
          def[static_cast<size_t>(o)] = static_cast<int32_t>(s);
        }
      }
    };
    if (st.region >= 0) {
      const Region& R = g.regions[static_cast<size_t>(st.region)];
      for (int32_t ni : R.nodes) {
        const Node& n = g.nodes[static_cast<size_t>(ni)];
        visit(n, false);
        for (ValueId o : n.outputs)
          if (std::find(R.outputs.begin(), R.outputs.end(), o) != R.outputs.end()) {
            candidate[static_cast<size_t>(o)] = 1;
            def[static_cast<size_t>(o)] = static_cast<int32_t>(s);
          }
      }
    } else {
      visit(g.nodes[static_cast<size_t>(st.node)], true);
    }
  }
  std::vector<std::vector<ValueId>> defs_at(steps.size()), frees_at(steps.size());
  for (size_t v = 0; v < nv; ++v) {
    if (!candidate[v] || pinned[v]) continue;
    plan.unplanned_bytes += bytes_of(g.values[v].meta);
    defs_at[static_cast<size_t>(def[v])].push_back(static_cast<ValueId>(v));
    frees_at[static_cast<size_t>(std::max(last[v], def[v]))].push_back(static_cast<ValueId>(v));
  }
  std::vector<int32_t> free_slots;
  for (size_t s = 0; s < steps.size(); ++s) {
    for (ValueId v : defs_at[s]) {
      const int64_t need = bytes_of(g.meta(v));
      int best = -1;
      for (size_t k = 0; k < free_slots.size(); ++k) {
        const int64_t sz = plan.slot_bytes[static_cast<size_t>(free_slots[k])];
        if (sz >= need && (best < 0 || sz < plan.slot_bytes[static_cast<size_t>(free_slots[static_cast<size_t>(best)])]))
          best = static_cast<int>(k);
      }
      if (best < 0 && !free_slots.empty()) {  // grow the largest free slot
        best = 0;
        for (size_t k = 1; k < free_slots.size(); ++k)
          if (plan.slot_bytes[static_cast<size_t>(free_slots[k])] >
              plan.slot_bytes[static_cast<size_t>(free_slots[static_cast<size_t>(best)])])
            best = static_cast<int>(k);
        auto& sz = plan.slot_bytes[static_cast<size_t>(free_slots[static_cast<size_t>(best)])];
        sz = std::max(sz, need);
      }
      int32_t slot;
      if (best >= 0) {
        slot = free_slots[static_cast<size_t>(best)];
        free_slots.erase(free_slots.begin() + best);
      } else {
        slot = static_cast<int32_t>(plan.slot_bytes.size());
        plan.slot_bytes.push_back(need);
      }
      plan.slot_of[static_cast<size_t>(v)] = slot;
    }
    for (ValueId v : frees_at[s]) free_slots.push_back(plan.slot_of[static_cast<size_t>(v)]);
  }
  for (int64_t b : plan.slot_bytes) plan.planned_peak_bytes += b;
  plan.valid = true;
  g.plan = std::move(plan);
  return static_cast<int>(g.plan.slot_bytes.size());
}

}  // namespace tpu::graph
