// Extremum reductions: amax, amin (values over dims), max/min over one dim (values and i64
// indices), argmax/argmin (over one dim or all elements), and max()/min() of all elements.
// NaN propagates as in PyTorch: a NaN is the extremum and its first index is reported.
// Ties report the first occurrence. Reducing over a zero-size dim is an error (no identity).
#include <cmath>
#include <limits>

#include "ops/cpu/loops.h"
#include "ops/reduce_common.h"
#include "ops/reduce_engine.h"
#include "ops/reduce_vec.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;
using reduce::attr_dims;

template <class T>
using C = cpu::compute_t<T>;

template <class T>
inline C<T> load(T v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) return v.to_f32();
  else return static_cast<C<T>>(v);
}

// True when v should replace the current best (NaN wins and then stays). Branch-free so
// that lane loops vectorize.
template <bool kMax, class V>
inline bool better(V v, V best) {
  const bool cmp = kMax ? v > best : v < best;
  if constexpr (std::is_floating_point_v<V>) return cmp | ((v != v) & (best == best));
  else return cmp;
}

template <class T, bool kMax>
struct ExtremumR {
  static constexpr bool kVertical = true;
  using V = C<T>;
  using Acc = V;
  static Acc init() {
    if constexpr (std::is_same_v<V, bool>) return !kMax;
    else if constexpr (std::is_floating_point_v<V>)
      return kMax ? -std::numeric_limits<V>::infinity() : std::numeric_limits<V>::infinity();
    else return kMax ? std::numeric_limits<V>::lowest() : std::numeric_limits<V>::max();
  }
  static void step(Acc& a, T x) {
    const V v = load(x);
    a = better<kMax>(v, a) ? v : a;
  }
  static void run(Acc& a, const T* p, int64_t n, int64_t s, int64_t) {
    if constexpr (std::is_same_v<T, float>) {
      if (s == 1) {
        a = reduce::extremum_f32<kMax>(p, n, a);
        return;
      }
    }
    if (s == 1) {
      constexpr int L = 16;
      Acc lane[L];
      for (int j = 0; j < L; ++j) lane[j] = a;
      int64_t i = 0;
      for (; i + L <= n; i += L)
        for (int j = 0; j < L; ++j) step(lane[j], p[i + j]);
      for (int j = 0; j < L; ++j) merge(a, lane[j]);
      for (; i < n; ++i) step(a, p[i]);
      return;
    }
    for (int64_t i = 0; i < n; ++i) step(a, p[i * s]);
  }
  static void merge(Acc& l, const Acc& r) {
    if (better<kMax>(r, l)) l = r;
  }
};

// Best value and the (first) reduced index holding it; idx < 0 while empty.
template <class T, bool kMax>
struct ArgR {
  using V = C<T>;
  struct Acc {
    V best{};
    int64_t idx = -1;
  };
  static Acc init() { return {}; }
  static void run(Acc& a, const T* p, int64_t n, int64_t s, int64_t i0) {
    constexpr int L = 16;
    if (s == 1 && n >= 4 * L && n < (int64_t{1} << 31)) {
      // Lane j tracks the best of positions j, j + L, ...; lanes merge preferring the
      // lower index among equal (or NaN) values, so the first occurrence wins.
      V lb[L];
      int32_t li[L];
      for (int j = 0; j < L; ++j) lb[j] = load(p[j]), li[j] = j;
      int64_t i = L;
      for (; i + L <= n; i += L)
        for (int j = 0; j < L; ++j) {
          const V v = load(p[i + j]);
          const bool t = better<kMax>(v, lb[j]);
          lb[j] = t ? v : lb[j];
          li[j] = t ? static_cast<int32_t>(i + j) : li[j];
        }
      Acc r{lb[0], li[0]};
      for (int j = 1; j < L; ++j) {
        const bool same = lb[j] == r.best || (lb[j] != lb[j] && r.best != r.best);
        if (better<kMax>(lb[j], r.best) || (same && li[j] < r.idx)) r = {lb[j], li[j]};
      }
      for (; i < n; ++i) {
        const V v = load(p[i]);
        if (better<kMax>(v, r.best)) r = {v, i};
      }
      r.idx += i0;
      merge(a, r);
      return;
    }
    int64_t i = 0;
    if (a.idx < 0 && n > 0) {
      a.best = load(p[0]);
      a.idx = i0;
      i = 1;
    }
    for (; i < n; ++i) {
      const V v = load(p[i * s]);
      if (better<kMax>(v, a.best)) {
        a.best = v;
        a.idx = i0 + i;
      }
    }
  }
  static void merge(Acc& l, const Acc& r) {
    if (r.idx >= 0 && (l.idx < 0 || better<kMax>(r.best, l.best))) l = r;
  }
};

// ---- amax / amin ----
void extremum_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  const auto dims = attr_dims(x, a.attrs, a.op.name);
  reduce::check_nonempty_reduction(x, dims, a.op.name);
  m.out() = {reduced_shape(x.shape(), dims, a.attrs.get_bool("keepdim")), x.dtype(), x.device()};
}
template <bool kMax>
void extremum_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const auto dims = attr_dims(x, a.attrs, a.op.name);
  dispatch_dtype(x.dtype(), [&](auto zx) {
    using T = decltype(zx);
    T* o = static_cast<T*>(a.outputs[0].raw_data());
    reduce::run_reduce<ExtremumR<T, kMax>, T>(x, dims, [&](int64_t i, C<T> v) { o[i] = cpu::convert<T>(v); });
  });
}
TPU_DEFINE_OP(amax_op, {.name = "amax", .num_inputs = 1, .flags = kReduction, .meta = &extremum_meta,
                        .cpu = &extremum_cpu<true>, .doc = "maximum over dims (NaN propagates)"});
