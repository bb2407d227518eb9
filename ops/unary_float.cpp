// Unary ops defined on floating point: exp, log, log1p, expm1, sqrt, rsqrt, reciprocal, sin,
// cos, tanh, sigmoid, silu, gelu (erf form or tanh approximation), erf. Integer and bool
// inputs are promoted to f32 by the front half (as PyTorch: exp of an int tensor is f32).
//
// f32 contiguous data goes straight through the vectorized table (ops/cpu/vec_math.h);
// bf16/f16 and strided inputs are converted to f32 in small blocks, computed, and converted
// back, so every dtype uses the same math.
#include <algorithm>
#include <cmath>

#include "ops/binary_common.h"
#include "ops/cpu/kernels/half_convert.h"

namespace tpu {
namespace {
using namespace ops;
using namespace ops::elementwise;

void float_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  const DType t = is_floating(x.dtype()) ? x.dtype() : DType::f32;
  m.out() = {x.shape(), t, x.device()};
  m.cast_mask = 1;
  m.cast_to = t;
}

// Transcendental work is heavier per element than a copy: split it over threads sooner.
constexpr int64_t kMathGrain = 8192;

void apply_float_unary(const Tensor& out, const Tensor& in, cpu::VecUnaryFn fn) {
  const int64_t n = out.numel();
  if (n == 0) return;
  if (out.dtype() == DType::f32 && in.is_contiguous() && in.numel() == n) {
    float* o = out.data<float>();
    const float* x = in.data<float>();
    parallel_for(0, n, kMathGrain, [&](int64_t s, int64_t e) { fn(o + s, x + s, e - s); });
    return;
  }
  dispatch_dtype(out.dtype(), [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_same_v<cpu::compute_t<T>, float>) {
      std::array<char*, 2> base{cpu::byte_ptr(out), cpu::byte_ptr(in)};
      std::array<Shape, 2> st{cpu::broadcast_byte_strides(out, out.shape()), cpu::broadcast_byte_strides(in, out.shape())};
      cpu::for_each_run<2>(out.shape(), base, st, [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t len) {
        if constexpr (std::is_same_v<T, float>) {
          if (s[0] == 4 && s[1] == 4) {
            fn(reinterpret_cast<float*>(p[0]), reinterpret_cast<const float*>(p[1]), len);
            return;
          }
        }
        constexpr int64_t kBlock = 256;
        float buf[kBlock];
        for (int64_t j = 0; j < len; j += kBlock) {
          const int64_t m = std::min(kBlock, len - j);
          kernels::load_run_f32<T>(p[1] + j * s[1], s[1], m, buf);
          fn(buf, buf, m);
          kernels::store_run_f32<T>(p[0] + j * s[0], s[0], m, buf);
        }
      }, kMathGrain);
    } else {
      fail("internal: float unary op on {} output", dtype_name(out.dtype()));
    }
  });
}

// The ops without a dedicated vector version: plain loops (sqrt and the divisions vectorize).
template <class F>
void loop1(float* o, const float* x, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
}
void log1p_f(float* o, const float* x, int64_t n) { loop1(o, x, n, [](float v) { return std::log1p(v); }); }
void expm1_f(float* o, const float* x, int64_t n) { loop1(o, x, n, [](float v) { return std::expm1(v); }); }
void sqrt_f(float* o, const float* x, int64_t n) { loop1(o, x, n, [](float v) { return std::sqrt(v); }); }
void rsqrt_f(float* o, const float* x, int64_t n) { loop1(o, x, n, [](float v) { return 1.0f / std::sqrt(v); }); }
void recip_f(float* o, const float* x, int64_t n) { loop1(o, x, n, [](float v) { return 1.0f / v; }); }
void sin_f(float* o, const float* x, int64_t n) { loop1(o, x, n, [](float v) { return std::sin(v); }); }
void cos_f(float* o, const float* x, int64_t n) { loop1(o, x, n, [](float v) { return std::cos(v); }); }

