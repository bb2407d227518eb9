// Statistical reductions: var and std (with Bessel-style correction) and logsumexp.
// Both work on blocks of at most kBlock elements: a block's own statistic is computed in two
// cheap passes (the block stays in L1), then blocks are merged with exact formulas (Chan's
// for the variance, rescaled sums for logsumexp), so accuracy does not depend on length and
// the parts computed by different threads merge the same way.
#include <cmath>
#include <limits>

#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
#include "ops/reduce_common.h"
#include "ops/reduce_engine.h"
#include "ops/reduce_vec.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;
using reduce::attr_dims;
using reduce::attr_reduced_shape;

constexpr int64_t kBlock = 1024;

using reduce::to_f;

// Copies len elements (stride s) as floats into buf and zero-pads it to a multiple of 16.
template <class T>
inline void gather_block(float* buf, const T* p, int64_t len, int64_t s) {
  if (s == 1) {
    for (int64_t i = 0; i < len; ++i) buf[i] = to_f(p[i]);
  } else {
    for (int64_t i = 0; i < len; ++i) buf[i] = to_f(p[i * s]);
  }
  for (int64_t i = len; i % 16 != 0; ++i) buf[i] = 0.0f;
}

template <class T>
struct VarR {
  struct Acc {
    double n = 0, mean = 0, m2 = 0;
  };
  static Acc init() { return {}; }
  static void run(Acc& a, const T* p, int64_t n, int64_t s, int64_t) {
    constexpr int L = 16;
    float buf[kBlock];
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t len = std::min(n - b, kBlock);
      gather_block(buf, p + b * s, len, s);
      float lane[L] = {};
      for (int64_t i = 0; i < len; i += L)
        for (int j = 0; j < L; ++j) lane[j] += buf[i + j];
      float sum = 0;
      for (int j = 0; j < L; ++j) sum += lane[j];
      Acc blk;
      blk.n = static_cast<double>(len);
      blk.mean = static_cast<double>(sum) / blk.n;
      const float mu = static_cast<float>(blk.mean);
      for (int j = 0; j < L; ++j) lane[j] = 0;
      int64_t i = 0;
      for (; i + L <= len; i += L)
        for (int j = 0; j < L; ++j) {
          const float d = buf[i + j] - mu;
          lane[j] += d * d;
        }
      double m2 = 0;
      for (int j = 0; j < L; ++j) m2 += lane[j];
      for (; i < len; ++i) m2 += static_cast<double>(buf[i] - mu) * (buf[i] - mu);
      blk.m2 = m2;
      merge(a, blk);
    }
  }
  static void merge(Acc& l, const Acc& r) {
    if (r.n == 0) return;
    if (l.n == 0) {
      l = r;
      return;
    }
    const double n = l.n + r.n, delta = r.mean - l.mean;
    l.mean += delta * (r.n / n);
    l.m2 += r.m2 + delta * delta * (l.n * r.n / n);
    l.n = n;
  }
};

// Running (max, sum of exp(x - max)); NaN anywhere poisons the result.
template <class T>
struct LseR {
  struct Acc {
    double m = -std::numeric_limits<double>::infinity();
    double s = 0;
    bool nan = false;
  };
  static Acc init() { return {}; }
  static void run(Acc& a, const T* p, int64_t n, int64_t st, int64_t) {
    constexpr int L = 16;
    float buf[kBlock];
    const cpu::VecUnaryFn exp_fn = cpu::vec_math().get(cpu::VecUnary::exp);
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t len = std::min(n - b, kBlock);
      gather_block(buf, p + b * st, len, st);
      float lane[L];
      const float bm = reduce::extremum_f32<true>(buf, len, -std::numeric_limits<float>::infinity());
      const bool nan = bm != bm;
      Acc blk;
      blk.nan = nan;
      blk.m = bm;
      if (std::isfinite(bm)) {
        for (int64_t i = 0; i < len; ++i) buf[i] -= bm;
        exp_fn(buf, buf, len);
        double s = 0;
        for (int j = 0; j < L; ++j) lane[j] = 0;
        int64_t i = 0;
        for (; i + L <= len; i += L)
          for (int j = 0; j < L; ++j) lane[j] += buf[i + j];
        for (int j = 0; j < L; ++j) s += lane[j];
        for (; i < len; ++i) s += buf[i];
        blk.s = s;
      } else if (bm > 0) {
        blk.s = 1;  // +inf dominates
      }
      merge(a, blk);
    }
  }
  static void merge(Acc& l, const Acc& r) {
    l.nan |= r.nan;
    if (r.s == 0) return;  // all -inf (or empty)
    if (l.s == 0) {
      l.m = r.m;
      l.s = r.s;
      return;
    }
    if (std::isinf(l.m) || std::isinf(r.m)) {  // +inf
      l.m = std::numeric_limits<double>::infinity();
      l.s = 1;
      return;
    }
    const double m = std::max(l.m, r.m);
    l.s = l.s * std::exp(l.m - m) + r.s * std::exp(r.m - m);
    l.m = m;
  }
  static double finish(const Acc& a) {
    if (a.nan) return std::numeric_limits<double>::quiet_NaN();
    if (a.s == 0) return -std::numeric_limits<double>::infinity();
    if (std::isinf(a.m)) return a.m;
    return a.m + std::log(a.s);
  }
};

