// Folding reductions with an identity: sum, mean, prod, all, any (over one, several or all
// dims, with keepdim). Float sums accumulate short runs in f32 lanes and those in doubles; integer and
// bool sums and products accumulate in 64 bits (wrapping) and return i64, as PyTorch's do.
#include <cmath>
#include <cstring>

#include "ops/cpu/loops.h"
#include "ops/reduce_common.h"
#include "ops/reduce_engine.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;
using reduce::attr_dims;
using reduce::attr_reduced_shape;

using reduce::is_float_v;

using reduce::to_f;

// Sum of a contiguous float run: 16 f32 lanes each add 8 consecutive-block terms, then the
// lanes are added into 16 double lanes (so rounding error stays at a few f32 ulps of the
// result whatever the length, at nearly the speed of a plain f32 loop).
template <class T>
double sum_contiguous(const T* p, int64_t n) {
  constexpr int L = 16, kSteps = 8;
  double wide[L] = {};
  int64_t i = 0;
  for (; i + L * kSteps <= n; i += L * kSteps) {
    float lane[L] = {};
    for (int k = 0; k < kSteps; ++k)
      for (int j = 0; j < L; ++j) lane[j] += to_f(p[i + k * L + j]);
    for (int j = 0; j < L; ++j) wide[j] += lane[j];
  }
  double total = 0;
  for (int j = 0; j < L; ++j) total += wide[j];
  for (; i < n; ++i) total += to_f(p[i]);
  return total;
}

// Sum: double for the float types, wrapping 64-bit integers otherwise.
template <class T>
struct SumR {
  static constexpr bool kVertical = true;
  using Acc = std::conditional_t<is_float_v<T>, double, int64_t>;
  static Acc init() { return 0; }
  static void step(Acc& a, T v) {
    if constexpr (is_float_v<T>) a += to_f(v);
    else a = static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(static_cast<int64_t>(v)));
  }
  static void run(Acc& a, const T* p, int64_t n, int64_t s, int64_t) {
    if constexpr (is_float_v<T>) {
      if (s == 1) {
        a += sum_contiguous(p, n);
        return;
      }
    } else if (s == 1) {
      uint64_t lane[8] = {};
      int64_t i = 0;
      for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) lane[j] += static_cast<uint64_t>(static_cast<int64_t>(p[i + j]));
      uint64_t t = static_cast<uint64_t>(a);
      for (int j = 0; j < 8; ++j) t += lane[j];
      for (; i < n; ++i) t += static_cast<uint64_t>(static_cast<int64_t>(p[i]));
      a = static_cast<int64_t>(t);
      return;
    }
    for (int64_t i = 0; i < n; ++i) step(a, p[i * s]);
  }
  static void merge(Acc& l, const Acc& r) {
    if constexpr (is_float_v<T>) l += r;
    else l = static_cast<int64_t>(static_cast<uint64_t>(l) + static_cast<uint64_t>(r));
  }
};

template <class T>
struct ProdR {
  static constexpr bool kVertical = true;
  using Acc = std::conditional_t<is_float_v<T>, double, int64_t>;
  static Acc init() { return 1; }
  static void step(Acc& a, T v) {
    if constexpr (is_float_v<T>) a *= to_f(v);
    else a = static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(static_cast<int64_t>(v)));
  }
  static void run(Acc& a, const T* p, int64_t n, int64_t s, int64_t) {
    for (int64_t i = 0; i < n; ++i) step(a, p[i * s]);
  }
  static void merge(Acc& l, const Acc& r) {
    if constexpr (is_float_v<T>) l *= r;
    else l = static_cast<int64_t>(static_cast<uint64_t>(l) * static_cast<uint64_t>(r));
  }
};

template <class T>
inline bool nonzero(T v) {
  if constexpr (is_float_v<T>) return to_f(v) != 0.0f;
  else return v != 0;
}

template <class T, bool kAll>
struct LogicalR {
  static constexpr bool kVertical = true;
  using Acc = bool;
  static Acc init() { return kAll; }
  static void step(Acc& a, T v) {
    if constexpr (kAll) a = a && nonzero(v);
    else a = a || nonzero(v);
  }
  static void run(Acc& a, const T* p, int64_t n, int64_t s, int64_t) {
    for (int64_t i = 0; i < n && a == kAll; ++i) step(a, p[i * s]);
  }
  static void merge(Acc& l, const Acc& r) { l = kAll ? (l && r) : (l || r); }
};

template <template <class> class R, class T, class O, class Finish>
void reduce_into(const Tensor& x, const std::vector<int>& dims, const Tensor& out, Finish fin) {
  O* o = static_cast<O*>(out.raw_data());
  reduce::run_reduce<R<T>, T>(x, dims, [&](int64_t i, const typename R<T>::Acc& acc) { o[i] = fin(acc); });
}

// ---- sum ----
void sum_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  Shape s = attr_reduced_shape(x, a.attrs, "sum");
  DType out = is_integral(x.dtype(), true) ? DType::i64 : x.dtype();  // PyTorch: ints and bool sum to int64
  if (a.attrs.has("dtype")) {
    out = a.attrs.get_dtype("dtype");
    m.cast_mask = 1;
    m.cast_to = out;
  }
  m.out() = {s, out, x.device()};
}
void sum_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor& out = a.outputs[0];
  const auto dims = attr_dims(x, a.attrs, "sum");
  dispatch_dtype(x.dtype(), [&](auto zx) {
    using T = decltype(zx);
    if (out.dtype() == x.dtype()) {
      reduce_into<SumR, T, T>(x, dims, out, [](auto acc) { return cpu::convert<T>(acc); });
    } else {
      reduce_into<SumR, T, int64_t>(x, dims, out, [](auto acc) { return static_cast<int64_t>(acc); });
    }
  });
}
TPU_DEFINE_OP(sum_op, {.name = "sum", .num_inputs = 1, .flags = kReduction, .meta = &sum_meta, .cpu = &sum_cpu,
                       .doc = "sum over dims (ints and bool sum to i64; optional output dtype)"});

