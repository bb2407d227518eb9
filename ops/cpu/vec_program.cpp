// The portable executor of fused elementwise programs (vec_math.h): the steps run block by
// block, each over a block of kBlock values with the math table's one-op kernels, so the values
// between steps stay in L1 and the loads of the next block (prefetched) overlap the arithmetic
// of this one. The Highway tables have their own executor (values in registers instead).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/cpu/vec_math.h"
#include "ops/cpu/vec_program_plan.h"
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

// ---- planning for the Highway executor (vec_program_plan.h) ----

namespace tpu::ops::cpu {

void count_vec_uses(const VecStep* steps, int nsteps, int nops, int* uses) {
  std::fill_n(uses, nops, 0);
  for (int si = 0; si < nsteps; ++si) {
    ++uses[steps[si].in0];
    if (steps[si].kind == VecStepKind::binary) ++uses[steps[si].in1];
  }
}

void fold_vec_prologues(const VecStep* steps, int nsteps, const VecOperand* ops, const int* uses, int nops,
                        VecPrologue* pro, bool* skip) {
  int producer[kVecProgramMaxOperands];
  std::fill_n(producer, nops, -1);
  for (int si = 0; si < nsteps; ++si) producer[steps[si].out] = si;
  // The step computing operand k when it may be folded away: a binary `op` (add: alpha 1).
  auto foldable = [&](int k, VecBinary op) {
    const int si = k >= 0 ? producer[k] : -1;
    if (si < 0 || uses[k] != 1 || ops[k].out || skip[si]) return -1;
    const VecStep& t = steps[si];
    if (t.kind != VecStepKind::binary || t.bin != op || (op == VecBinary::add && t.alpha != 1.0f)) return -1;
    return si;
  };
  for (int si = 0; si < nsteps; ++si) {
    const VecStep& s = steps[si];
    if (s.kind == VecStepKind::binary || s.kind == VecStepKind::copy) continue;
    VecPrologue& p = pro[si];
    int x = s.in0;
    if (const int ai = foldable(x, VecBinary::add); ai >= 0) {
      const VecStep& add = steps[ai];
      skip[ai] = true;
      // x * a + b when one side of the add is a foldable multiply.
      int mi = foldable(add.in0, VecBinary::mul), b = add.in1;
      if (mi < 0) {
        mi = foldable(add.in1, VecBinary::mul);
        b = add.in0;
      }
      if (mi < 0) {
        x = add.in0;
        b = add.in1;
      } else {
        skip[mi] = true;
        x = steps[mi].in0;
        p.a = steps[mi].in1;
      }
      p.b = static_cast<int16_t>(b);
    } else if (const int mi = foldable(x, VecBinary::mul); mi >= 0) {
      skip[mi] = true;
      x = steps[mi].in0;
      p.a = steps[mi].in1;
    }
    p.x = static_cast<int16_t>(x);
  }
}

int single_pass_step(const VecStep* steps, int nsteps, const VecOperand* ops, const VecPrologue* pro, const bool* skip) {
  int si = -1;
  for (int k = 0; k < nsteps; ++k) {
    if (skip[k]) continue;
    if (si >= 0) return -1;
    si = k;
  }
  if (si < 0) return -1;
  const VecStep& s = steps[si];
  auto memory = [&](int k) { return k >= 0 && ops[k].in && !ops[k].scalar; };
  const bool reads_memory = s.kind == VecStepKind::binary
                                ? memory(s.in0) && memory(s.in1)
                                : memory(pro[si].x >= 0 ? pro[si].x : s.in0) && (pro[si].a < 0 || memory(pro[si].a)) &&
                                      (pro[si].b < 0 || memory(pro[si].b));
  return reads_memory && ops[s.out].out ? si : -1;
}

}  // namespace tpu::ops::cpu
