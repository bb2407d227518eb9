// Warnings silenced around the cpu kernels that use AVX-512 / AVX2 intrinsics. GCC 12 reports the
// "undefined" pass-through vectors and upper halves inside its own intrinsics (_mm512_reduce_add_ps,
// the mask, unpack and widening conversions) as maybe-uninitialized, and at -O1 (the sanitizer
// build) as uninitialized: false positives. A kernel file opens the region with
// TPU_INTRIN_DIAGNOSTICS_PUSH after its includes and closes it with TPU_INTRIN_DIAGNOSTICS_POP.
#pragma once

#ifdef __clang__  // -Wmaybe-uninitialized is GCC's (Clang warns about the unknown name)
#define TPU_INTRIN_DIAGNOSTICS_PUSH \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#else
#define TPU_INTRIN_DIAGNOSTICS_PUSH                                          \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#endif
#define TPU_INTRIN_DIAGNOSTICS_POP _Pragma("GCC diagnostic pop")