template <cpu::VecUnary kOp>
void vec_cpu(const KernelArgs& k) {
  apply_float_unary(k.outputs[0], k.inputs[0], cpu::vec_math().get(kOp));
}
template <cpu::VecUnaryFn kFn>
void loop_cpu(const KernelArgs& k) {
  apply_float_unary(k.outputs[0], k.inputs[0], kFn);
}
void gelu_cpu(const KernelArgs& k) {
  const bool approx = k.attrs.get_bool("tanh_approx", false);
  apply_float_unary(k.outputs[0], k.inputs[0],
                    cpu::vec_math().get(approx ? cpu::VecUnary::gelu_tanh : cpu::VecUnary::gelu_erf));
}

#define TPU_FLOAT_UNARY(var, opname, kernel, what)                                                     \
  TPU_DEFINE_OP(var, {.name = opname, .num_inputs = 1, .flags = kElementwise, .meta = &float_meta, \
                      .cpu = &kernel, .doc = what})

TPU_FLOAT_UNARY(exp_op, "exp", vec_cpu<cpu::VecUnary::exp>, "e^x");
TPU_FLOAT_UNARY(log_op, "log", vec_cpu<cpu::VecUnary::log>, "natural logarithm");
TPU_FLOAT_UNARY(tanh_op, "tanh", vec_cpu<cpu::VecUnary::tanh>, "hyperbolic tangent");
TPU_FLOAT_UNARY(sigmoid_op, "sigmoid", vec_cpu<cpu::VecUnary::sigmoid>, "1 / (1 + e^-x)");
TPU_FLOAT_UNARY(silu_op, "silu", vec_cpu<cpu::VecUnary::silu>, "x * sigmoid(x)");
TPU_FLOAT_UNARY(erf_op, "erf", vec_cpu<cpu::VecUnary::erf>, "error function");
TPU_FLOAT_UNARY(log1p_op, "log1p", loop_cpu<log1p_f>, "log(1 + x), accurate near 0");
TPU_FLOAT_UNARY(expm1_op, "expm1", loop_cpu<expm1_f>, "e^x - 1, accurate near 0");
TPU_FLOAT_UNARY(sqrt_op, "sqrt", loop_cpu<sqrt_f>, "square root");
TPU_FLOAT_UNARY(rsqrt_op, "rsqrt", loop_cpu<rsqrt_f>, "1 / sqrt(x)");
TPU_FLOAT_UNARY(reciprocal_op, "reciprocal", loop_cpu<recip_f>, "1 / x");
TPU_FLOAT_UNARY(sin_op, "sin", loop_cpu<sin_f>, "sine");
TPU_FLOAT_UNARY(cos_op, "cos", loop_cpu<cos_f>, "cosine");
TPU_FLOAT_UNARY(gelu_op, "gelu", gelu_cpu,
                "0.5 x (1 + erf(x / sqrt 2)); attr tanh_approx: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))");

}  // namespace

Tensor exp(const Tensor& x) { return ops::call(exp_op(), {x}); }
Tensor log(const Tensor& x) { return ops::call(log_op(), {x}); }
Tensor log1p(const Tensor& x) { return ops::call(log1p_op(), {x}); }
Tensor expm1(const Tensor& x) { return ops::call(expm1_op(), {x}); }
Tensor sqrt(const Tensor& x) { return ops::call(sqrt_op(), {x}); }
Tensor rsqrt(const Tensor& x) { return ops::call(rsqrt_op(), {x}); }
Tensor reciprocal(const Tensor& x) { return ops::call(reciprocal_op(), {x}); }
Tensor sin(const Tensor& x) { return ops::call(sin_op(), {x}); }
Tensor cos(const Tensor& x) { return ops::call(cos_op(), {x}); }
Tensor tanh(const Tensor& x) { return ops::call(tanh_op(), {x}); }
Tensor sigmoid(const Tensor& x) { return ops::call(sigmoid_op(), {x}); }
Tensor silu(const Tensor& x) { return ops::call(silu_op(), {x}); }
Tensor erf(const Tensor& x) { return ops::call(erf_op(), {x}); }
Tensor gelu(const Tensor& x, bool tanh_approx) {
  if (!tanh_approx) return ops::call(gelu_op(), {x});
  return ops::call(gelu_op(), {x}, {{"tanh_approx", true}});
}

}  // namespace tpu
