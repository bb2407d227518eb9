// The portable executor of fused elementwise programs (vec_math.h): the steps run block by
// block, each over a block of kBlock values with the math table's one-op kernels, so the values
// between steps stay in L1 and the loads of the next block (prefetched) overlap the arithmetic
// of this one. Tables with their own executor (AVX2) keep values in registers instead.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/cpu/vec_math.h"
#include "tpucore/core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define TPU_HAVE_SSE_STREAM 1
#endif

namespace tpu::ops::cpu {
namespace {

constexpr int64_t kBlock = 256;

// Copies a block to memory, with non-temporal stores when asked and 16-byte aligned.
void store_block(float* dst, const float* src, int64_t len, bool stream) {
#ifdef TPU_HAVE_SSE_STREAM
  if (stream && (reinterpret_cast<uintptr_t>(dst) & 15u) == 0) {
    int64_t e = 0;
    for (; e + 4 <= len; e += 4) _mm_stream_ps(dst + e, _mm_load_ps(src + e));
    for (; e < len; ++e) dst[e] = src[e];
    return;
  }
#else
  (void)stream;
#endif
  std::memcpy(dst, src, static_cast<size_t>(len) * sizeof(float));
}

void run_step(const VecMathTable& vm, const VecStep& s, const float* const* p, float* o, int64_t len) {
  const float* x = p[s.in0];
  switch (s.kind) {
    case VecStepKind::binary: vm.get(s.bin)(o, x, p[s.in1], false, s.alpha, len); break;
    case VecStepKind::unary: vm.get(s.un)(o, x, len); break;
    case VecStepKind::neg: for (int64_t i = 0; i < len; ++i) o[i] = -x[i]; break;
    case VecStepKind::abs: for (int64_t i = 0; i < len; ++i) o[i] = std::fabs(x[i]); break;
    case VecStepKind::sqrt: for (int64_t i = 0; i < len; ++i) o[i] = std::sqrt(x[i]); break;
    case VecStepKind::rsqrt: for (int64_t i = 0; i < len; ++i) o[i] = 1.0f / std::sqrt(x[i]); break;
    case VecStepKind::recip: for (int64_t i = 0; i < len; ++i) o[i] = 1.0f / x[i]; break;
    case VecStepKind::copy: std::copy(x, x + len, o); break;
  }
}

}  // namespace

void run_vec_program(const VecMathTable& vm, const VecStep* steps, int nsteps, const VecOperand* ops, int nops,
                     int64_t n) {
  TPU_CHECK(nops <= kVecProgramMaxOperands && nsteps <= nops, "internal: a fused program of {} steps over {} operands",
            nsteps, nops);
  if (vm.program) vm.program(steps, nsteps, ops, nops, n);
  else run_vec_program_blocks(vm, steps, nsteps, ops, nops, n);
}

void run_vec_program_blocks(const VecMathTable& vm, const VecStep* steps, int nsteps, const VecOperand* ops, int nops,
                            int64_t n) {
  if (n <= 0 || nops > kVecProgramMaxOperands) return;
  // One block slot per operand: computed values, and scalars broadcast once.
  alignas(64) float slots[kVecProgramMaxOperands][kBlock];
  const float* p[kVecProgramMaxOperands];
  int mems[kVecProgramMaxOperands], outs[kVecProgramMaxOperands];
  int nmems = 0, nouts = 0;
  bool any_stream = false;
  for (int k = 0; k < nops; ++k) {
    const VecOperand& o = ops[k];
    p[k] = slots[k];
    if (o.in && o.scalar) std::fill(slots[k], slots[k] + std::min(kBlock, n), o.in[0]);
    else if (o.in) mems[nmems++] = k;
    if (o.out) {
      outs[nouts++] = k;
      any_stream = any_stream || o.stream;
    }
  }
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t len = std::min(kBlock, n - i);
    for (int j = 0; j < nmems; ++j) {
      p[mems[j]] = ops[mems[j]].in + i;
      // The inputs two blocks ahead, fetched while this block computes (a prefetch past the
      // end of an array is harmless).
      for (int64_t e = 0; e < kBlock; e += 16) __builtin_prefetch(ops[mems[j]].in + i + 2 * kBlock + e);
    }
    for (int si = 0; si < nsteps; ++si) run_step(vm, steps[si], p, slots[steps[si].out], len);
    for (int j = 0; j < nouts; ++j) store_block(ops[outs[j]].out + i, slots[outs[j]], len, ops[outs[j]].stream);
  }
#ifdef TPU_HAVE_SSE_STREAM
  if (any_stream) _mm_sfence();
#else
  (void)any_stream;
#endif
}

}  // namespace tpu::ops::cpu
