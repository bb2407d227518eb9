// Small SIMD helpers shared by the cpu kernels (each compiled for the ISA it names, so a kernel
// of that ISA or a wider one may call it).
#pragma once

#include <immintrin.h>

namespace tpu::kernels {

// The sum of the 8 lanes of an AVX register: halves, then pairs, then the last two.
__attribute__((target("avx2"))) inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace tpu::kernels
