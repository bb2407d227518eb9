// Number arguments as runtime inputs. fn is traced twice, with the real values and with
// different ones; when the two graphs differ only in 0-d constants that equal the argument
// in each trace, those constants become graph inputs fed from the argument on every call.
// Any other difference (a shape, an attribute, the ops themselves) makes the arguments static.
#include "tpucore/jit_internal.h"
#include "tpucore/ops.h"

namespace tpu::jit::detail {
namespace {

double as_dtype(double v, DType dt) { return tpu::scalar_tensor(Scalar(v), TensorOptions(dt)).item<double>(); }

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
  for (size_t i = 0; same && i < a.nodes.size(); ++i) {
    const graph::Node &x = a.nodes[i], &y = b.nodes[i];
    same = x.op == y.op && x.inputs == y.inputs && x.outputs == y.outputs && graph::attrs_equal(x.attrs, y.attrs);
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
    int which = -1;
    for (int c : candidates) {
      const auto ci = static_cast<size_t>(c);
      if (ca == as_dtype(args[ci].number, x.meta.dtype) && cb == as_dtype(values_b[ci], x.meta.dtype)) {
        which = which < 0 ? c : -2;  // two arguments with the same value: ambiguous
      }
    }
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
  return {};
}

}  // namespace tpu::jit::detail
