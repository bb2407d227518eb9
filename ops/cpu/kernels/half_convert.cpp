// f16 <-> f32 runs (half_convert.h).
#include "ops/cpu/kernels/half_convert.h"

#include <cpuid.h>
#include <immintrin.h>

#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "tpucore/core/cpu_features.h"

#define TPU_HALF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))
#define TPU_HALF_F16C __attribute__((target("avx2,f16c")))

TPU_INTRIN_DIAGNOSTICS_PUSH

namespace tpu::kernels {
namespace {

enum class Isa { scalar, f16c, avx512 };

Isa isa() {
  static const Isa v = [] {
    const CpuFeatures& f = cpu_features();
    if (f.avx512f && f.avx512bw && f.avx512vl) return Isa::avx512;
    unsigned a = 0, b = 0, c = 0, d = 0;  // F16C: cpuid leaf 1, ecx bit 29
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u) != 0;
    return f.avx2 && f16c ? Isa::f16c : Isa::scalar;
  }();
  return v;
}

// The AVX functions below do not end with a call of these: GCC compiles such a call as a tail
// jump without vzeroupper, and the caller's SSE code then runs with dirty upper register halves.
void widen_scalar(const uint16_t* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = f16::from_bits(s[i]).to_f32();
}
void narrow_scalar(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = f16::from_f32(s[i]);
}

TPU_HALF_AVX512 void widen_avx512(const uint16_t* s, float* d, int64_t n) {
  const __m256i e = _mm256_set1_epi16(0x7c00);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    if (_mm256_cmpeq_epi16_mask(_mm256_and_si256(h, e), e)) {  // Inf / NaN: f16's own conversion
      widen_scalar(s + i, d + i, 16);
      continue;
    }
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(h));
  }
  for (; i < n; ++i) d[i] = f16::from_bits(s[i]).to_f32();  // inline: see widen_scalar
}

TPU_HALF_AVX512 void narrow_avx512(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(s + i);
    if (_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q)) {  // NaN: f16's own quiet NaN
      narrow_scalar(s + i, d + i, 16);
      continue;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) d[i] = f16::from_f32(s[i]);  // inline: see widen_scalar
}

TPU_HALF_F16C void widen_f16c(const uint16_t* s, float* d, int64_t n) {
  const __m128i e = _mm_set1_epi16(0x7c00);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    if (_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(h, e), e))) {
      widen_scalar(s + i, d + i, 8);
      continue;
    }
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) d[i] = f16::from_bits(s[i]).to_f32();  // inline: see widen_scalar
}

TPU_HALF_F16C void narrow_f16c(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(s + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))) {
      narrow_scalar(s + i, d + i, 8);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) d[i] = f16::from_f32(s[i]);  // inline: see widen_scalar
}

}  // namespace

void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  switch (isa()) {
    case Isa::avx512: return widen_avx512(src, dst, n);
    case Isa::f16c: return widen_f16c(src, dst, n);
    default: return widen_scalar(src, dst, n);
  }
}

void f32_to_f16(const float* src, uint16_t* dst, int64_t n) {
  switch (isa()) {
    case Isa::avx512: return narrow_avx512(src, dst, n);
    case Isa::f16c: return narrow_f16c(src, dst, n);
    default: return narrow_scalar(src, dst, n);
  }
}

void f16_to_f32_f16c(const uint16_t* src, float* dst, int64_t n) { widen_f16c(src, dst, n); }
void f32_to_f16_f16c(const float* src, uint16_t* dst, int64_t n) { narrow_f16c(src, dst, n); }

}  // namespace tpu::kernels

TPU_INTRIN_DIAGNOSTICS_POP
