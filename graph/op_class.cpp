#include "graph/op_class.h"

#include "graph/async_ops.h"

#include <algorithm>

namespace tpu::graph {
namespace {

// First reduced dim when the normalized dims form a trailing suffix, else -1.
int trailing_suffix_start(std::vector<int64_t> dims, int n) {
  if (dims.empty()) return 0;  // all dims
  for (auto& d : dims) {
    if (d < -n || d >= n) return -1;
    if (d < 0) d += n;
  }
  std::sort(dims.begin(), dims.end());
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] != n - static_cast<int64_t>(dims.size()) + static_cast<int64_t>(i)) return -1;
  return static_cast<int>(dims.front());
}

}  // namespace

FusionInfo classify(const Graph& g, const Node& n) {
  FusionInfo f;
  if (n.dead || n.outputs.size() != 1 || !n.op->cpu) return f;
  const ops::OpDef& op = *n.op;
  if (op.has(ops::kView) || op.has(ops::kRandom) || op.has(ops::kCreation) || is_async(n)) return f;
  const ValueMeta& out = g.meta(n.outputs[0]);
  const int nd = out.shape.ndim();
  if (out.shape.numel() == 0) return f;
  if (op.has(ops::kElementwise)) {
    f.cls = OpClass::elementwise;
    f.tile_limit = nd - 1;
    return f;
  }
  if (n.inputs.empty()) return f;
  const ValueMeta& in0 = g.meta(n.inputs[0]);
  if (op.has(ops::kReduction)) {
    const auto* dims = n.attrs.find("dims");
    if (!dims || !std::holds_alternative<std::vector<int64_t>>(*dims) || !n.attrs.get_bool("keepdim", false)) return f;
    if (n.inputs.size() != 1 || in0.shape.ndim() != nd) return f;
    int s = trailing_suffix_start(std::get<std::vector<int64_t>>(*dims), nd);
    if (s < 1) return f;
    f.cls = OpClass::rowwise;
    f.tile_limit = s - 1;
    return f;
  }
  if (op.name == "softmax" || op.name == "log_softmax") {
    if (!n.attrs.has("dim") || nd < 2) return f;
    int64_t d = n.attrs.get_int("dim");
    if (d != -1 && d != nd - 1) return f;
    f.cls = OpClass::rowwise;
    f.tile_limit = nd - 2;
    return f;
  }
  if (op.name == "layer_norm" || op.name == "rms_norm") {
    const auto* ns = n.attrs.find("normalized_shape");
    if (!ns || !std::holds_alternative<std::vector<int64_t>>(*ns)) return f;
    int m = static_cast<int>(std::get<std::vector<int64_t>>(*ns).size());
    if (m < 1 || m >= nd) return f;
    // Weight and bias (trailing-only shapes); an absent one is passed as x with its flag false.
    const char* flags[] = {"", "has_weight", "has_bias"};
    for (size_t i = 1; i < n.inputs.size() && i < 3; ++i)
      if (n.attrs.get_bool(flags[i], false) && g.meta(n.inputs[i]).shape.ndim() > m) return f;
    f.cls = OpClass::rowwise;
    f.tile_limit = nd - m - 1;
    return f;
  }
  if ((op.name == "matmul" && n.inputs.size() == 2) || (op.name == "linear" && n.inputs.size() == 3)) {
    const ValueMeta& b = g.meta(n.inputs[1]);
    if (nd < 2 || in0.shape.ndim() != nd || b.shape.ndim() != 2) return f;
    f.cls = OpClass::matmul;
    f.tile_limit = nd - 2;
    return f;
  }
  return f;
}

InputMode input_mode(OpClass c, size_t input) {
  switch (c) {
    case OpClass::elementwise: return InputMode::broadcast;
    case OpClass::rowwise:
    case OpClass::matmul: return input == 0 ? InputMode::own : InputMode::full;
    default: return InputMode::full;
  }
}

}  // namespace tpu::graph
