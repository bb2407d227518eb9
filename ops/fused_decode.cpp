// Fused ops of the decoder step (as the fused kernels of serving runtimes): each computes what an
// op chain computes, with the chain's roundings, in one pass and one call.
//   silu_mul(g, u)                   = silu(g) * u (the gated MLP's product; silu(g) rounded to the
//                                      dtype before the product, as the chain stores it)
//   add_rms_norm(x, r, w, eps)       -> (h = x + r, rms_norm(h, [n], w, eps)) over the last dim n,
//                                      the norm reading h as rounded to the dtype
//   rotary_embedding_qk(q, k, cos, sin) -> (rotary_embedding(q, cos, sin), rotary_embedding(k, cos, sin))
// g, u (x, r) of one floating dtype and one shape, any strides; w of [n], any dtype. Results are
// bit for bit those of the chains on the cpu (same f32 math and order, same roundings). Other
// devices run the cpu kernels through the host fallback. Each has a derivative formula in terms
// of other ops (below). nn's decoder layers call them only for eager cpu tensors outside tracing
// and autograd, else the chains (which the compiled and chip paths know how to fuse).
#include <array>
#include <cfloat>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "ops/cpu/kernels/half_convert.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "ops/rotary.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;

void check_pair(const char* op, const char* na, const Tensor& a, const char* nb, const Tensor& b) {
  TPU_CHECK(is_floating(a.dtype()) && a.dtype() == b.dtype(), "{}: {} and {} must have one floating dtype, got {} and {}",
            op, na, nb, describe(a), describe(b));
  TPU_CHECK(a.shape() == b.shape(), "{}: {} and {} must have the same shape (no broadcasting), got {} and {}", op, na,
            nb, a.shape().str(), b.shape().str());
}

// ---- silu_mul ----
void silu_mul_meta(const MetaArgs& a, MetaResult& m) {
  check_pair("silu_mul", "gate", a.inputs[0], "up", a.inputs[1]);
  m.out() = {a.inputs[0].shape(), a.inputs[0].dtype(), a.inputs[0].device()};
}

void silu_mul_cpu(const KernelArgs& a) {
  const Tensor &g = a.inputs[0], &u = a.inputs[1], &out = a.outputs[0];
  if (out.numel() == 0) return;
  const cpu::VecUnaryFn silu = cpu::vec_math().get(cpu::VecUnary::silu);
  dispatch_dtype(out.dtype(), [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      std::array<char*, 3> base{cpu::byte_ptr(out), cpu::byte_ptr(g), cpu::byte_ptr(u)};
      std::array<Shape, 3> st{cpu::broadcast_byte_strides(out, out.shape()), cpu::broadcast_byte_strides(g, out.shape()),
                              cpu::broadcast_byte_strides(u, out.shape())};
      // silu is transcendental work: split over threads only past 64K elements (below, a pool
      // wake-up costs more than it saves).
      cpu::for_each_run<3>(out.shape(), base, st, [&](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t len) {
        if constexpr (std::is_same_v<T, float>) {
          if (s[0] == 4 && s[1] == 4 && s[2] == 4) {  // dense f32: in place in the output
            float* o = reinterpret_cast<float*>(p[0]);
            const float* uv = reinterpret_cast<const float*>(p[2]);
            silu(o, reinterpret_cast<const float*>(p[1]), len);
            for (int64_t i = 0; i < len; ++i) o[i] *= uv[i];
            return;
          }
        }
        constexpr int64_t kBlock = 256;
        float gb[kBlock], ub[kBlock];
        for (int64_t j = 0; j < len; j += kBlock) {
          const int64_t m = std::min(kBlock, len - j);
          kernels::load_run_f32<T>(p[1] + j * s[1], s[1], m, gb);
          silu(gb, gb, m);
          if constexpr (!std::is_same_v<T, float>) {  // the chain stores silu(g) in T
            T r[kBlock];
            kernels::store_run_f32<T>(reinterpret_cast<char*>(r), int64_t{sizeof(T)}, m, gb);
            kernels::load_run_f32<T>(reinterpret_cast<const char*>(r), int64_t{sizeof(T)}, m, gb);
          }
          kernels::load_run_f32<T>(p[2] + j * s[2], s[2], m, ub);
          for (int64_t i = 0; i < m; ++i) gb[i] *= ub[i];
          kernels::store_run_f32<T>(p[0] + j * s[0], s[0], m, gb);
        }
      }, int64_t{1} << 16);
    }
  });
}