TPU_DEFINE_OP(amin_op, {.name = "amin", .num_inputs = 1, .flags = kReduction, .meta = &extremum_meta,
                        .cpu = &extremum_cpu<false>, .doc = "minimum over dims (NaN propagates)"});

// ---- max/min over one dim: (values, indices) ----
// "dims" holds the one dim (empty for argmax/argmin over all elements).
void arg_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  const auto dims = attr_dims(x, a.attrs, a.op.name);
  reduce::check_nonempty_reduction(x, dims, a.op.name);
  // argmax without a dim flattens: the result is 0-d (or all ones with keepdim).
  const Shape s = reduced_shape(x.shape(), dims, a.attrs.get_bool("keepdim"));
  const bool with_values = a.op.name == "max_dim" || a.op.name == "min_dim";
  if (with_values) {
    m.num_outputs = 2;
    m.out(0) = {s, x.dtype(), x.device()};
    m.out(1) = {s, DType::i64, x.device()};
  } else {
    m.out(0) = {s, DType::i64, x.device()};
  }
}
template <bool kMax>
void arg_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const auto dims = attr_dims(x, a.attrs, a.op.name);
  const bool with_values = a.outputs.size() == 2;
  dispatch_dtype(x.dtype(), [&](auto zx) {
    using T = decltype(zx);
    T* vals = with_values ? static_cast<T*>(a.outputs[0].raw_data()) : nullptr;
    int64_t* idx = static_cast<int64_t*>(a.outputs[with_values ? 1 : 0].raw_data());
    using Acc = typename ArgR<T, kMax>::Acc;
    reduce::run_reduce<ArgR<T, kMax>, T>(x, dims, [&](int64_t i, const Acc& acc) {
      idx[i] = static_cast<int64_t>(acc.idx);
      if (vals) vals[i] = cpu::convert<T>(acc.best);
    });
  });
}
TPU_DEFINE_OP(max_dim_op, {.name = "max_dim", .num_inputs = 1, .flags = kReduction, .meta = &arg_meta,
                           .cpu = &arg_cpu<true>, .doc = "maximum over one dim and its first index (i64)"});
TPU_DEFINE_OP(min_dim_op, {.name = "min_dim", .num_inputs = 1, .flags = kReduction, .meta = &arg_meta,
                           .cpu = &arg_cpu<false>, .doc = "minimum over one dim and its first index (i64)"});
TPU_DEFINE_OP(argmax_op, {.name = "argmax", .num_inputs = 1, .flags = kReduction | kNonDifferentiable,
                          .meta = &arg_meta, .cpu = &arg_cpu<true>,
                          .doc = "index (i64) of the first maximum over one dim or of all elements"});
TPU_DEFINE_OP(argmin_op, {.name = "argmin", .num_inputs = 1, .flags = kReduction | kNonDifferentiable,
                          .meta = &arg_meta, .cpu = &arg_cpu<false>,
                          .doc = "index (i64) of the first minimum over one dim or of all elements"});

using reduce::reduce_attrs;

std::tuple<Tensor, Tensor> value_index(const OpDef& op, const Tensor& x, int64_t dim, bool keepdim) {
  Tensor outs[kMaxOutputs];
  const Tensor ins[1] = {x};
  ops::call(op, ins, reduce_attrs({dim}, keepdim), outs);
  return {std::move(outs[0]), std::move(outs[1])};
}

Tensor arg_index(const OpDef& op, const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  if (dim) return ops::call(op, {x}, reduce_attrs({*dim}, keepdim));
  // Over all elements: keepdim keeps every dim as size 1 (as PyTorch).
  return ops::call(op, {x}, reduce_attrs({}, keepdim));
}

}  // namespace

Tensor amax(const Tensor& x, const Dims& dims, bool keepdim) { return ops::call(amax_op(), {x}, reduce_attrs(dims, keepdim)); }
Tensor amin(const Tensor& x, const Dims& dims, bool keepdim) { return ops::call(amin_op(), {x}, reduce_attrs(dims, keepdim)); }

std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return value_index(max_dim_op(), x, dim, keepdim);
}
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  return value_index(min_dim_op(), x, dim, keepdim);
}

Tensor max(const Tensor& x) {
  TPU_CHECK(x.numel() > 0, "max: the input of shape {} is empty; max() of all elements needs at least one element",
            x.shape().str());
  return ops::call(amax_op(), {x}, reduce_attrs({}, false));
}
Tensor min(const Tensor& x) {
  TPU_CHECK(x.numel() > 0, "min: the input of shape {} is empty; min() of all elements needs at least one element",
            x.shape().str());
  return ops::call(amin_op(), {x}, reduce_attrs({}, false));
}

Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_index(argmax_op(), x, dim, keepdim);
}
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_index(argmin_op(), x, dim, keepdim);
}

}  // namespace tpu