// ---- mean ----
void mean_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  TPU_CHECK(is_floating(x.dtype()),
            "mean: expected a floating point input, got {} (shape {}); convert it first, e.g. x.to(f32)",
            dtype_name(x.dtype()), x.shape().str());
  m.out() = {attr_reduced_shape(x, a.attrs, "mean"), x.dtype(), x.device()};
}
void mean_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const auto dims = attr_dims(x, a.attrs, "mean");
  int64_t count = 1;
  for (int d : dims) count *= x.shape()[d];
  const double den = static_cast<double>(count);
  dispatch_dtype(x.dtype(), [&](auto zx) {
    using T = decltype(zx);
    if constexpr (is_float_v<T>)
      reduce_into<SumR, T, T>(x, dims, a.outputs[0], [&](double acc) { return cpu::convert<T>(acc / den); });
  });
}
TPU_DEFINE_OP(mean_op, {.name = "mean", .num_inputs = 1, .flags = kReduction, .meta = &mean_meta, .cpu = &mean_cpu,
                        .doc = "arithmetic mean over dims (float inputs; NaN over an empty dim)"});

// ---- prod ----
void prod_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  DType out = is_integral(x.dtype(), true) ? DType::i64 : x.dtype();  // PyTorch: ints and bool multiply to int64
  m.out() = {attr_reduced_shape(x, a.attrs, "prod"), out, x.device()};
}
void prod_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor& out = a.outputs[0];
  const auto dims = attr_dims(x, a.attrs, "prod");
  dispatch_dtype(x.dtype(), [&](auto zx) {
    using T = decltype(zx);
    if (out.dtype() == x.dtype())
      reduce_into<ProdR, T, T>(x, dims, out, [](auto acc) { return cpu::convert<T>(acc); });
    else
      reduce_into<ProdR, T, int64_t>(x, dims, out, [](auto acc) { return static_cast<int64_t>(acc); });
  });
}
TPU_DEFINE_OP(prod_op, {.name = "prod", .num_inputs = 1, .flags = kReduction, .meta = &prod_meta,
                        .cpu = &prod_cpu, .doc = "product over dims (ints and bool to i64)"});

// ---- all / any ----
// bool, except u8 in, u8 (0 / 1) out: PyTorch's torch.all / torch.any keep uint8.
void logical_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  const DType out = x.dtype() == DType::u8 ? DType::u8 : DType::boolean;
  m.out() = {attr_reduced_shape(x, a.attrs, a.op.name), out, x.device()};
}
template <bool kAll>
void logical_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const auto dims = attr_dims(x, a.attrs, a.op.name);
  const bool as_u8 = a.outputs[0].dtype() == DType::u8;
  dispatch_dtype(x.dtype(), [&](auto zx) {
    using T = decltype(zx);
    void* o = a.outputs[0].raw_data();
    reduce::run_reduce<LogicalR<T, kAll>, T>(x, dims, [&](int64_t i, bool v) {
      if (as_u8) static_cast<uint8_t*>(o)[i] = v ? 1 : 0;
      else static_cast<bool*>(o)[i] = v;
    });
  });
}
TPU_DEFINE_OP(all_op, {.name = "all", .num_inputs = 1, .flags = kReduction | kNonDifferentiable,
                       .meta = &logical_meta, .cpu = &logical_cpu<true>,
                       .doc = "true where every element over dims is nonzero (true when empty; bool, u8 for u8)"});
TPU_DEFINE_OP(any_op, {.name = "any", .num_inputs = 1, .flags = kReduction | kNonDifferentiable,
                       .meta = &logical_meta, .cpu = &logical_cpu<false>,
                       .doc = "true where some element over dims is nonzero (false when empty; bool, u8 for u8)"});

using reduce::reduce_attrs;

}  // namespace

Tensor sum(const Tensor& x, const Dims& dims, bool keepdim, std::optional<DType> dtype) {
  Attrs at = reduce_attrs(dims, keepdim);
  if (dtype) at.set("dtype", *dtype);
  return ops::call(sum_op(), {x}, at);
}
Tensor mean(const Tensor& x, const Dims& dims, bool keepdim) { return ops::call(mean_op(), {x}, reduce_attrs(dims, keepdim)); }
Tensor prod(const Tensor& x, const Dims& dims, bool keepdim) { return ops::call(prod_op(), {x}, reduce_attrs(dims, keepdim)); }
Tensor all(const Tensor& x, const Dims& dims, bool keepdim) { return ops::call(all_op(), {x}, reduce_attrs(dims, keepdim)); }
Tensor any(const Tensor& x, const Dims& dims, bool keepdim) { return ops::call(any_op(), {x}, reduce_attrs(dims, keepdim)); }

Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const { return tpu::sum(*this, dims, keepdim); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const { return tpu::mean(*this, dims, keepdim); }

}  // namespace tpu