// ---- add_rms_norm ----
void add_rms_norm_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor &x = a.inputs[0], &r = a.inputs[1], &w = a.inputs[2];
  check_pair("add_rms_norm", "x", x, "residual", r);
  TPU_CHECK(x.dim() >= 1, "add_rms_norm: x must have at least one dim, got a 0-d tensor");
  TPU_CHECK(w.dim() == 1 && w.size(0) == x.size(-1) && w.dtype() != DType::boolean,
            "add_rms_norm: weight must be numeric of shape [{}] (x's last dim), got {}", x.size(-1), describe(w));
  TPU_CHECK(std::isfinite(a.attrs.get_float("eps")), "add_rms_norm: eps must be finite, got {}", a.attrs.get_float("eps"));
  m.num_outputs = 2;
  m.out(0) = {x.shape(), x.dtype(), x.device()};
  m.out(1) = {x.shape(), x.dtype(), x.device()};
}

// rms_norm's row math (ops/norm.cpp) from src into dst (may be the same): the mean square in 16
// f32 lanes summed in double, then x * r * w in f32.
void rms_row(const float* src, float* dst, int64_t n, const float* w, double eps) {
  constexpr int L = 16;
  float lane[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) {
      const float d = src[i + j] - 0.0f;
      lane[j] += d * d;
    }
  double s = 0;
  for (int j = 0; j < L; ++j) s += lane[j];
  for (; i < n; ++i) s += static_cast<double>(src[i]) * src[i];
  const float r = static_cast<float>(1.0 / std::sqrt(s / static_cast<double>(n) + eps));
  for (int64_t k = 0; k < n; ++k) dst[k] = src[k] * r * w[k];
}

void add_rms_norm_cpu(const KernelArgs& a) {
  const Tensor &x = a.inputs[0], &res = a.inputs[1], &w = a.inputs[2];
  const Tensor &sum = a.outputs[0], &out = a.outputs[1];
  const int64_t n = x.size(-1);
  if (x.numel() == 0 || n == 0) return;
  const double eps = a.attrs.get_float("eps");
  std::vector<float> wf;
  const float* wp = nullptr;
  if (w.dtype() == DType::f32 && w.is_contiguous()) {
    wp = w.data<float>();
  } else {
    wf.resize(static_cast<size_t>(n));
    dispatch_dtype(w.dtype(), [&](auto z) {
      using W = decltype(z);
      if constexpr (!std::is_same_v<W, bool>) {
        const W* p = static_cast<const W*>(w.raw_data());
        for (int64_t i = 0; i < n; ++i) wf[static_cast<size_t>(i)] = cpu::convert<float>(p[i * w.strides()[0]]);
      }
    });
    wp = wf.data();
  }
  const int64_t rows = x.numel() / n;
  // Row r's start in x / res: its index over the leading dims.
  auto row_off = [&](const Tensor& t, int64_t r) {
    int64_t off = 0;
    for (int d = t.dim() - 2; d >= 0; --d) {
      off += (r % t.shape()[d]) * t.strides()[d];
      r /= t.shape()[d];
    }
    return off;
  };
  dispatch_dtype(x.dtype(), [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      constexpr int64_t es = int64_t{sizeof(T)};
      const T* xp = static_cast<const T*>(x.raw_data());
      const T* rp = static_cast<const T*>(res.raw_data());
      T* sp = static_cast<T*>(sum.raw_data());
      T* op = static_cast<T*>(out.raw_data());
      const int64_t xs = x.strides()[x.dim() - 1], rs = res.strides()[res.dim() - 1];
      parallel_for(0, rows, std::max<int64_t>(1, cpu::kParallelGrain / n), [&](int64_t r0, int64_t r1) {
        std::vector<float> hb, rb;  // f32 rows of other dtypes or strides
        for (int64_t r = r0; r < r1; ++r) {
          if constexpr (std::is_same_v<T, float>) {
            if (xs == 1 && rs == 1) {  // f32 rows in place: the sum into its output, the norm from there
              const float* xr = xp + row_off(x, r);
              const float* rr = rp + row_off(res, r);
              float* hr = sp + r * n;
              for (int64_t i = 0; i < n; ++i) hr[i] = xr[i] + rr[i];
              rms_row(hr, op + r * n, n, wp, eps);
              continue;
            }
          }
          hb.resize(static_cast<size_t>(n));
          rb.resize(static_cast<size_t>(n));
          kernels::load_run_f32<T>(reinterpret_cast<const char*>(xp + row_off(x, r)), xs * es, n, hb.data());
          kernels::load_run_f32<T>(reinterpret_cast<const char*>(rp + row_off(res, r)), rs * es, n, rb.data());
          for (int64_t i = 0; i < n; ++i) hb[static_cast<size_t>(i)] += rb[static_cast<size_t>(i)];
          kernels::store_run_f32<T>(reinterpret_cast<char*>(sp + r * n), es, n, hb.data());
          // The norm reads the sum as stored (rounded to T), as rms_norm(add(x, r)) does.
          if constexpr (!std::is_same_v<T, float>)
            kernels::load_run_f32<T>(reinterpret_cast<const char*>(sp + r * n), es, n, hb.data());
          rms_row(hb.data(), hb.data(), n, wp, eps);
          kernels::store_run_f32<T>(reinterpret_cast<char*>(op + r * n), es, n, hb.data());
        }
      });
    }
  });
}

