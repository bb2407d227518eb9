// Algebraic simplification. Each rule replaces a node by one of its inputs (or a simpler
// node) only when the result has exactly the same shape and dtype:
//   x * 1, 1 * x, x / 1, x + 0, 0 + x, x - 0      (constant splats; add/sub alpha respected)
//   to_dtype(x) to x's own dtype; contiguous(x) of a freshly computed x
//   permute(permute(x)) -> one permute (or x when it is the identity)
//   view(view(x)) -> one view; view/expand to the same shape -> x
#include <cstring>

#include "graph/passes/passes.h"

namespace tpu::graph {
namespace {

// The single value of a constant whose elements are all equal, as a double.
bool splat_value(const Graph& g, ValueId v, double& out) {
  const Value& val = g.value(v);
  if (val.kind != ValueKind::constant || val.constant.numel() == 0 || val.constant.numel() > 4096) return false;
  std::vector<float> xs = val.constant.to_vector<float>();
  for (float x : xs)
    if (std::memcmp(&x, &xs[0], sizeof(float)) != 0) return false;
  out = xs[0];
  return true;
}

bool is_splat(const Graph& g, ValueId v, double want) {
  double x;
  return splat_value(g, v, x) && x == want && !std::signbit(x);
}

int64_t alpha_of(const Node& n) {
  const ops::AttrValue* a = n.attrs.find("alpha");
  if (!a) return 1;
  if (const auto* s = std::get_if<Scalar>(a)) return s->to_double() == 1.0 ? 1 : 0;
  if (const auto* d = std::get_if<double>(a)) return *d == 1.0 ? 1 : 0;
  if (const auto* i = std::get_if<int64_t>(a)) return *i == 1 ? 1 : 0;
  return 0;
}

}  // namespace

int simplify(Graph& g) {
  int changes = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (n.dead || n.outputs.size() != 1) continue;
    const ValueId out = n.outputs[0];
    const ValueMeta om = g.meta(out);
    const std::string& name = n.op->name;
    auto same = [&](ValueId x) { return g.meta(x).shape == om.shape && g.meta(x).dtype == om.dtype; };
    ValueId repl = kNoValue;
    if (name == "mul" && n.inputs.size() == 2) {
      if (is_splat(g, n.inputs[1], 1.0) && same(n.inputs[0])) repl = n.inputs[0];
      else if (is_splat(g, n.inputs[0], 1.0) && same(n.inputs[1])) repl = n.inputs[1];
    } else if (name == "div" && n.inputs.size() == 2) {
      if (is_splat(g, n.inputs[1], 1.0) && same(n.inputs[0])) repl = n.inputs[0];
    } else if ((name == "add" || name == "sub") && n.inputs.size() == 2) {
      if (is_splat(g, n.inputs[1], 0.0) && same(n.inputs[0])) repl = n.inputs[0];
      else if (name == "add" && alpha_of(n) == 1 && is_splat(g, n.inputs[0], 0.0) && same(n.inputs[1]))
        repl = n.inputs[1];
    } else if (name == "to_dtype") {
      if (same(n.inputs[0])) repl = n.inputs[0];
    } else if (name == "contiguous") {
      const Node* p = g.producer(n.inputs[0]);
      if (p && !p->op->has(ops::kView) && same(n.inputs[0])) repl = n.inputs[0];
    } else if (name == "expand" || name == "view") {
      if (same(n.inputs[0])) {
        repl = n.inputs[0];
      } else if (name == "view") {
        Node* p = g.producer(n.inputs[0]);
        if (p && p->op == n.op) {
          n.inputs[0] = p->inputs[0];  // view(view(x, s1), s2) == view(x, s2)
          ++changes;
          if (same(n.inputs[0])) repl = n.inputs[0];
        }
      }
    } else if (name == "permute") {
      const auto& d2 = n.attrs.get_ints("dims");
      bool identity = true;
      for (size_t k = 0; k < d2.size(); ++k) identity &= d2[k] == static_cast<int64_t>(k) || d2[k] == static_cast<int64_t>(k) - static_cast<int64_t>(d2.size());
      if (identity) {
        repl = n.inputs[0];
      } else if (Node* p = g.producer(n.inputs[0]); p && p->op == n.op) {
        const auto& d1 = p->attrs.get_ints("dims");
        const int64_t r = static_cast<int64_t>(d1.size());
        std::vector<int64_t> comp(d2.size());
        bool id = true;
        for (size_t k = 0; k < d2.size(); ++k) {
          int64_t a = d2[k] < 0 ? d2[k] + r : d2[k];
          int64_t b = d1[static_cast<size_t>(a)];
          comp[k] = b < 0 ? b + r : b;
          id &= comp[k] == static_cast<int64_t>(k);
        }
        if (id) {
          repl = p->inputs[0];
        } else {
          n.inputs[0] = p->inputs[0];
          n.attrs = ops::Attrs{{"dims", comp}};
          ++changes;
        }
      }
    }
    if (repl != kNoValue && repl != out) {
      g.replace_uses(out, repl);
      n.dead = true;
      ++changes;
    }
  }
  if (changes) g.compact();
  return changes;
}

}  // namespace tpu::graph
