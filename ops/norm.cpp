// layer_norm and rms_norm over the trailing dims given by normalized_shape.
//
// Registration: the op registry has fixed arities, so the optional affine parameters are
// always passed as inputs and flagged by attrs: `layer_norm` takes (x, weight, bias) with
// has_weight / has_bias, `rms_norm` takes (x, weight) with has_weight. An absent parameter
// is passed as x itself (no allocation; the kernel never reads it). Weight and bias may be
// of any dtype and layout: read in place when contiguous f32, else converted to f32 once per
// call. Each row is read once into an f32 buffer, its statistics computed there in f32 lanes,
// and written once; rows are split over the thread pool. The variance is the biased one
// (divide by N), as PyTorch.
#include <cfloat>
#include <cmath>
#include <vector>

#include "ops/cpu/kernels/half_convert.h"
#include "ops/cpu/loops.h"
#include "ops/meta_util.h"
#include "ops/reduce_common.h"
#include "ops/reduce_engine.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;

using reduce::to_f;

// Checks x against normalized_shape and a present weight/bias against it.
void check_norm_args(const MetaArgs& a, int num_params) {
  const Tensor& x = a.inputs[0];
  const char* op = a.op.name.c_str();
  const Shape ns(a.attrs.get_ints("normalized_shape"));
  TPU_CHECK(is_floating(x.dtype()), "{}: expected a floating point input, got {} (shape {})", op,
            dtype_name(x.dtype()), x.shape().str());
  TPU_CHECK(ns.ndim() >= 1, "{}: normalized_shape must have at least one dim, got {}", op, ns.str());
  bool match = ns.ndim() <= x.dim();
  for (int i = 0; match && i < ns.ndim(); ++i) match = x.shape()[x.dim() - ns.ndim() + i] == ns[i];
  TPU_CHECK(match, "{}: normalized_shape {} does not match the trailing dims of the input of shape {}", op, ns.str(),
            x.shape().str());
  const char* names[2] = {"weight", "bias"};
  const char* flags[2] = {"has_weight", "has_bias"};
  for (int p = 0; p < num_params; ++p) {
    if (!a.attrs.get_bool(flags[p])) continue;
    const Tensor& w = a.inputs[static_cast<size_t>(p + 1)];
    TPU_CHECK(w.shape() == ns, "{}: {} of shape {} does not match normalized_shape {} (input shape {})", op, names[p],
              w.shape().str(), ns.str(), x.shape().str());
    TPU_CHECK(w.dtype() != DType::boolean, "{}: {} must be numeric, got bool", op, names[p]);
  }
}

void layer_norm_meta(const MetaArgs& a, MetaResult& m) {
  check_norm_args(a, 2);
  m.out() = {a.inputs[0].shape(), a.inputs[0].dtype(), a.inputs[0].device()};
}
void rms_norm_meta(const MetaArgs& a, MetaResult& m) {
  check_norm_args(a, 1);
  m.out() = {a.inputs[0].shape(), a.inputs[0].dtype(), a.inputs[0].device()};
}

// A parameter's elements as contiguous f32 (null when absent): read in place when it is
// contiguous f32 already, else converted into `store`.
const float* param_f32(const Tensor& p, bool present, std::vector<float>& store) {
  if (!present) return nullptr;
  if (p.dtype() == DType::f32 && p.is_contiguous()) return p.data<float>();
  Tensor f = empty_tensor(p.shape(), DType::f32, Device());
  dispatch_dtype(p.dtype(), [&](auto z) {
    using T = decltype(z);
    cpu::unary_map<float, T>(f, p, [](T x) { return cpu::convert<float>(x); });
  });
  store.assign(f.data<float>(), f.data<float>() + f.numel());
  return store.data();
}

// Runs fn(buf, n) on every row of x (the trailing n elements) as f32 and stores buf into out.
template <class Fn>
void for_each_row(const Tensor& x, const Tensor& out, int norm_dims, Fn fn) {
  const int64_t n = Shape(std::vector<int64_t>(x.shape().end() - norm_dims, x.shape().end())).numel();
  if (x.numel() == 0 || n == 0) return;
  reduce::DimGroup lead, inner;
  for (int i = 0; i < x.dim(); ++i) (i < x.dim() - norm_dims ? lead : inner).add(x.shape()[i], x.strides()[i]);
  const int64_t rows = x.numel() / n;
  dispatch_dtype(x.dtype(), [&](auto zx) {
    using T = decltype(zx);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      const T* src = static_cast<const T*>(x.raw_data());
      T* dst = static_cast<T*>(out.raw_data());
      parallel_for(0, rows, std::max<int64_t>(1, cpu::kParallelGrain / n), [&](int64_t rb, int64_t re) {
        std::vector<float> buf(static_cast<size_t>(n));
        for (int64_t r = rb; r < re; ++r) {
          const T* p = src + lead.offset_of(r);
          if (inner.n == 1 && inner.stride[0] == 1) {
            kernels::load_run_f32<T>(reinterpret_cast<const char*>(p), int64_t{sizeof(T)}, n, buf.data());
          } else {
            int64_t i = 0;
            reduce::visit_runs(inner, 0, n, [&](int64_t off, int64_t len, int64_t s, int64_t) {
              for (int64_t j = 0; j < len; ++j) buf[i++] = to_f(p[off + j * s]);
            });
          }
          fn(buf.data(), n);
          kernels::store_run_f32<T>(reinterpret_cast<char*>(dst + r * n), int64_t{sizeof(T)}, n, buf.data());
        }
      });
    }
  });
}

