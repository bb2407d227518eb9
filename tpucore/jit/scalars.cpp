// Number arguments as runtime inputs. fn is traced twice, with the real values and with
// different ones; when the two graphs differ only in 0-d constants that equal the argument
// in each trace, those constants become graph inputs fed from the argument on every call.
// An f32 clamp whose bound is the argument becomes maximum/minimum with the bound as such an
// input (the same values: the kernel computes min(max(x, lo), hi), and a NaN bound gives NaN
// either way; only a zero's sign may differ, -0 clamped at a +0 bound giving +0). Any other
// difference (a shape, another attribute, the ops themselves) makes the arguments static.
#include <algorithm>
#include <cmath>
#include <string_view>

#include "tpucore/jit/internal.h"
#include "tpucore/ops.h"

namespace tpu::jit::detail {
namespace {

double as_dtype(double v, DType dt) { return tpu::scalar_tensor(Scalar(v), TensorOptions(dt)).item<double>(); }

// The one candidate argument for which `matches(arg index)` holds; -1 for none, -2 when two or
// more do (equal values: which argument a constant comes from is unknown).
template <class Match>
int matching_arg(const std::vector<int>& candidates, Match&& matches) {
  int which = -1;
  for (int c : candidates) {
    if (!matches(static_cast<size_t>(c))) continue;
    if (which != -1) return -2;
    which = c;
  }
  return which;
}

// A clamp bound that follows a number argument: the bound `attr` of node `node` is arg `arg`.
struct ClampBound {
  size_t node;
  const char* attr;
  int arg;
};

// Whether clamp nodes x (of graph a) and y (of b) differ only in bounds that follow one
// candidate argument each; those go to `out`.
bool clamp_bounds_follow_args(const graph::Graph& a, size_t ni, const graph::Node& y, std::span<const ArgSlot> args,
                              const std::vector<double>& values_b, const std::vector<int>& candidates,
                              std::vector<ClampBound>& out) {
  const graph::Node& x = a.nodes[ni];
  if (std::string_view(x.op->name) != "clamp" || a.meta(x.outputs[0]).dtype != DType::f32) return false;
  for (const char* attr : {"min", "max"}) {
    if (x.attrs.has(attr) != y.attrs.has(attr)) return false;
    if (!x.attrs.has(attr)) continue;
    const double ca = x.attrs.get_scalar(attr).to_double(), cb = y.attrs.get_scalar(attr).to_double();
    if (ca == cb || (std::isnan(ca) && std::isnan(cb))) continue;
    // The attribute keeps the number as given (the kernel rounds it to f32, as the runtime
    // input will be).
    const int which =
        matching_arg(candidates, [&](size_t ci) { return ca == args[ci].number && cb == values_b[ci]; });
    if (which < 0) return false;
    out.push_back({ni, attr, which});
  }
  return true;
}

// Rewrites the clamp nodes of `binds` (all of one graph, any order) into maximum/minimum with
// their runtime bounds as new 0-d inputs (appended to g.inputs; `bound` gets (arg, f32) for
// each). A clamp with both bounds becomes two nodes, so later nodes move up by one.
void rewrite_clamps(graph::Graph& g, std::vector<ClampBound> binds, std::vector<std::pair<int, DType>>& bound) {
  const ops::OpDef* max_op = ops::find_op("maximum");
  const ops::OpDef* min_op = ops::find_op("minimum");
  TPU_CHECK(max_op && min_op && g.regions.empty(), "internal: runtime clamp bounds need maximum/minimum on an unfused graph");
  // Last node first, so inserting a node leaves the indices still to visit valid.
  std::sort(binds.begin(), binds.end(), [](const ClampBound& l, const ClampBound& r) { return l.node > r.node; });
  for (size_t k = 0; k < binds.size();) {
    const size_t ni = binds[k].node;
    int lo_arg = -1, hi_arg = -1;
    for (; k < binds.size() && binds[k].node == ni; ++k)
      (std::string_view(binds[k].attr) == "min" ? lo_arg : hi_arg) = binds[k].arg;
    const graph::Node clamp = g.nodes[ni];
    auto operand = [&](const char* attr, int arg) -> graph::ValueId {
      if (arg < 0) {  // a bound that stays: a wrapped constant
        Tensor c = tpu::scalar_tensor(Scalar(clamp.attrs.get_scalar(attr).to_double()), TensorOptions(DType::f32));
        c.impl().wrapped_number = true;
        return g.add_constant(std::move(c), true);
      }
      const graph::ValueId v = g.add_input(graph::ValueMeta{Shape{}, DType::f32, Device(), true});
      bound.emplace_back(arg, DType::f32);
      return v;
    };
    const bool has_lo = clamp.attrs.has("min"), has_hi = clamp.attrs.has("max");
    const graph::ValueId lo = has_lo ? operand("min", lo_arg) : graph::kNoValue;
    const graph::ValueId hi = has_hi ? operand("max", hi_arg) : graph::kNoValue;
    graph::Node& n = g.nodes[ni];
    n.attrs = ops::Attrs();
    if (!has_hi) {
      n.op = max_op;
      n.inputs = {clamp.inputs[0], lo};
    } else if (!has_lo) {
      n.op = min_op;
      n.inputs = {clamp.inputs[0], hi};
    } else {
      // t = maximum(x, lo) goes in front; the clamp node becomes minimum(t, hi).
      for (graph::Value& v : g.values)
        if (v.kind == graph::ValueKind::node && v.producer >= static_cast<int32_t>(ni)) ++v.producer;
      graph::Value t;
      t.meta = g.meta(clamp.outputs[0]);
      t.kind = graph::ValueKind::node;
      t.producer = static_cast<int32_t>(ni);
      g.values.push_back(t);
      const auto tv = static_cast<graph::ValueId>(g.values.size() - 1);
      n.op = min_op;
      n.inputs = {tv, hi};
      graph::Node m;
      m.op = max_op;
      m.inputs = {clamp.inputs[0], lo};
      m.outputs = {tv};
      g.nodes.insert(g.nodes.begin() + static_cast<std::ptrdiff_t>(ni), std::move(m));  // n is stale after this
    }
  }
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

}  // namespace

std::vector<int> bind_scalar_args(graph::Graph& a, const graph::Graph& b, std::span<const ArgSlot> args,
                                  const std::vector<double>& values_b, std::vector<std::pair<int, DType>>& bound) {
  std::vector<int> candidates;
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].kind == ArgSlot::Kind::number && !args[i].boolean && values_b[i] != args[i].number)
      candidates.push_back(static_cast<int>(i));
  if (candidates.empty()) return {};
  bool same = a.values.size() == b.values.size() && a.nodes.size() == b.nodes.size() && a.inputs == b.inputs &&
              a.outputs == b.outputs;
  std::vector<ClampBound> clamps;
  for (size_t i = 0; same && i < a.nodes.size(); ++i) {
    const graph::Node &x = a.nodes[i], &y = b.nodes[i];
    same = x.op == y.op && x.inputs == y.inputs && x.outputs == y.outputs &&
           (graph::attrs_equal(x.attrs, y.attrs) || clamp_bounds_follow_args(a, i, y, args, values_b, candidates, clamps));
  }
  std::vector<std::pair<graph::ValueId, int>> binds;
  for (size_t v = 0; same && v < a.values.size(); ++v) {
    const graph::Value &x = a.values[v], &y = b.values[v];
    if (x.kind != y.kind || !(x.meta == y.meta)) {
      same = false;
      break;
    }
    if (x.kind != graph::ValueKind::constant || same_bytes(x.constant, y.constant)) continue;
    if (x.meta.shape.ndim() != 0) {
      same = false;
      break;
    }
    const double ca = x.constant.item<double>(), cb = y.constant.item<double>();
    const int which = matching_arg(candidates, [&](size_t ci) {
      return ca == as_dtype(args[ci].number, x.meta.dtype) && cb == as_dtype(values_b[ci], x.meta.dtype);
    });
    if (which < 0) {
      same = false;
      break;
    }
    binds.emplace_back(static_cast<graph::ValueId>(v), which);
  }
  if (!same) return candidates;
  for (auto& [v, arg] : binds) {
    graph::Value& val = a.values[static_cast<size_t>(v)];
    val.kind = graph::ValueKind::input;
    val.producer = static_cast<int32_t>(a.inputs.size());
    val.constant = Tensor();
    a.inputs.push_back(v);
    bound.emplace_back(arg, val.meta.dtype);
  }
  if (!clamps.empty()) rewrite_clamps(a, std::move(clamps), bound);
  return {};
}

}  // namespace tpu::jit::detail