// ---- rotary_embedding_qk: the query and key heads rotated by the same tables in one call ----
void rotary_qk_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor &q = a.inputs[0], &k = a.inputs[1], &c = a.inputs[2], &s = a.inputs[3];
  rotary_check("rotary_embedding_qk", q, c, s);
  rotary_check("rotary_embedding_qk", k, c, s);
  m.num_outputs = 2;
  m.out(0) = {q.shape(), q.dtype(), q.device()};
  m.out(1) = {k.shape(), k.dtype(), k.device()};
}

void rotary_qk_cpu(const KernelArgs& a) {
  rotary_rows(a.inputs[0], a.inputs[2], a.inputs[3], a.outputs[0]);
  rotary_rows(a.inputs[1], a.inputs[2], a.inputs[3], a.outputs[1]);
}

TPU_DEFINE_OP(rotary_qk_op, {.name = "rotary_embedding_qk", .num_inputs = 4, .meta = &rotary_qk_meta,
                             .cpu = &rotary_qk_cpu,
                             .doc = "(rotary_embedding(q, cos, sin), rotary_embedding(k, cos, sin)) in one call"});
TPU_DEFINE_OP(silu_mul_op, {.name = "silu_mul", .num_inputs = 2, .meta = &silu_mul_meta, .cpu = &silu_mul_cpu,
                            .doc = "silu(gate) * up in one pass (silu rounded to the dtype first, as the chain)"});
TPU_DEFINE_OP(add_rms_norm_op, {.name = "add_rms_norm", .num_inputs = 3, .meta = &add_rms_norm_meta,
                                .cpu = &add_rms_norm_cpu,
                                .doc = "(x + residual, rms_norm(x + residual) * weight) over the last dim, in one "
                                       "pass; inputs (x, residual, weight), attr eps"});

// ---- derivative formulas, in terms of other ops (so they run on any device and trace) ----
// A gradient of a broadcast input summed back to its shape.
Tensor reduce_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int lead = g.dim() - shape.ndim();
  std::vector<int64_t> dims;
  for (int i = 0; i < g.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.size(i) != 1)) dims.push_back(i);
  return reshape(sum(g, dims, true), shape);
}

// d silu(g) u: dg = go u silu'(g), silu'(g) = s + g s (1 - s) with s = sigmoid(g); du = go silu(g).
void silu_mul_bw(const BackwardArgs& a, std::span<Tensor> g) {
  const Tensor &x = a.inputs[0], &u = a.inputs[1], &go = a.grad_outputs[0];
  const Tensor s = sigmoid(x), xs = mul(x, s);
  if (a.needs_grad(0)) g[0] = mul(mul(go, u), add(s, sub(xs, mul(xs, s))));
  if (a.needs_grad(1)) g[1] = mul(go, xs);
}

