// Derivative formulas of matmul, linear, layer_norm and rms_norm. The norms' statistics are
// recomputed from the saved input (in f32 for 16-bit inputs) instead of being saved.
#include "tpucore/autograd/formula.h"

namespace tpu::autograd::formula {
namespace {

// Each operand of a product is needed only for the other operand's gradient.
void product_saves(uint32_t needs, uint32_t& in, uint32_t& out) {
  in = ((needs & kIn1) ? kIn0 : 0u) | ((needs & kIn0) ? kIn1 : 0u);
  out = 0;
}

void matmul_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  const Tensor &x = a.inputs[0], &y = a.inputs[1];
  const Shape &xs = a.input_meta[0].shape, &ys = a.input_meta[1].shape;
  if (xs.ndim() == 1 && ys.ndim() == 1) {  // dot product
    if (a.needs_grad(0)) g[0] = mul(go, y);
    if (a.needs_grad(1)) g[1] = mul(go, x);
    return;
  }
  Tensor gm = go;
  if (xs.ndim() == 1) gm = unsqueeze(gm, -2);
  if (ys.ndim() == 1) gm = unsqueeze(gm, -1);
  if (a.needs_grad(0)) {
    Tensor y2 = ys.ndim() == 1 ? unsqueeze(y, -1) : y;
    Tensor gx = matmul(gm, transpose(y2, -1, -2));
    g[0] = xs.ndim() == 1 ? reshape(detail::sum_to(gx, Shape{1, xs[0]}), xs) : detail::sum_to(gx, xs);
  }
  if (a.needs_grad(1)) {
    Tensor x2 = xs.ndim() == 1 ? unsqueeze(x, 0) : x;
    Tensor gy = matmul(transpose(x2, -1, -2), gm);
    g[1] = ys.ndim() == 1 ? reshape(detail::sum_to(gy, Shape{ys[0], 1}), ys) : detail::sum_to(gy, ys);
  }
}

void linear_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  const Shape &xs = a.input_meta[0].shape, &ws = a.input_meta[1].shape;
  if (a.needs_grad(0)) g[0] = matmul(go, a.inputs[1]);
  if (a.needs_grad(1)) {
    Tensor g2 = reshape(go, Shape{-1, ws[0]});
    Tensor x2 = reshape(a.inputs[0], Shape{-1, xs[xs.ndim() - 1]});
    g[1] = matmul(transpose(g2, 0, 1), x2);
  }
  if (a.attrs.get_bool("has_bias") && a.needs_grad(2)) g[2] = go;  // the engine sums it to the bias shape
}

struct NormView {
  Tensor x, go;  // in f32 for 16-bit inputs
  Dims dims;     // the normalized (trailing) dims
};
NormView norm_view(const BackwardArgs& a) {
  NormView v;
  const int nd = static_cast<int>(a.attrs.get_ints("normalized_shape").size());
  const int n = a.input_meta[0].shape.ndim();
  for (int i = n - nd; i < n; ++i) v.dims.push_back(i);
  v.x = a.inputs[0].dtype() == DType::f32 ? a.inputs[0] : a.inputs[0].to(DType::f32);
  v.go = a.grad_outputs[0].dtype() == DType::f32 ? a.grad_outputs[0] : a.grad_outputs[0].to(DType::f32);
  return v;
}

void layer_norm_bw(const BackwardArgs& a, Grads g) {
  NormView v = norm_view(a);
  const double eps = a.attrs.get_float("eps");
  const bool hw = a.attrs.get_bool("has_weight"), hb = a.attrs.get_bool("has_bias");
  Tensor xc = sub(v.x, mean(v.x, v.dims, true));
  Tensor rstd = rsqrt(add(mean(mul(xc, xc), v.dims, true), eps));
  Tensor xhat = mul(xc, rstd);
  if (hb && a.needs_grad(2)) g[2] = v.go;
  if (hw && a.needs_grad(1)) g[1] = mul(v.go, xhat);
  if (a.needs_grad(0)) {
    Tensor gh = hw ? mul(v.go, a.inputs[1]) : v.go;
    Tensor inner = sub(sub(gh, mean(gh, v.dims, true)), mul(xhat, mean(mul(gh, xhat), v.dims, true)));
    g[0] = mul(rstd, inner);
  }
}

void rms_norm_bw(const BackwardArgs& a, Grads g) {
  NormView v = norm_view(a);
  const double eps = a.attrs.get_float("eps");
  const bool hw = a.attrs.get_bool("has_weight");
  Tensor r = rsqrt(add(mean(mul(v.x, v.x), v.dims, true), eps));
  Tensor xhat = mul(v.x, r);
  if (hw && a.needs_grad(1)) g[1] = mul(v.go, xhat);
  if (a.needs_grad(0)) {
    Tensor gh = hw ? mul(v.go, a.inputs[1]) : v.go;
    g[0] = mul(r, sub(gh, mul(xhat, mean(mul(gh, xhat), v.dims, true))));
  }
}

[[maybe_unused]] const bool linalg_registered = [] {
  define("matmul", &matmul_bw, 0, 0, &product_saves);
  define("linear", &linear_bw, 0, 0, &product_saves);
  define("layer_norm", &layer_norm_bw, kIn0 | kIn1);
  define("rms_norm", &rms_norm_bw, kIn0 | kIn1);
  return true;
}();

}  // namespace
}  // namespace tpu::autograd::formula