using reduce::is_float_v;

// ---- var / std ----
void var_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  TPU_CHECK(is_floating(x.dtype()), "{}: expected a floating point input, got {} (shape {})", a.op.name,
            dtype_name(x.dtype()), x.shape().str());
  m.out() = {attr_reduced_shape(x, a.attrs, a.op.name), x.dtype(), x.device()};
}
template <bool kStd>
void var_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const auto dims = attr_dims(x, a.attrs, a.op.name);
  const double corr = static_cast<double>(a.attrs.get_int("correction"));
  dispatch_dtype(x.dtype(), [&](auto zx) {
    using T = decltype(zx);
    if constexpr (is_float_v<T>) {
      T* o = static_cast<T*>(a.outputs[0].raw_data());
      using Acc = typename VarR<T>::Acc;
      // An empty reduction has n == 0 but still counts its (zero) elements.
      int64_t count = 1;
      for (int d : dims) count *= x.shape()[d];
      const double den = std::max(0.0, static_cast<double>(count) - corr);
      reduce::run_reduce<VarR<T>, T>(x, dims, [&](int64_t i, const Acc& acc) {
        double v = acc.m2 / den;
        if (count == 0) v = std::numeric_limits<double>::quiet_NaN();
        o[i] = cpu::convert<T>(kStd ? std::sqrt(v) : v);
      });
    }
  });
}
TPU_DEFINE_OP(var_op, {.name = "var", .num_inputs = 1, .flags = kReduction, .meta = &var_meta, .cpu = &var_cpu<false>,
                       .doc = "variance over dims: sum((x - mean)^2) / (N - correction)"});
TPU_DEFINE_OP(std_op, {.name = "std", .num_inputs = 1, .flags = kReduction, .meta = &var_meta, .cpu = &var_cpu<true>,
                       .doc = "standard deviation over dims: sqrt(var)"});

// ---- logsumexp ----
void lse_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  const DType out = is_floating(x.dtype()) ? x.dtype() : DType::f32;
  m.cast_mask = 1;
  m.cast_to = out;
  m.out() = {attr_reduced_shape(x, a.attrs, "logsumexp"), out, x.device()};
}
void lse_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const auto dims = attr_dims(x, a.attrs, "logsumexp");
  dispatch_dtype(x.dtype(), [&](auto zx) {
    using T = decltype(zx);
    if constexpr (is_float_v<T>) {
      T* o = static_cast<T*>(a.outputs[0].raw_data());
      using Acc = typename LseR<T>::Acc;
      reduce::run_reduce<LseR<T>, T>(x, dims,
                                     [&](int64_t i, const Acc& acc) { o[i] = cpu::convert<T>(LseR<T>::finish(acc)); });
    }
  });
}
TPU_DEFINE_OP(lse_op, {.name = "logsumexp", .num_inputs = 1, .flags = kReduction, .meta = &lse_meta, .cpu = &lse_cpu,
                       .doc = "log(sum(exp(x))) over dims, computed stably (ints promote to f32)"});

Attrs var_attrs(const Dims& dims, int64_t correction, bool keepdim) {
  return Attrs{{"dims", dims}, {"keepdim", keepdim}, {"correction", correction}};
}

}  // namespace

Tensor var(const Tensor& x, const Dims& dims, int64_t correction, bool keepdim) {
  return ops::call(var_op(), {x}, var_attrs(dims, correction, keepdim));
}
Tensor std(const Tensor& x, const Dims& dims, int64_t correction, bool keepdim) {
  return ops::call(std_op(), {x}, var_attrs(dims, correction, keepdim));
}
Tensor logsumexp(const Tensor& x, const Dims& dims, bool keepdim) {
  return ops::call(lse_op(), {x}, Attrs{{"dims", dims}, {"keepdim", keepdim}});
}

}  // namespace tpu