// h = x + r, y = h rinv w with rinv = 1 / sqrt(mean(h^2) + eps) over the last dim:
//   dh = go_h + rinv (go_y w) - h rinv^3 mean((go_y w) h),  dx = dr = dh,  dw = sum(go_y h rinv).
void add_rms_norm_bw(const BackwardArgs& a, std::span<Tensor> g) {
  const Tensor &w = a.inputs[2], &h = a.outputs[0], &go_h = a.grad_outputs[0], &go_y = a.grad_outputs[1];
  Tensor dh = go_h, dw;
  if (go_y.defined()) {
    const Tensor rinv = rsqrt(add(mean(mul(h, h), {-1}, true), a.attrs.get_float("eps")));
    const Tensor gw = mul(go_y, w);
    const Tensor dy = sub(mul(gw, rinv), mul(h, mul(mul(rinv, mul(rinv, rinv)), mean(mul(gw, h), {-1}, true))));
    dh = dh.defined() ? add(dh, dy) : dy;
    if (a.needs_grad(2)) dw = reduce_to(mul(go_y, mul(h, rinv)), w.shape());
  }
  if (!dh.defined()) dh = zeros_like(h);
  if (a.needs_grad(0)) g[0] = to(dh, a.input_meta[0].dtype);
  if (a.needs_grad(1)) g[1] = to(dh, a.input_meta[1].dtype);
  if (a.needs_grad(2)) g[2] = to(dw.defined() ? dw : zeros_like(w), a.input_meta[2].dtype);
}

// rotary_embedding's formula for each of q and k (rotate_half's transpose is -rotate_half);
// the tables' gradients summed over both and back to the tables' shapes.
Tensor rotate_half_of(const Tensor& y) {
  const int64_t half = y.size(-1) / 2;
  return cat({neg(narrow(y, -1, half, half)), narrow(y, -1, 0, half)}, -1);
}
void rotary_qk_bw(const BackwardArgs& a, std::span<Tensor> g) {
  const Tensor &q = a.inputs[0], &k = a.inputs[1], &c = a.inputs[2], &s = a.inputs[3];
  const Tensor* go[2] = {&a.grad_outputs[0], &a.grad_outputs[1]};
  const Tensor* x[2] = {&q, &k};
  Tensor dc, ds;
  for (int i = 0; i < 2; ++i) {
    const Tensor& gi = *go[i];
    if (!gi.defined()) {
      if (a.needs_grad(static_cast<size_t>(i))) g[static_cast<size_t>(i)] = zeros_like(*x[i]);
      continue;
    }
    if (a.needs_grad(static_cast<size_t>(i))) g[static_cast<size_t>(i)] = sub(mul(gi, c), rotate_half_of(mul(gi, s)));
    if (a.needs_grad(2)) {
      const Tensor d = reduce_to(mul(gi, *x[i]), c.shape());
      dc = dc.defined() ? add(dc, d) : d;
    }
    if (a.needs_grad(3)) {
      const Tensor d = reduce_to(mul(gi, rotate_half_of(*x[i])), s.shape());
      ds = ds.defined() ? add(ds, d) : d;
    }
  }
  if (a.needs_grad(2)) g[2] = dc.defined() ? dc : zeros_like(c);
  if (a.needs_grad(3)) g[3] = ds.defined() ? ds : zeros_like(s);
}

[[maybe_unused]] const bool g_backward = [] {
  set_backward("silu_mul", BackwardDef{&silu_mul_bw, 3u, 0u, nullptr});
  set_backward("add_rms_norm", BackwardDef{&add_rms_norm_bw, 4u, 1u, nullptr});
  set_backward("rotary_embedding_qk", BackwardDef{&rotary_qk_bw, 15u, 0u, nullptr});
  return true;
}();

}  // namespace

Tensor silu_mul(const Tensor& gate, const Tensor& up) { return ops::call(silu_mul_op(), {gate, up}); }

std::pair<Tensor, Tensor> rotary_embedding_qk(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin) {
  TPU_CHECK(q.defined() && k.defined() && cos.defined() && sin.defined(),
            "rotary_embedding_qk: q, k, cos and sin must be defined tensors");
  Tensor outs[ops::kMaxOutputs];
  const Tensor ins[4] = {q, k, cos, sin};
  ops::call(rotary_qk_op(), ins, {}, outs);
  return {std::move(outs[0]), std::move(outs[1])};
}

std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                       std::optional<double> eps) {
  TPU_CHECK(x.defined() && residual.defined() && weight.defined(),
            "add_rms_norm: x, residual and weight must be defined tensors");
  Tensor outs[ops::kMaxOutputs];
  const Tensor ins[3] = {x, residual, weight};
  ops::call(add_rms_norm_op(), ins, {{"eps", eps.value_or(static_cast<double>(FLT_EPSILON))}}, outs);
  return {std::move(outs[0]), std::move(outs[1])};
}

}  // namespace tpu
