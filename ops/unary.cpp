// Unary elementwise ops that keep the input's dtype: neg, abs, sign, relu (+ relu_), floor,
// ceil, round (half to even). Integer inputs stay integer (floor/ceil/round are identities
// for them); neg and abs wrap around at INT_MIN like two's complement hardware.
#include <cmath>

#include "ops/binary_common.h"

namespace tpu {
namespace {
using namespace ops;
using namespace ops::elementwise;

void keep_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  m.out() = {x.shape(), x.dtype(), x.device()};
}

void keep_nobool_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  TPU_CHECK(x.dtype() != DType::boolean,
            "{}: not supported for bool tensors (got {}){}", a.op.name, describe(x),
            a.op.name == "neg" ? "; to invert a mask use logical_not" : "");
  keep_meta(a, m);
}

template <class F>
void map_same(const KernelArgs& k, F f) {
  dispatch_dtype(k.outputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    map_unary<T, T>(k.outputs[0], k.inputs[0], [f](auto v) { return f(v); });
  });
}

// Copies the input (integers under floor/ceil/round).
void identity_cpu(const KernelArgs& k) {
  dispatch_dtype(k.outputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    cpu::unary_map<T, T>(k.outputs[0], k.inputs[0], [](T v) { return v; });
  });
}

template <class C>
C neg1(C v) {
  if constexpr (std::is_same_v<C, float>) return -v;
  else if constexpr (std::is_same_v<C, bool>) return v;  // rejected by the meta function
  else return wrap_sub(C(0), v);
}
void neg_cpu(const KernelArgs& k) {
  map_same(k, [](auto v) { return neg1(v); });
}

void abs_cpu(const KernelArgs& k) {
  map_same(k, [](auto v) {
    using C = decltype(v);
    if constexpr (std::is_same_v<C, float>) return std::fabs(v);
    else if constexpr (std::is_same_v<C, bool>) return v;
    else return v < 0 ? neg1(v) : v;
  });
}

// sign: -1, 0 or 1; NaN stays NaN (as NumPy and JAX; -0 and +0 give 0).
void sign_cpu(const KernelArgs& k) {
  map_same(k, [](auto v) {
    using C = decltype(v);
    if constexpr (std::is_same_v<C, float>) return v != v ? v : static_cast<float>((0.0f < v) - (v < 0.0f));
    else if constexpr (std::is_same_v<C, bool>) return v;
    else return static_cast<C>((C(0) < v) - (v < C(0)));
  });
}

void relu_cpu(const KernelArgs& k) {
  const Tensor& out = k.outputs[0];
  const Tensor& in = k.inputs[0];
  if (out.dtype() == DType::f32) {
    const cpu::VecUnaryFn fn = cpu::vec_math().get(cpu::VecUnary::relu);
    const int64_t n = out.numel();
    if (in.is_contiguous() && in.numel() == n) {
      float* o = out.data<float>();
      const float* x = in.data<float>();
      parallel_for(0, n, cpu::kParallelGrain, [&](int64_t s, int64_t e) { fn(o + s, x + s, e - s); });
      return;
    }
  }
  // NaN stays NaN: the comparison is false for it.
  map_same(k, [](auto v) {
    using C = decltype(v);
    if constexpr (std::is_same_v<C, bool>) return v;  // rejected by the meta function
    else return v < C(0) ? C(0) : v;
  });
}

template <int kMode>  // 0 floor, 1 ceil, 2 round half to even
void rounding_cpu(const KernelArgs& k) {
  if (!is_floating(k.outputs[0].dtype())) return identity_cpu(k);
  dispatch_dtype(k.outputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_same_v<cpu::compute_t<T>, float>)
      map_unary<T, T>(k.outputs[0], k.inputs[0], [](float v) {
        if constexpr (kMode == 0) return std::floor(v);
        else if constexpr (kMode == 1) return std::ceil(v);
        else return std::nearbyint(v);  // the default rounding mode: to nearest, ties to even
      });
  });
}

TPU_DEFINE_OP(neg_op, {.name = "neg", .num_inputs = 1, .flags = kElementwise, .meta = &keep_nobool_meta,
                       .cpu = &neg_cpu, .doc = "-x (integers wrap at INT_MIN)"});
TPU_DEFINE_OP(abs_op, {.name = "abs", .num_inputs = 1, .flags = kElementwise, .meta = &keep_meta, .cpu = &abs_cpu,
                       .doc = "|x| (integers wrap at INT_MIN)"});
TPU_DEFINE_OP(sign_op, {.name = "sign", .num_inputs = 1, .flags = kElementwise, .meta = &keep_meta, .cpu = &sign_cpu,
                        .doc = "-1, 0 or 1 by the sign of x (NaN stays NaN)"});
TPU_DEFINE_OP(relu_op, {.name = "relu", .num_inputs = 1, .flags = kElementwise, .meta = &keep_nobool_meta,
                        .cpu = &relu_cpu, .doc = "max(x, 0) (NaN stays NaN)"});
TPU_DEFINE_OP(floor_op, {.name = "floor", .num_inputs = 1, .flags = kElementwise, .meta = &keep_meta,
                         .cpu = &rounding_cpu<0>, .doc = "round down (identity on integers)"});
TPU_DEFINE_OP(ceil_op, {.name = "ceil", .num_inputs = 1, .flags = kElementwise, .meta = &keep_meta,
                        .cpu = &rounding_cpu<1>, .doc = "round up (identity on integers)"});
TPU_DEFINE_OP(round_op, {.name = "round", .num_inputs = 1, .flags = kElementwise, .meta = &keep_meta,
                         .cpu = &rounding_cpu<2>, .doc = "round to nearest, ties to even (identity on integers)"});

}  // namespace

Tensor neg(const Tensor& x) { return ops::call(neg_op(), {x}); }
Tensor abs(const Tensor& x) { return ops::call(abs_op(), {x}); }
Tensor sign(const Tensor& x) { return ops::call(sign_op(), {x}); }
Tensor relu(const Tensor& x) { return ops::call(relu_op(), {x}); }
Tensor floor(const Tensor& x) { return ops::call(floor_op(), {x}); }
Tensor ceil(const Tensor& x) { return ops::call(ceil_op(), {x}); }
Tensor round(const Tensor& x) { return ops::call(round_op(), {x}); }

}  // namespace tpu
