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

// A fused elementwise program: the steps of a graph region, run over one contiguous range a
// few vectors at a time, so the values between steps stay in registers and L1 and the loads
// of the next block overlap the arithmetic of this one (one pass over memory, as a generated
// loop would do it).
enum class VecStepKind : uint8_t { unary, binary, neg, abs, sqrt, rsqrt, recip, copy };
struct VecStep {
  VecStepKind kind = VecStepKind::copy;
  VecUnary un = VecUnary::exp;
  VecBinary bin = VecBinary::add;
  float alpha = 1.0f;                   // add/sub: out = in0 + alpha * in1
  int16_t in0 = -1, in1 = -1, out = -1;  // operand indices
};
// Operand k of a program: an input read from memory when `in` is set (scalar: in[0] for every
// element), otherwise a value computed by exactly one earlier step. When `out` is set the
// value is also written to memory as it is computed (so outputs must not overlap inputs; the
// graph's buffer plan never gives a region output the buffer of one of its inputs); `stream`
// writes it with non-temporal stores when `out` is 32-byte aligned.
struct VecOperand {
  const float* in = nullptr;
  float* out = nullptr;
  bool scalar = false;
  bool stream = false;
};
inline constexpr int kVecProgramMaxOperands = 64;
// Runs the steps over elements [0, n) of every operand (nops <= kVecProgramMaxOperands, and
// one step per computed operand; run_vec_program checks both).
using VecProgramFn = void (*)(const VecStep* steps, int nsteps, const VecOperand* ops, int nops, int64_t n);

struct VecMathTable {
  const char* name;
  VecUnaryFn unary[static_cast<int>(VecUnary::count)];
  VecBinaryFn binary[static_cast<int>(VecBinary::count)];
  VecProgramFn program = nullptr;  // null: run_vec_program uses the portable block executor
  VecUnaryFn get(VecUnary op) const { return unary[static_cast<int>(op)]; }
  VecBinaryFn get(VecBinary op) const { return binary[static_cast<int>(op)]; }
};

// Runs a fused program with the table's executor, or with the portable one (the table's one-op
// kernels over blocks of 256 values) when it has none.
void run_vec_program(const VecMathTable& vm, const VecStep* steps, int nsteps, const VecOperand* ops, int nops,
                     int64_t n);
// The portable executor itself (for tests of every table).
void run_vec_program_blocks(const VecMathTable& vm, const VecStep* steps, int nsteps, const VecOperand* ops, int nops,
                            int64_t n);

// The portable implementation (always available).
const VecMathTable& vec_math_scalar();
// The AVX-512 implementation, or nullptr when this CPU lacks AVX-512 (F, BW, VL) and FMA.
const VecMathTable* vec_math_avx512();
// The AVX2 implementation, or nullptr when this CPU lacks AVX2 and FMA.
const VecMathTable* vec_math_avx2();
// The best implementation for this CPU (TPU_CPU_FEATURES=generic selects the scalar one).
const VecMathTable& vec_math();

}  // namespace tpu::ops::cpu
