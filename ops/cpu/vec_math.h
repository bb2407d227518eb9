// Vectorized f32 math over contiguous arrays: the transcendental unary functions behind
// exp/log/tanh/sigmoid/silu/gelu/erf, and the f32 binary arithmetic hot loops.
//
// Implementations: a portable scalar one (std:: functions, vec_math_scalar.cpp), and one
// Highway source (vec_math_hwy-inl.h, vec_program_hwy-inl.h) compiled for each x86 target
// (AVX-512, AVX2, SSE4 and Highway's baseline fallback: the same polynomial approximations, within a few ulp of the
// correctly rounded f32 result), the best the CPU has chosen once at run time. Each is
// reachable explicitly so that tests can check each path.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

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
// writes it with non-temporal stores when `out` is aligned to the vector size.
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
// The Highway AVX-512 implementation ("avx512"), or nullptr when this CPU lacks AVX-512 (F, VL,
// DQ, BW) or under TPU_CPU_FEATURES=generic.
const VecMathTable* vec_math_avx512();
// The Highway AVX2 implementation ("avx2"), or nullptr when this CPU lacks AVX2 and FMA.
const VecMathTable* vec_math_avx2();
// Every Highway implementation this CPU can run, best first ("avx512", "avx2", "sse4",
// "baseline": Highway's one-lane or emulated fallback; none under TPU_CPU_FEATURES=generic).
std::vector<const VecMathTable*> vec_math_targets();
// The best implementation at or below `isa` ("avx512", "avx2", "sse4", "baseline" or "scalar",
// the portable one); another name is a tpu::Error.
const VecMathTable& vec_math_capped(std::string_view isa);
// The best implementation for this CPU: TPU_CPU_ISA=<name> caps it as vec_math_capped does (to
// measure or test a narrower path), TPU_CPU_FEATURES=generic selects the scalar one.
const VecMathTable& vec_math();

}  // namespace tpu::ops::cpu
