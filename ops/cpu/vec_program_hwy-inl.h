// The fused-program executor of vec_math.h for every Highway target (included per target by
// vec_math_hwy.cpp after vec_math_hwy-inl.h; no include guard on purpose).
//
// Each step runs over a whole block of kProgBlock elements (one dispatch per step and block),
// four vectors at a time, reading its operands through plain pointers: memory inputs in place,
// scalars from a slot filled once, computed values from their block slots. A step stores its
// value to its slot when a later step reads it, and to memory as it is computed when it is a
// region output; a multiply and add feeding a unary step fold into that step's pass
// (vec_program_plan.h). A block is small enough for the loads of memory operands to overlap the
// arithmetic of the steps before, and large enough that dispatch costs little. The last,
// partial block first copies its memory inputs into slots, so no step needs masks. A program
// that folds into a single step reading memory only (bias and activation) skips the blocks and
// runs straight over the whole range.
#if defined(TPU_VEC_PROGRAM_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TPU_VEC_PROGRAM_HWY_INL_H_
#undef TPU_VEC_PROGRAM_HWY_INL_H_
#else
#define TPU_VEC_PROGRAM_HWY_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "ops/cpu/vec_program_plan.h"

HWY_BEFORE_NAMESPACE();
namespace tpu::ops::cpu::HWY_NAMESPACE {

inline constexpr int kProgVecs = 4;
inline constexpr int kProgSub = kLanes * kProgVecs;  // floats per sub-block
inline constexpr int kProgBlock = 256;               // floats per block (a multiple of kProgSub)
static_assert(kProgBlock % kProgSub == 0);
using Block = V[kProgVecs];

// Where a step writes: its slot `o` (null: no later reader), and `m` (memory, may be null) for
// region outputs, with non-temporal stores when `stream`.
// All fields pointer-sized: the struct is passed by value to the NOINLINE loops, and a
// one-byte flag written next to 8-byte fields made the callee's 8-byte reload of it miss
// store forwarding (measured: about 40% of the executor's time on small in-cache updates).
struct ProgDst {
  float* o;
  float* m;
  int64_t stream;
};

HWY_INLINE void prog_put(const Block& a, const ProgDst& d, int64_t e) {
  const D dd;
  if (d.o)
    for (int u = 0; u < kProgVecs; ++u) hn::Store(a[u], dd, d.o + e + kLanes * u);
  if (!d.m) return;
  if (d.stream) {
    for (int u = 0; u < kProgVecs; ++u) hn::Stream(a[u], dd, d.m + e + kLanes * u);
  } else {
    for (int u = 0; u < kProgVecs; ++u) hn::StoreU(a[u], dd, d.m + e + kLanes * u);
  }
}

// F(x * a + b) over `len` elements (a multiple of kProgSub), with the multiply and add folded in
// (kMul, kAdd false: left out, and `a`, `b` are not read). Multiply then add round separately,
// as the steps they replace do (bit for bit the eager result: this file is compiled without
// contraction). The prologue's shape is a template parameter and F is inlined (flatten): with
// run-time branches in the loop, or F called, GCC keeps the block on the stack instead of in
// registers (30% slower in cache for gelu(x * a + b)).
template <class F, bool kMul, bool kAdd>
HWY_NOINLINE HWY_FLATTEN void prog_map1_as(const float* x, const float* a, const float* b, ProgDst d, int64_t len) {
  const D dd;
  for (int64_t e = 0; e < len; e += kProgSub) {
    Block v;
    for (int c = 0; c < kProgSub; c += 16) hwy::Prefetch(x + e + kPrefetchFloats + c);
    for (int u = 0; u < kProgVecs; ++u) v[u] = hn::LoadU(dd, x + e + kLanes * u);
    if constexpr (kMul)
      for (int u = 0; u < kProgVecs; ++u) v[u] = hn::Mul(v[u], hn::LoadU(dd, a + e + kLanes * u));
    if constexpr (kAdd)
      for (int u = 0; u < kProgVecs; ++u) v[u] = hn::Add(v[u], hn::LoadU(dd, b + e + kLanes * u));
    F::template f<kProgVecs>(v);
    prog_put(v, d, e);
  }
}
// Picks the instance for the prologue at hand (a, b null: left out).
template <class F>
HWY_INLINE void prog_map1(const float* x, const float* a, const float* b, ProgDst d, int64_t len) {
  if (a && b) prog_map1_as<F, true, true>(x, a, b, d, len);
  else if (a) prog_map1_as<F, true, false>(x, a, b, d, len);
  else if (b) prog_map1_as<F, false, true>(x, a, b, d, len);
  else prog_map1_as<F, false, false>(x, a, b, d, len);
}
template <class Op>
HWY_NOINLINE void prog_map2(const float* x, const float* y, ProgDst d, float alpha, int64_t len) {
  const D dd;
  const V al = hn::Set(dd, alpha);
  for (int64_t e = 0; e < len; e += kProgSub) {
    Block a;
    for (int u = 0; u < kProgVecs; ++u)
      a[u] = Op::f(hn::LoadU(dd, x + e + kLanes * u), hn::LoadU(dd, y + e + kLanes * u), al);
    prog_put(a, d, e);
  }
}

// One step over `len` elements from operand pointers `p`; `m`: memory destinations (null:
// none); `uses`: readers of each operand.
HWY_INLINE void prog_step(const VecStep& s, const VecPrologue& pro, float* const* p, float* const* m,
                          const bool* stream, const int* uses, int64_t len) {
  const float* x = p[pro.x >= 0 ? pro.x : s.in0];
  // A region output no later step reads goes to memory only.
  const ProgDst o{uses[s.out] > 0 || !m[s.out] ? p[s.out] : nullptr, m[s.out], stream[s.out]};
  if (s.kind == VecStepKind::binary) {
    const float* y = p[s.in1];
    switch (s.bin) {
      case VecBinary::add: (s.alpha == 1.0f ? prog_map2<AddOneOp> : prog_map2<AddOp>)(x, y, o, s.alpha, len); break;
      case VecBinary::sub: (s.alpha == 1.0f ? prog_map2<SubOneOp> : prog_map2<SubOp>)(x, y, o, s.alpha, len); break;
      case VecBinary::mul: prog_map2<MulOp>(x, y, o, s.alpha, len); break;
      case VecBinary::div: prog_map2<DivOp>(x, y, o, s.alpha, len); break;
      case VecBinary::maximum: prog_map2<MaxOp>(x, y, o, s.alpha, len); break;
      case VecBinary::minimum: prog_map2<MinOp>(x, y, o, s.alpha, len); break;
      case VecBinary::count: break;
    }
    return;
  }
  const float* a = pro.a >= 0 ? p[pro.a] : nullptr;
  const float* b = pro.b >= 0 ? p[pro.b] : nullptr;
  switch (s.kind) {
    case VecStepKind::unary:
      switch (s.un) {
        case VecUnary::exp: prog_map1<ExpF>(x, a, b, o, len); break;
        case VecUnary::log: prog_map1<LogF>(x, a, b, o, len); break;
        case VecUnary::tanh: prog_map1<TanhF>(x, a, b, o, len); break;
        case VecUnary::sigmoid: prog_map1<SigmoidF>(x, a, b, o, len); break;
        case VecUnary::silu: prog_map1<SiluF>(x, a, b, o, len); break;
        case VecUnary::gelu_erf: prog_map1<GeluF>(x, a, b, o, len); break;
        case VecUnary::gelu_tanh: prog_map1<GeluTanhF>(x, a, b, o, len); break;
        case VecUnary::erf: prog_map1<ErfF>(x, a, b, o, len); break;
        case VecUnary::relu: prog_map1<ReluF>(x, a, b, o, len); break;
        case VecUnary::count: break;
      }
      break;
    case VecStepKind::neg: prog_map1<NegF>(x, a, b, o, len); break;
    case VecStepKind::abs: prog_map1<AbsF>(x, a, b, o, len); break;
    case VecStepKind::sqrt: prog_map1<SqrtF>(x, a, b, o, len); break;
    case VecStepKind::rsqrt: prog_map1<RsqrtF>(x, a, b, o, len); break;
    case VecStepKind::recip: prog_map1<RecipF>(x, a, b, o, len); break;
    case VecStepKind::binary:
    case VecStepKind::copy: prog_map1<NopF>(x, a, b, o, len); break;
  }
}

HWY_NOINLINE void program_v(const VecStep* steps, int nsteps, const VecOperand* ops, int nops, int64_t n) {
  if (n <= 0 || nops > kVecProgramMaxOperands) return;
  // One block slot per operand; scalars are broadcast into theirs once.
  HWY_ALIGN float slots[kVecProgramMaxOperands][kProgBlock];
  float* p[kVecProgramMaxOperands];
  float* m[kVecProgramMaxOperands];
  bool streamed[kVecProgramMaxOperands];
  int mems[kVecProgramMaxOperands], outs[kVecProgramMaxOperands];
  int nmems = 0, nouts = 0;
  bool any_stream = false;
  // Per-call state sized by the program, not by the limit (this runs once per row piece).
  int uses[kVecProgramMaxOperands];
  count_vec_uses(steps, nsteps, nops, uses);
  VecPrologue pro[kVecProgramMaxOperands];
  std::fill_n(pro, nsteps, VecPrologue{-1, -1, -1});
  bool skip[kVecProgramMaxOperands];
  std::fill_n(skip, nsteps, false);
  fold_vec_prologues(steps, nsteps, ops, uses, nops, pro, skip);
  constexpr uintptr_t kAlign = sizeof(float) * kLanes;  // Stream needs whole aligned vectors
  for (int k = 0; k < nops; ++k) {
    const VecOperand& o = ops[k];
    p[k] = slots[k];
    m[k] = nullptr;
    streamed[k] = o.out && o.stream && (reinterpret_cast<uintptr_t>(o.out) & (kAlign - 1)) == 0;
    any_stream = any_stream || streamed[k];
    if (o.in && o.scalar) std::fill(slots[k], slots[k] + kProgBlock, o.in[0]);
    else if (o.in) mems[nmems++] = k;
    if (o.out) outs[nouts++] = k;
  }
  int64_t i = 0;
  if (const int si = single_pass_step(steps, nsteps, ops, pro, skip); si >= 0) {
    // One pass over memory needs no slots: it runs over every whole sub-block in one call (no
    // per-block dispatch), prefetching its first input kPrefetchFloats ahead in the loop itself
    // (the hardware prefetcher alone fell behind under gelu's arithmetic: 15-20% of the
    // compiled gelu(x * w + b) out of cache). Only the tail takes the slots.
    for (int j = 0; j < nmems; ++j) p[mems[j]] = const_cast<float*>(ops[mems[j]].in);
    for (int j = 0; j < nouts; ++j) m[outs[j]] = ops[outs[j]].out;
    i = n / kProgSub * kProgSub;
    if (i > 0) prog_step(steps[si], pro[si], p, m, streamed, uses, i);
  }
  for (; i + kProgBlock <= n; i += kProgBlock) {
    for (int j = 0; j < nmems; ++j) {
      p[mems[j]] = const_cast<float*>(ops[mems[j]].in) + i;
      // The lines two blocks ahead, fetched while this block computes (also past the end: the
      // caller's next range usually follows, and a prefetch never faults).
      for (int e = 0; e < kProgBlock; e += 16) hwy::Prefetch(p[mems[j]] + 2 * kProgBlock + e);
    }
    for (int j = 0; j < nouts; ++j) m[outs[j]] = ops[outs[j]].out + i;
    for (int si = 0; si < nsteps; ++si)
      if (!skip[si]) prog_step(steps[si], pro[si], p, m, streamed, uses, kProgBlock);
  }
  if (i < n) {
    // The partial last block runs on slots only (inputs copied in, outputs copied out).
    const int64_t left = n - i, len = (left + kProgSub - 1) / kProgSub * kProgSub;
    for (int j = 0; j < nmems; ++j) {
      const int k = mems[j];
      std::memcpy(slots[k], ops[k].in + i, static_cast<size_t>(left) * sizeof(float));
      std::fill(slots[k] + left, slots[k] + len, 0.0f);
      p[k] = slots[k];
    }
    for (int j = 0; j < nouts; ++j) m[outs[j]] = nullptr;
    for (int si = 0; si < nsteps; ++si)
      if (!skip[si]) prog_step(steps[si], pro[si], p, m, streamed, uses, len);
    for (int j = 0; j < nouts; ++j)
      std::memcpy(ops[outs[j]].out + i, slots[outs[j]], static_cast<size_t>(left) * sizeof(float));
  }
  if (any_stream) hwy::FlushStream();
}

}  // namespace tpu::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
