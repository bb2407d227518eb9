// Vectorized f32 math over contiguous arrays: the transcendental unary functions behind
// exp/log/tanh/sigmoid/silu/gelu/erf, and the f32 binary arithmetic hot loops.
//
// Three implementations: a portable scalar one (std:: functions, used on any CPU), an AVX-512
// one and an AVX2+FMA one (the same polynomial approximations, within a few ulp of the
// correctly rounded f32 result), chosen once at run time from tpu::cpu_features() in the
// order avx512, avx2, scalar. Each is reachable explicitly so that tests can check each path.
#pragma once

#include <cstdint>

namespace tpu::ops::cpu {

enum class VecUnary : uint8_t { exp, log, tanh, sigmoid, silu, gelu_erf, gelu_tanh, erf, relu, count };
enum class VecBinary : uint8_t { add, sub, mul, div, maximum, minimum, count };

// out[i] = f(in[i]) for i < n; out may equal in.
using VecUnaryFn = void (*)(float* out, const float* in, int64_t n);
// out[i] = x[i] op y[i]; a null-free form: when y_scalar is set, y[0] is used for every i.
// For add/sub, alpha scales y (out = x + alpha * y). out may equal x or y.
using VecBinaryFn = void (*)(float* out, const float* x, const float* y, bool y_scalar, float alpha, int64_t n);

struct VecMathTable {
  const char* name;
  VecUnaryFn unary[static_cast<int>(VecUnary::count)];
  VecBinaryFn binary[static_cast<int>(VecBinary::count)];
  VecUnaryFn get(VecUnary op) const { return unary[static_cast<int>(op)]; }
  VecBinaryFn get(VecBinary op) const { return binary[static_cast<int>(op)]; }
};

// The portable implementation (always available).
const VecMathTable& vec_math_scalar();
// The AVX-512 implementation, or nullptr when this CPU lacks AVX-512 (F, BW, VL) and FMA.
const VecMathTable* vec_math_avx512();
// The AVX2 implementation, or nullptr when this CPU lacks AVX2 and FMA.
const VecMathTable* vec_math_avx2();
// The best implementation for this CPU (TPU_CPU_FEATURES=generic selects the scalar one).
const VecMathTable& vec_math();

}  // namespace tpu::ops::cpu
