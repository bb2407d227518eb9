// rotary_embedding: RoPE as in Hugging Face's apply_rotary_pos_emb, one op:
//   out = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])
// x [..., D] with D even; cos and sin broadcast to x's shape (typically [T, D] against
// [..., T, D]); all three of one float dtype. The cpu kernel walks x's rows (any strides) in
// f32 and rounds once. The backward formula uses rotate_half's transpose, -rotate_half:
//   dx = g cos - rotate_half(g sin),  dcos = g x,  dsin = g rotate_half(x)
// (the engine sums dcos / dsin over their broadcast dims).
#include <vector>

#include "ops/cpu/kernels/half_convert.h"
#include "ops/cpu/loops.h"
#include "ops/meta_util.h"
#include "ops/reduce_engine.h"
#include "ops/registry.h"
#include "ops/rotary.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;
using reduce::DimGroup;

constexpr const char* kOp = "rotary_embedding";

void rotary_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  rotary_check(kOp, x, a.inputs[1], a.inputs[2]);
  m.out() = {x.shape(), x.dtype(), x.device()};
}

// Strides of t broadcast against `shape` (0 where it broadcasts), as a group over all but the
// last dim, and the stride of the last dim.
DimGroup rows_of(const Tensor& t, const Shape& shape, int64_t& last_stride) {
  const int n = shape.ndim(), off = n - t.dim();
  auto st = [&](int d) { return d >= off && t.shape()[d - off] != 1 ? t.strides()[d - off] : 0; };
  DimGroup g;
  for (int d = 0; d + 1 < n; ++d) g.add(shape[d], st(d));
  last_stride = st(n - 1);
  return g;
}

}  // namespace

namespace ops {
void rotary_check(const char* op, const Tensor& x, const Tensor& c, const Tensor& s) {
  TPU_CHECK(is_floating(x.dtype()) && c.dtype() == x.dtype() && s.dtype() == x.dtype(),
            "{}: x, cos and sin must have one floating dtype, got x {}, cos {}, sin {}", op, describe(x), describe(c),
            describe(s));
  TPU_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "{}: x must be [..., D] with an even D, got shape {}", op,
            x.shape().str());
  for (const Tensor* t : {&c, &s}) {
    bool ok = t->dim() <= x.dim();
    for (int i = 0; ok && i < t->dim(); ++i) {
      const int64_t d = t->shape()[i], want = x.shape()[x.dim() - t->dim() + i];
      ok = d == want || d == 1;
    }
    TPU_CHECK(ok, "{}: cos/sin of shape {} do not broadcast to x's shape {}", op, t->shape().str(), x.shape().str());
  }
}

void rotary_rows(const Tensor& x, const Tensor& c, const Tensor& s, const Tensor& out) {
  if (out.numel() == 0) return;
  const Shape& shape = x.shape();
  const int64_t D = shape[shape.ndim() - 1], h = D / 2, rows = out.numel() / D;
  int64_t xs = 0, cs = 0, ss = 0;
  const DimGroup xr = rows_of(x, shape, xs), cr = rows_of(c, shape, cs), sr = rows_of(s, shape, ss);
  dispatch_dtype(x.dtype(), [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      const T* xp = static_cast<const T*>(x.raw_data());
      const T* cp = static_cast<const T*>(c.raw_data());
      const T* sp = static_cast<const T*>(s.raw_data());
      T* op = static_cast<T*>(out.raw_data());
      parallel_for(0, rows, std::max<int64_t>(1, cpu::kParallelGrain / D), [&](int64_t r0, int64_t r1) {
        std::vector<float> buf(static_cast<size_t>(4 * D));
        float *vb = buf.data(), *cv = vb + D, *sv = cv + D, *yb = sv + D;
        constexpr int64_t es = int64_t{sizeof(T)};
        // cos / sin rows usually broadcast over the heads: converted again only when they change.
        int64_t c_at = -1, s_at = -1;
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t co = cr.offset_of(r), so = sr.offset_of(r);
          if (co != c_at) kernels::load_run_f32<T>(reinterpret_cast<const char*>(cp + co), cs * es, D, cv), c_at = co;
          if (so != s_at) kernels::load_run_f32<T>(reinterpret_cast<const char*>(sp + so), ss * es, D, sv), s_at = so;
          // f32 rows in place (x read, out written directly), other dtypes through f32 buffers.
          const float* v = vb;
          float* y = yb;
          if constexpr (std::is_same_v<T, float>) {
            if (xs == 1) v = xp + xr.offset_of(r);
            y = op + r * D;
          }
          if (v == vb) kernels::load_run_f32<T>(reinterpret_cast<const char*>(xp + xr.offset_of(r)), xs * es, D, vb);
          for (int64_t j = 0; j < h; ++j) y[j] = v[j] * cv[j] + -v[j + h] * sv[j];
          for (int64_t j = h; j < D; ++j) y[j] = v[j] * cv[j] + v[j - h] * sv[j];
          if (y == yb) kernels::store_run_f32<T>(reinterpret_cast<char*>(op + r * D), es, D, yb);
        }
      });
    }
  });
}

}  // namespace ops

namespace {
void rotary_cpu(const KernelArgs& a) { rotary_rows(a.inputs[0], a.inputs[1], a.inputs[2], a.outputs[0]); }

TPU_DEFINE_OP(rotary_op, {.name = "rotary_embedding", .num_inputs = 3, .meta = &rotary_meta, .cpu = &rotary_cpu,
                          .doc = "x cos + rotate_half(x) sin (RoPE); cos/sin broadcast to x"});

// rotate_half and its transpose (-rotate_half) with public ops.
Tensor rotate_half(const Tensor& y) {
  const int64_t h = y.size(-1) / 2;
  return cat({neg(narrow(y, -1, h, h)), narrow(y, -1, 0, h)}, -1);
}

void rotary_bw(const BackwardArgs& a, std::span<Tensor> g) {
  const Tensor &x = a.inputs[0], &c = a.inputs[1], &s = a.inputs[2], &go = a.grad_outputs[0];
  if (a.needs_grad(0)) g[0] = sub(mul(go, c), rotate_half(mul(go, s)));
  if (a.needs_grad(1)) g[1] = mul(go, x);
  if (a.needs_grad(2)) g[2] = mul(go, rotate_half(x));
}

[[maybe_unused]] const bool g_backward = [] {
  set_backward("rotary_embedding", BackwardDef{&rotary_bw, 7u, 0u, nullptr});
  return true;
}();

}  // namespace

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  return ops::call(rotary_op(), {x, cos, sin});
}

}  // namespace tpu
