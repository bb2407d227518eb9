// Derivative formulas of the reductions (sum, mean, prod, amax/amin, max/min over a dim, var,
// std, logsumexp) and of softmax/log_softmax.
#include "tpucore/autograd/formula.h"

namespace tpu::autograd::formula {
namespace {

struct Red {
  Shape in;
  std::vector<int> dims;
  bool keepdim;
};
Red red_of(const BackwardArgs& a) {
  const Shape& in = a.input_meta[0].shape;
  return {in, reduce_dims(a.attrs, in.ndim(), a.op.name.c_str()), a.attrs.get_bool("keepdim")};
}
Tensor up(const Tensor& t, const Red& r) { return unreduce(t, r.in, r.dims, r.keepdim); }

void sum_bw(const BackwardArgs& a, Grads g) { g[0] = up(a.grad_outputs[0], red_of(a)); }
void mean_bw(const BackwardArgs& a, Grads g) {
  Red r = red_of(a);
  g[0] = up(div(a.grad_outputs[0], static_cast<double>(reduced_count(r.in, r.dims))), r);
}
void prod_bw(const BackwardArgs& a, Grads g) {
  Red r = red_of(a);
  const Tensor& x = a.inputs[0];
  Tensor go = up(a.grad_outputs[0], r);
  // d prod / d x_i = product of the other elements: out / x_i where x_i != 0; where x_i is the
  // only zero of its slice, the product of the nonzero elements; 0 when the slice has two zeros.
  Tensor is_zero = eq(x, 0);
  Tensor zeros_in_slice = sum(is_zero, Dims(r.dims.begin(), r.dims.end()), true);
  Tensor prod_nonzero = prod(where(is_zero, 1.0, x), Dims(r.dims.begin(), r.dims.end()), true);
  Tensor at_zero = where(eq(zeros_in_slice, 1), prod_nonzero, 0.0);
  Tensor out = up(a.outputs[0], r);
  Tensor d = where(is_zero, expand(at_zero, r.in), div(out, where(is_zero, 1.0, x)));
  g[0] = mul(go, d);
}
void extremum_bw(const BackwardArgs& a, Grads g) {
  Red r = red_of(a);
  const Tensor& x = a.inputs[0];
  // Ties share the gradient evenly (as PyTorch's amax/amin).
  Tensor hit = eq(x, up(a.outputs[0], r));
  Tensor count = sum(hit, Dims(r.dims.begin(), r.dims.end()), true).to(x.dtype());
  Tensor share = div(r.keepdim ? a.grad_outputs[0] : reshape(a.grad_outputs[0], count.shape()), count);
  g[0] = where(hit, expand(share, r.in), 0.0);
}
void value_index_bw(const BackwardArgs& a, Grads g) {
  // max/min over one dim: the gradient goes to the element each index names.
  const ops::TensorMeta& im = a.input_meta[0];
  if (im.shape.ndim() == 0) {
    g[0] = a.grad_outputs[0];
    return;
  }
  const int d = wrap_dim(a.attrs.get_ints("dims")[0], im.shape.ndim(), a.op.name.c_str());
  Tensor go = a.grad_outputs[0], idx = a.outputs[1];
  if (!a.attrs.get_bool("keepdim")) {
    go = unsqueeze(go, d);
    idx = unsqueeze(idx, d);
  }
  g[0] = scatter_add(zeros(im.shape, opts(im)), d, idx, go.to(im.dtype));
}
void var_bw(const BackwardArgs& a, Grads g, bool is_std) {
  Red r = red_of(a);
  const Tensor& x = a.inputs[0];
  const double den = static_cast<double>(reduced_count(r.in, r.dims) - a.attrs.get_int("correction"));
  Tensor centered = sub(x, mean(x, Dims(r.dims.begin(), r.dims.end()), true));
  Tensor go = up(a.grad_outputs[0], r);
  if (is_std) {
    Tensor sd = up(a.outputs[0], r);  // a zero std gets a zero gradient (not 0/0)
    g[0] = where(eq(sd, 0), 0.0, div(mul(go, centered), mul(sd, den)));
  }
  else g[0] = mul(mul(go, centered), 2.0 / den);
}
void variance_bw(const BackwardArgs& a, Grads g) { var_bw(a, g, false); }
void std_bw(const BackwardArgs& a, Grads g) { var_bw(a, g, true); }
void logsumexp_bw(const BackwardArgs& a, Grads g) {
  Red r = red_of(a);
  g[0] = mul(up(a.grad_outputs[0], r), exp(sub(a.inputs[0], up(a.outputs[0], r))));
}

void softmax_bw(const BackwardArgs& a, Grads g) {
  const Tensor &y = a.outputs[0], &go = a.grad_outputs[0];
  if (y.dim() == 0) {
    g[0] = zeros_like(go);
    return;
  }
  const int64_t d = a.attrs.get_int("dim");
  g[0] = mul(y, sub(go, sum(mul(go, y), {d}, true)));
}
void log_softmax_bw(const BackwardArgs& a, Grads g) {
  const Tensor &y = a.outputs[0], &go = a.grad_outputs[0];
  if (y.dim() == 0) {
    g[0] = zeros_like(go);
    return;
  }
  const int64_t d = a.attrs.get_int("dim");
  g[0] = sub(go, mul(exp(y), sum(go, {d}, true)));
}

[[maybe_unused]] const bool reduce_registered = [] {
  define("sum", &sum_bw);
  define("mean", &mean_bw);
  define("prod", &prod_bw, kIn0, kOut0);
  define("amax", &extremum_bw, kIn0, kOut0);
  define("amin", &extremum_bw, kIn0, kOut0);
  define("max_dim", &value_index_bw, 0, kOut1);
  define("min_dim", &value_index_bw, 0, kOut1);
  define("var", &variance_bw, kIn0);
  define("std", &std_bw, kIn0, kOut0);
  define("logsumexp", &logsumexp_bw, kIn0, kOut0);
  define("softmax", &softmax_bw, 0, kOut0);
  define("log_softmax", &log_softmax_bw, 0, kOut0);
  return true;
}();

}  // namespace
}  // namespace tpu::autograd::formula
