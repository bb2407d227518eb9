// Derivative formula of scaled_dot_product_attention, in terms of other ops (so it runs on any
// device and traces). The probabilities are recomputed from the saved q, k (and mask):
//   P = softmax(q kr^T * scale + mask),  dV = sum_groups(P^T dO),  dP = dO vr^T,
//   dS = P * (dP - rowsum(dO * O)),  dQ = dS kr * scale,  dK = sum_groups(dS^T q) * scale,
// where kr/vr are k/v with each KV head repeated for the Hq / Hk query heads that read it, and
// sum_groups adds the gradients of those query heads back onto their KV head. The bool mask
// gets no gradient. rowsum(dP * P) equals rowsum(dO * O) (O = P vr, the saved output), which
// reads [L, C] values instead of the [L, S] ones. The products with a transposed [L, S] matrix
// are computed transposed, dV^T = dO^T P and dK^T = q^T dS, so the large matrices are only ever
// read in their stored layout (a chip matmul gathers a transposed left operand first) and only
// the small [C, S] results are transposed.
#include <cmath>

#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {

// [..., Hk, L, C] -> [..., Hk * g, L, C] (each head repeated g times in a row).
Tensor repeat_heads(const Tensor& t, int64_t g) {
  if (g == 1) return t;
  Shape e = t.shape(), r = t.shape();
  const int n = t.dim();
  Tensor u = unsqueeze(t, n - 2);  // [..., Hk, 1, L, C]
  e.insert(n - 2, g);
  r[n - 3] *= g;
  return reshape(expand(u, e), r);
}

// [..., Hk * g, L, C] -> [..., Hk, L, C]: the sum over each group of g heads.
Tensor sum_heads(const Tensor& t, int64_t g) {
  if (g == 1) return t;
  const int n = t.dim();
  Shape s = t.shape();
  s[n - 3] /= g;
  s.insert(n - 2, g);
  return sum(reshape(t, s), {n - 2});
}

void sdpa_bw(const ops::BackwardArgs& a, std::span<Tensor> g) {
  const Tensor &q = a.inputs[0], &k = a.inputs[1], &v = a.inputs[2], &go = a.grad_outputs[0];
  const int n = q.dim();
  const int64_t grp = n >= 3 ? q.size(-3) / k.size(-3) : 1;
  const double scale = a.attrs.get_float("scale");
  const Tensor kr = repeat_heads(k, grp), vr = repeat_heads(v, grp);
  Tensor s = mul(matmul(q, transpose(kr, -1, -2)), scale);
  if (a.attrs.get_bool("causal")) {
    const Tensor future = triu(ones(Shape{q.size(-2), k.size(-2)}, TensorOptions(DType::boolean, q.device())), 1);
    s = masked_fill(s, future, -INFINITY);
  }
  if (a.attrs.get_bool("has_mask")) s = masked_fill(s, logical_not(a.inputs[3]), -INFINITY);
  const Tensor p = softmax(s, -1);
  // m^T t computed as (t^T m)^T: [..., L, C]^T [..., L, S] -> [..., C, S], transposed.
  auto tmm = [](const Tensor& t, const Tensor& m) { return transpose(matmul(transpose(t, -1, -2), m), -1, -2); };
  if (a.needs_grad(2)) g[2] = sum_heads(tmm(go, p), grp);
  if (!a.needs_grad(0) && !a.needs_grad(1)) return;
  const Tensor dp = matmul(go, transpose(vr, -1, -2));
  const Tensor ds = mul(p, sub(dp, sum(mul(go, a.outputs[0]), {-1}, true)));
  if (a.needs_grad(0)) g[0] = mul(matmul(ds, kr), scale);
  if (a.needs_grad(1)) g[1] = mul(sum_heads(tmm(q, ds), grp), scale);
}

[[maybe_unused]] const bool g_registered = [] {
  // Saves q, k, v and the mask (inputs 0-3) and the output.
  ops::set_backward("scaled_dot_product_attention", ops::BackwardDef{&sdpa_bw, 0xFu, 1u, nullptr});
  return true;
}();

}  // namespace
}  // namespace tpu
