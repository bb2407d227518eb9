// Common subexpression elimination: two nodes with the same op, inputs and attrs compute the
// same values, so later uses read the first one. Random ops differ on every call and are
// never merged. Identical small constants (same dtype, shape and bytes) are merged too.
#include <cstring>
#include <unordered_map>

#include "graph/async_ops.h"
#include "graph/passes/passes.h"

namespace tpu::graph {
namespace {

bool same_constant(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

}  // namespace

int cse(Graph& g) {
  int merged = 0;
  // Constants first, so nodes over equal constants become equal.
  std::unordered_map<uint64_t, std::vector<ValueId>> consts;
  const std::vector<int32_t> uses = g.use_counts();
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& val = g.values[v];
    if (val.kind != ValueKind::constant || uses[v] == 0 || val.constant.numel() > 4096) continue;
    Tensor c = val.constant.contiguous();
    uint64_t h = hash_combine(static_cast<uint64_t>(c.dtype()), static_cast<uint64_t>(c.numel()));
    const auto* b = static_cast<const unsigned char*>(c.raw_data());
    for (size_t i = 0; i < c.nbytes(); ++i) h = hash_combine(h, b[i]);
    h = hash_combine(h, val.meta.wrapped);
    bool done = false;
    for (ValueId o : consts[h]) {
      if (g.value(o).meta.wrapped == val.meta.wrapped && same_constant(g.value(o).constant, val.constant)) {
        g.replace_uses(static_cast<ValueId>(v), o);
        ++merged;
        done = true;
        break;
      }
    }
    if (!done) consts[h].push_back(static_cast<ValueId>(v));
  }
  std::unordered_map<uint64_t, std::vector<int32_t>> seen;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (n.dead || n.op->has(ops::kRandom) || is_async(n)) continue;
    uint64_t h = reinterpret_cast<uintptr_t>(n.op);
    for (ValueId in : n.inputs) h = hash_combine(h, static_cast<uint64_t>(in));
    h = hash_attrs(n.attrs, h);
    bool done = false;
    for (int32_t j : seen[h]) {
      const Node& m = g.nodes[static_cast<size_t>(j)];
      if (m.op != n.op || m.inputs != n.inputs || !attrs_equal(m.attrs, n.attrs)) continue;
      for (size_t k = 0; k < n.outputs.size(); ++k) g.replace_uses(n.outputs[k], m.outputs[k]);
      n.dead = true;
      ++merged;
      done = true;
      break;
    }
    if (!done) seen[h].push_back(static_cast<int32_t>(i));
  }
  if (merged) g.compact();
  return merged;
}

}  // namespace tpu::graph
