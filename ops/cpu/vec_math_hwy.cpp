// The vectorized implementations of vec_math.h: one Highway source (vec_math_hwy-inl.h for the
// math and the one-op kernels, vec_program_hwy-inl.h for the fused executor) compiled here once
// per x86 target (AVX-512, AVX2, SSE4, and the baseline fallback: HWY_SCALAR, one lane, with
// Debian's Highway 1.0 and GCC 12, or EMU128 where Highway takes that), each reached only when
// the CPU has it; the choice is made once at run time (HWY_DYNAMIC_DISPATCH).
//
// SSSE3 is left out: every x86-64 CPU with SSSE3 but not SSE4 is over 15 years old, and each
// target costs compile time (the baseline target still covers such a CPU, correctly if slowly).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
// GCC 12's AVX-512 headers implement many intrinsics with a deliberately undefined source
// register, which -Wmaybe-uninitialized flags at -O3 (GCC bug 105593); not a real issue.
#ifndef __clang__  // a GCC-only warning (Clang warns about the unknown name)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/vec_math_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/cpu/vec_math.h"
#include "ops/cpu/vec_math_hwy-inl.h"
#include "ops/cpu/vec_program_hwy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tpu::ops::cpu::HWY_NAMESPACE {

const VecMathTable* table() {
  static const VecMathTable t = {
      HWY_TARGET == HWY_AVX3 ? "avx512" : HWY_TARGET == HWY_AVX2 ? "avx2" : HWY_TARGET == HWY_SSE4 ? "sse4" : "baseline",
      {unary_loop<ExpF>, unary_loop<LogF>, unary_loop<TanhF>, unary_loop<SigmoidF>, unary_loop<SiluF>,
       unary_loop<GeluF>, unary_loop<GeluTanhF>, unary_loop<ErfF>, unary_loop<ReluF>},
      {add_v, sub_v, binary_loop<MulOp>, binary_loop<DivOp>, binary_loop<MaxOp>, binary_loop<MinOp>},
      program_v,
  };
  return &t;
}

}  // namespace tpu::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <cstdlib>
#include <cstring>
#include <string>

#include "tpucore/core/cpu_features.h"
#include "tpucore/core/error.h"

namespace tpu::ops::cpu {

HWY_EXPORT(table);

namespace {

// The compiled targets, best first, with their tables.
struct Target {
  int64_t bit;
  const VecMathTable* (*table)();
};
constexpr Target kTargets[] = {
#if HWY_TARGETS & HWY_AVX3
    {HWY_AVX3, &N_AVX3::table},
#endif
#if HWY_TARGETS & HWY_AVX2
    {HWY_AVX2, &N_AVX2::table},
#endif
#if HWY_TARGETS & HWY_SSE4
    {HWY_SSE4, &N_SSE4::table},
#endif
#if HWY_TARGETS & HWY_EMU128
    {HWY_EMU128, &N_EMU128::table},
#endif
#if HWY_TARGETS & HWY_SCALAR
    {HWY_SCALAR, &N_SCALAR::table},
#endif
};

// Under TPU_CPU_FEATURES=generic only the portable (std::) table is offered.
bool forced_generic() {
  const char* f = std::getenv("TPU_CPU_FEATURES");
  return f && std::strcmp(f, "generic") == 0;
}

const VecMathTable* table_for(int64_t bit) {
  if (forced_generic() || (hwy::SupportedTargets() & bit) == 0) return nullptr;
  for (const Target& t : kTargets)
    if (t.bit == bit) return t.table();
  return nullptr;
}

}  // namespace

const VecMathTable* vec_math_avx512() { return table_for(HWY_AVX3); }
const VecMathTable* vec_math_avx2() { return table_for(HWY_AVX2); }

std::vector<const VecMathTable*> vec_math_targets() {
  std::vector<const VecMathTable*> r;
  for (const Target& t : kTargets)
    if (const VecMathTable* v = table_for(t.bit)) r.push_back(v);
  return r;
}

const VecMathTable& vec_math_capped(std::string_view isa) {
  static constexpr const char* kNames[] = {"avx512", "avx2", "sse4", "baseline", "scalar"};
  size_t cap = 0;
  while (cap < std::size(kNames) && isa != kNames[cap]) ++cap;
  TPU_CHECK(cap < std::size(kNames), "TPU_CPU_ISA={}: expected one of avx512, avx2, sse4, baseline, scalar",
            std::string(isa));
  if (!forced_generic()) {
    for (const VecMathTable* t : vec_math_targets()) {
      size_t rank = 0;
      while (rank < std::size(kNames) && std::strcmp(t->name, kNames[rank]) != 0) ++rank;
      if (rank >= cap) return *t;  // the best one at or below the cap
    }
  }
  return vec_math_scalar();
}

const VecMathTable& vec_math() {
  static const VecMathTable* t = [] {
    if (const char* isa = std::getenv("TPU_CPU_ISA"); isa && *isa) return &vec_math_capped(isa);
    if (forced_generic()) return &vec_math_scalar();
    return HWY_DYNAMIC_DISPATCH(table)();
  }();
  return *t;
}

}  // namespace tpu::ops::cpu

#endif  // HWY_ONCE
