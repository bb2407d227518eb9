// Derivative formulas of the mixture-of-experts ops: topk, grouped_matmul (and its weight
// gradient, so second derivatives exist too), moe_permute, moe_unpermute and cumsum. Every formula is
// again made of those ops: the gradients of a grouped product are grouped products over the
// same group sizes, and permuting and unpermuting are each other's transposes.
#include "ops/hot_rows.h"
#include "tpucore/autograd/formula.h"
#include "tpucore/moe_ops.h"

namespace tpu::autograd::formula {
namespace {

void topk_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  if (!go.defined()) return;
  const ops::TensorMeta& im = a.input_meta[0];
  const int d = wrap_dim(a.attrs.get_int("dim"), im.shape.ndim(), "topk");
  const Tensor& idx = a.outputs[1];
  const int64_t n = im.shape.ndim() ? im.shape[d] : 1, k = idx.dim() ? idx.size(d) : 1;
  if (d == im.shape.ndim() - 1 && n * k <= 4096 && !im.device.is_cpu()) {
    // Along a short last dim (a router's experts), as a selection against the one-hot rows of the
    // indices: an f32 comparison with an iota, ops a chip runs (its scatter_add takes rows only).
    // The indices of a row are distinct, so every element gets at most one term: exact.
    const Tensor hot = ops::hot_rows(idx, n);  // [.., k, n]
    g[0] = sum(where(hot, unsqueeze(go.to(im.dtype), -1), 0.0), {-2});
    return;
  }
  g[0] = scatter_add(zeros(im.shape, opts(im)), d, idx, go.to(im.dtype));
}

// x is needed for w's gradient and w for x's; the group sizes always.
void grouped_product_saves(uint32_t needs, uint32_t& in, uint32_t& out) {
  in = kIn2 | ((needs & kIn1) ? kIn0 : 0u) | ((needs & kIn0) ? kIn1 : 0u);
  out = 0;
}

// y = x_e w_e (w_e [K, N]), or x_e w_e^T with transpose_w (w_e [N, K]):
// dx = dy w_e^T (dy w_e), dw = x_e^T dy (dy^T x_e).
void grouped_matmul_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  const Tensor &x = a.inputs[0], &w = a.inputs[1], &gs = a.inputs[2];
  const bool tw = a.attrs.get_bool("transpose_w");
  if (a.needs_grad(0)) g[0] = grouped_matmul(go, w, gs, !tw).to(a.input_meta[0].dtype);
  if (a.needs_grad(1)) g[1] = grouped_matmul_weight_grad(x, go, gs, tw).to(a.input_meta[1].dtype);
}

// z_e = x_e^T dy_e [K, N] (transpose_w: dy_e^T x_e [N, K]); with G_e the gradient of z_e:
// dx = dy G_e^T (dy G_e), d(dy) = x G_e (x G_e^T).
void weight_grad_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  const Tensor &x = a.inputs[0], &dy = a.inputs[1], &gs = a.inputs[2];
  const bool tw = a.attrs.get_bool("transpose_w");
  if (a.needs_grad(0)) g[0] = grouped_matmul(dy, go, gs, !tw).to(a.input_meta[0].dtype);
  if (a.needs_grad(1)) g[1] = grouped_matmul(x, go, gs, tw).to(a.input_meta[1].dtype);
}

void moe_permute_bw(const BackwardArgs& a, Grads g) {
  g[0] = moe_unpermute(a.grad_outputs[0], a.inputs[1], Tensor(), a.attrs.get_int("top_k")).to(a.input_meta[0].dtype);
}

// out[t] = sum_j w[t, j] y[i(t, j)]: dy[i] = w[slot i] dout[token of slot i], and
// dw[slot i] = <y[i], dout[token of slot i]>.
void unpermute_bw(const BackwardArgs& a, Grads g) {
  const Tensor &y = a.inputs[0], &order = a.inputs[1], &w = a.inputs[2];
  const int64_t k = a.attrs.get_int("top_k");
  const bool hw = a.attrs.get_bool("has_weights");
  const Tensor spread = moe_permute(a.grad_outputs[0], order, k);  // dout of each slot's token, [S, H]
  if (a.needs_grad(0)) {
    Tensor gy = spread;
    if (hw) gy = mul(spread, unsqueeze(index_select(reshape(w, Shape{-1}), 0, order), 1));
    g[0] = gy.to(a.input_meta[0].dtype);
  }
  if (hw && a.needs_grad(2)) {
    const Tensor per_row = sum(mul(y.to(DType::f32), spread.to(DType::f32)), {1}, true);  // [S, 1], row i's slot
    // Back to slot order: an unpermute with one choice per "token" puts row i at order[i].
    const Tensor per_slot = moe_unpermute(per_row, order, Tensor(), 1);
    g[2] = reshape(per_slot, a.input_meta[2].shape).to(a.input_meta[2].dtype);
  }
}

// out_i = sum_{j <= i} x_j: dx_j = sum_{i >= j} dout_i = total - (inclusive prefix up to j) + dout_j.
void cumsum_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  const ops::TensorMeta& im = a.input_meta[0];
  if (!go.defined() || !is_floating(im.dtype)) return;
  if (im.shape.ndim() == 0) {
    g[0] = go.to(im.dtype);
    return;
  }
  const int64_t d = a.attrs.get_int("dim");
  g[0] = add(sub(sum(go, {d}, true), cumsum(go, d)), go).to(im.dtype);
}

void unpermute_saves(uint32_t needs, uint32_t& in, uint32_t& out) {
  in = kIn1 | ((needs & kIn0) ? kIn2 : 0u) | ((needs & kIn2) ? kIn0 : 0u);
  out = 0;
}

[[maybe_unused]] const bool moe_registered = [] {
  define("topk", &topk_bw, 0, kOut1);
  define("grouped_matmul", &grouped_matmul_bw, 0, 0, &grouped_product_saves);
  define("grouped_matmul_weight_grad", &weight_grad_bw, 0, 0, &grouped_product_saves);
  define("moe_permute", &moe_permute_bw, kIn1);
  define("moe_unpermute", &unpermute_bw, 0, 0, &unpermute_saves);
  define("cumsum", &cumsum_bw);
  return true;
}();

}  // namespace
}  // namespace tpu::autograd::formula
