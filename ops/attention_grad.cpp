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
// the small [C, S] results are transposed. A causal self-attention runs in blocks of query
// rows, each against the keys it can see only (causal_blocks).
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

// The gradients of a block of query rows starting at row r0 against keys [0, kr.size(-2)):
// dQ of its rows, the dK / dV contributions (still per query head) of its keys. `mask`: the bool
// attention mask of these rows and keys, or undefined.
struct BlockGrads {
  Tensor dq, dk, dv;
};
BlockGrads block_bw(const ops::BackwardArgs& a, const Tensor& q, const Tensor& kr, const Tensor& vr, const Tensor& go,
                    const Tensor& o, const Tensor& mask, int64_t r0) {
  const double scale = a.attrs.get_float("scale");
  Tensor s = mul(matmul(q, transpose(kr, -1, -2)), scale);
  if (a.attrs.get_bool("causal")) {  // key j is masked for query row r0 + i when j > r0 + i
    const Shape fs{q.size(-2), kr.size(-2)};
    s = masked_fill(s, triu(ones(fs, TensorOptions(DType::boolean, q.device())), 1 + r0), -INFINITY);
  }
  if (mask.defined()) s = masked_fill(s, logical_not(mask), -INFINITY);
  const Tensor p = softmax(s, -1);
  // m^T t computed as (t^T m)^T: [..., L, C]^T [..., L, S] -> [..., C, S], transposed.
  auto tmm = [](const Tensor& t, const Tensor& m) { return transpose(matmul(transpose(t, -1, -2), m), -1, -2); };
  BlockGrads b;
  if (a.needs_grad(2)) b.dv = tmm(go, p);
  if (!a.needs_grad(0) && !a.needs_grad(1)) return b;
  const Tensor dp = matmul(go, transpose(vr, -1, -2));
  // dS = P dP - P delta: two products, so that a compiled graph fuses them with the softmax
  // (dP - delta alone would be one more [L, S] pass). In bf16 eager each product rounds; its
  // error (|P dP| / 256) is that of dP itself, a bf16 value already.
  const Tensor delta = sum(mul(go, o), {-1}, true);
  const Tensor ds = sub(mul(p, dp), mul(p, delta));
  if (a.needs_grad(0)) b.dq = mul(matmul(ds, kr), scale);
  if (a.needs_grad(1)) b.dk = mul(tmm(q, ds), scale);
  return b;
}

// acc[..., :n, :] += part (part has n rows), in f32 for bf16 values.
Tensor add_prefix(const Tensor& acc, const Tensor& part) {
  const int64_t n = part.size(-2), total = acc.size(-2);
  const Tensor p = part.dtype() == acc.dtype() ? part : part.to(acc.dtype());
  if (n == total) return add(acc, p);
  return cat({add(narrow(acc, -2, 0, n), p), narrow(acc, -2, n, total - n)}, -2);
}

// Query blocks of a causal self-attention backward: block i (rows [i L/nb, (i+1) L/nb)) only
// sees keys [0, (i+1) L/nb), so the [L, S] work shrinks to (nb + 1) / (2 nb) of the full square.
int64_t causal_blocks(const ops::BackwardArgs& a, int64_t L, int64_t S) {
  if (!a.attrs.get_bool("causal") || a.attrs.get_bool("has_mask") || L != S) return 1;
  return L >= 64 && L % 4 == 0 ? 4 : 1;
}

void sdpa_bw(const ops::BackwardArgs& a, std::span<Tensor> g) {
  const Tensor &q = a.inputs[0], &k = a.inputs[1], &v = a.inputs[2], &go = a.grad_outputs[0], &o = a.outputs[0];
  const int n = q.dim();
  const int64_t grp = n >= 3 ? q.size(-3) / k.size(-3) : 1;
  const Tensor kr = repeat_heads(k, grp), vr = repeat_heads(v, grp);
  const int64_t L = q.size(-2), S = k.size(-2), nb = causal_blocks(a, L, S);
  if (nb == 1) {
    const BlockGrads b = block_bw(a, q, kr, vr, go, o, a.attrs.get_bool("has_mask") ? a.inputs[3] : Tensor(), 0);
    if (a.needs_grad(0)) g[0] = b.dq;
    if (a.needs_grad(1)) g[1] = sum_heads(b.dk, grp);
    if (a.needs_grad(2)) g[2] = sum_heads(b.dv, grp);
    return;
  }
  // Last block first: it covers every key, so its dK / dV start the (f32 for bf16) sums.
  const int64_t rows = L / nb;
  const DType acc_t = q.dtype() == DType::bf16 ? DType::f32 : q.dtype();
  std::vector<Tensor> dq(static_cast<size_t>(nb));
  Tensor dk, dv;
  for (int64_t i = nb - 1; i >= 0; --i) {
    const int64_t r0 = i * rows, keys = r0 + rows;
    const BlockGrads b = block_bw(a, narrow(q, -2, r0, rows), narrow(kr, -2, 0, keys), narrow(vr, -2, 0, keys),
                                  narrow(go, -2, r0, rows), narrow(o, -2, r0, rows), Tensor(), r0);
    dq[static_cast<size_t>(i)] = b.dq;
    if (b.dk.defined()) dk = dk.defined() ? add_prefix(dk, b.dk) : b.dk.to(acc_t);
    if (b.dv.defined()) dv = dv.defined() ? add_prefix(dv, b.dv) : b.dv.to(acc_t);
  }
  if (a.needs_grad(0)) g[0] = cat(dq, -2);
  if (a.needs_grad(1)) g[1] = sum_heads(dk.to(q.dtype()), grp);
  if (a.needs_grad(2)) g[2] = sum_heads(dv.to(q.dtype()), grp);
}

[[maybe_unused]] const bool g_registered = [] {
  // Saves q, k, v and the mask (inputs 0-3) and the output.
  ops::set_backward("scaled_dot_product_attention", ops::BackwardDef{&sdpa_bw, 0xFu, 1u, nullptr});
  return true;
}();

}  // namespace
}  // namespace tpu