constexpr int L = 16;

inline double lane_sum(const float* buf, int64_t n) {
  float lane[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) lane[j] += buf[i + j];
  double s = 0;
  for (int j = 0; j < L; ++j) s += lane[j];
  for (; i < n; ++i) s += buf[i];
  return s;
}
inline double lane_sum_sq(const float* buf, int64_t n, float shift) {
  float lane[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) {
      const float d = buf[i + j] - shift;
      lane[j] += d * d;
    }
  double s = 0;
  for (int j = 0; j < L; ++j) s += lane[j];
  for (; i < n; ++i) s += static_cast<double>(buf[i] - shift) * (buf[i] - shift);
  return s;
}

void layer_norm_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const int nd = static_cast<int>(a.attrs.get_ints("normalized_shape").size());
  const double eps = a.attrs.get_float("eps");
  std::vector<float> ws, bs;
  const float* w = param_f32(a.inputs[1], a.attrs.get_bool("has_weight"), ws);
  const float* b = param_f32(a.inputs[2], a.attrs.get_bool("has_bias"), bs);
  for_each_row(x, a.outputs[0], nd, [&](float* buf, int64_t n) {
    const double mean = lane_sum(buf, n) / static_cast<double>(n);
    const double var = lane_sum_sq(buf, n, static_cast<float>(mean)) / static_cast<double>(n);
    const float mu = static_cast<float>(mean);
    const float rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
    if (w && b) {
      for (int64_t i = 0; i < n; ++i) buf[i] = (buf[i] - mu) * rstd * w[i] + b[i];
    } else if (w) {
      for (int64_t i = 0; i < n; ++i) buf[i] = (buf[i] - mu) * rstd * w[i];
    } else if (b) {
      for (int64_t i = 0; i < n; ++i) buf[i] = (buf[i] - mu) * rstd + b[i];
    } else {
      for (int64_t i = 0; i < n; ++i) buf[i] = (buf[i] - mu) * rstd;
    }
  });
}

void rms_norm_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const int nd = static_cast<int>(a.attrs.get_ints("normalized_shape").size());
  const double eps = a.attrs.get_float("eps");
  std::vector<float> ws;
  const float* w = param_f32(a.inputs[1], a.attrs.get_bool("has_weight"), ws);
  for_each_row(x, a.outputs[0], nd, [&](float* buf, int64_t n) {
    const double ms = lane_sum_sq(buf, n, 0.0f) / static_cast<double>(n);
    const float r = static_cast<float>(1.0 / std::sqrt(ms + eps));
    if (w) {
      for (int64_t i = 0; i < n; ++i) buf[i] = buf[i] * r * w[i];
    } else {
      for (int64_t i = 0; i < n; ++i) buf[i] *= r;
    }
  });
}

TPU_DEFINE_OP(layer_norm_op, {.name = "layer_norm", .num_inputs = 3, .meta = &layer_norm_meta,
                              .cpu = &layer_norm_cpu,
                              .doc = "(x - mean) / sqrt(var + eps) * weight + bias over the trailing dims; "
                                     "inputs (x, weight, bias), absent ones passed as x with has_weight/has_bias "
                                     "false"});
TPU_DEFINE_OP(rms_norm_op, {.name = "rms_norm", .num_inputs = 2, .meta = &rms_norm_meta, .cpu = &rms_norm_cpu,
                            .doc = "x / sqrt(mean(x^2) + eps) * weight over the trailing dims; inputs (x, weight), "
                                   "an absent weight passed as x with has_weight false"});

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  const bool hw = weight.defined(), hb = bias.defined();
  return ops::call(layer_norm_op(), {x, hw ? weight : x, hb ? bias : x},
                   {{"normalized_shape", normalized_shape.vec()}, {"eps", eps}, {"has_weight", hw}, {"has_bias", hb}});
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, std::optional<double> eps) {
  const bool hw = weight.defined();
  // Default eps: the f32 machine epsilon (what PyTorch uses for f32 and its f32 op-math).
  const double e = eps.value_or(static_cast<double>(FLT_EPSILON));
  return ops::call(rms_norm_op(), {x, hw ? weight : x},
                   {{"normalized_shape", normalized_shape.vec()}, {"eps", e}, {"has_weight", hw}});
}

}  // namespace tpu
