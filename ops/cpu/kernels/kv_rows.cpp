#include "ops/cpu/kernels/kv_rows.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "ops/cpu/kernels/simd.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/float8.h"

TPU_INTRIN_DIAGNOSTICS_PUSH

namespace tpu::kernels {

float kv_quantize_row(const float* x, int64_t d, bool fp8, uint8_t* q) {
  float amax = 0;
  bool finite = true;
  for (int64_t e = 0; e < d; ++e) {
    amax = std::max(amax, std::fabs(x[e]));
    finite = finite && std::isfinite(x[e]);
  }
  const float qmax = fp8 ? f8e4m3::kMax : 127.0f;
  const float s = !finite ? NAN : amax > 0 ? amax / qmax : 1.0f;
  for (int64_t e = 0; e < d; ++e) {
    const float y = finite ? std::clamp(x[e] / s, -qmax, qmax) : 0.0f;
    q[e] = fp8 ? f8e4m3::from_f32(y) : static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(y)));
  }
  return s;
}

namespace {

inline float widen1(uint8_t b, bool fp8) {
  return fp8 ? f8e4m3::from_bits(b).to_f32() : static_cast<float>(static_cast<int8_t>(b));
}

// ---- portable ----

template <int GN>
void key_dots_block_scalar(const uint8_t* k, bool fp8, int64_t d, const float* q, int64_t q_stride, float* dots) {
  for (int g = 0; g < GN; ++g) dots[g] = 0;
  for (int64_t e = 0; e < d; ++e) {
    const float x = widen1(k[e], fp8);
    for (int g = 0; g < GN; ++g) dots[g] += q[g * q_stride + e] * x;
  }
}

template <int GN>
void weighted_values_block_scalar(const uint8_t* v, bool fp8, int64_t d, const int64_t* pos, int64_t count,
                                  const float* w, int64_t group, float* out, int64_t out_stride) {
  // GN of the group's output rows: their weights are w[c * group + 0 .. GN).
  #pragma GCC unroll 4
  for (int g = 0; g < GN; ++g) std::fill_n(out + g * out_stride, d, 0.0f);
  for (int64_t c = 0; c < count; ++c)
    for (int64_t e = 0; e < d; ++e) {
      const float x = widen1(v[pos[c] * d + e], fp8);
      #pragma GCC unroll 4
      for (int g = 0; g < GN; ++g) out[g * out_stride + e] += w[c * group + g] * x;
    }
}

// e4m3 bytes to f32 by way of f16: the sign to bit 15 and the seven exponent and mantissa bits
// to bits 7..13 make the f16 of 2^-8 times the value (normal and subnormal alike), which
// vcvtph2ps widens exactly; times 256 gives the value. The NaN pattern (all seven bits set)
// would read as 1.875 * 256, so it is replaced by NaN.
// The AVX code below calls no portable function: GCC can turn such a call into a tail jump
// without vzeroupper, and the caller's SSE code then runs with dirty upper halves (several times
// slower).

// ---- AVX-512 ----
#define TPU_KV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))

TPU_KV_AVX512 inline __m512 widen16_avx512(__m128i b, bool fp8) {
  if (!fp8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  const __m256i h = _mm256_cvtepu8_epi16(b);
  const __m256i mag = _mm256_and_si256(h, _mm256_set1_epi16(0x7F));
  const __m256i half = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8),
                                       _mm256_slli_epi16(mag, 7));
  const __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(half), _mm512_set1_ps(256.0f));
  return _mm512_mask_mov_ps(f, _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F)), _mm512_set1_ps(NAN));
}

// Bytes [e, e + 16) of a row of d (the lanes past d zero) widened, and the mask of the lanes in the row.
TPU_KV_AVX512 inline __m512 load_row16(const uint8_t* r, int64_t e, int64_t d, bool fp8, __mmask16& m) {
  const int64_t n = std::min<int64_t>(16, d - e);
  m = static_cast<__mmask16>(n == 16 ? 0xFFFFu : (1u << n) - 1u);
  return widen16_avx512(_mm_maskz_loadu_epi8(m, r + e), fp8);
}

// GN query (output) rows at a time: a compile-time count keeps the sums in registers.
template <int GN>
TPU_KV_AVX512 void key_dots_block_avx512(const uint8_t* k, bool fp8, int64_t d, const float* q, int64_t q_stride,
                                                float* dots) {
  __m512 acc[GN];
  #pragma GCC unroll 4
  for (int g = 0; g < GN; ++g) acc[g] = _mm512_setzero_ps();
  for (int64_t e = 0; e < d; e += 16) {
    __mmask16 m;
    const __m512 x = load_row16(k, e, d, fp8, m);
    #pragma GCC unroll 4
    for (int g = 0; g < GN; ++g) acc[g] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + g * q_stride + e), x, acc[g]);
  }
  #pragma GCC unroll 4
  for (int g = 0; g < GN; ++g) dots[g] = _mm512_reduce_add_ps(acc[g]);
}


template <int GN>
TPU_KV_AVX512 void weighted_values_block_avx512(const uint8_t* v, bool fp8, int64_t d, const int64_t* pos,
                                                       int64_t count, const float* w, int64_t group, float* out,
                                                       int64_t out_stride) {
  for (int64_t e = 0; e < d; e += 16) {
    __m512 acc[GN];
    #pragma GCC unroll 4
    for (int g = 0; g < GN; ++g) acc[g] = _mm512_setzero_ps();
    __mmask16 m = static_cast<__mmask16>(d - e >= 16 ? 0xFFFFu : (1u << (d - e)) - 1u);
    for (int64_t c = 0; c < count; ++c) {
      const __m512 x = load_row16(v + pos[c] * d, e, d, fp8, m);
      const float* wc = w + c * group;
      #pragma GCC unroll 4
      for (int g = 0; g < GN; ++g) acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(wc[g]), x, acc[g]);
    }
    #pragma GCC unroll 4
    for (int g = 0; g < GN; ++g) _mm512_mask_storeu_ps(out + g * out_stride + e, m, acc[g]);
  }
}


// ---- AVX2 ----
#define TPU_KV_AVX2 __attribute__((target("avx2,fma,f16c")))

TPU_KV_AVX2 inline __m256 widen8_avx2(const uint8_t* r, bool fp8) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r));
  if (!fp8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  const __m128i h = _mm_cvtepu8_epi16(b);
  const __m128i mag = _mm_and_si128(h, _mm_set1_epi16(0x7F));
  const __m128i half = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x80)), 8), _mm_slli_epi16(mag, 7));
  const __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(256.0f));
  const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7F))));
  return _mm256_blendv_ps(f, _mm256_set1_ps(NAN), nan);
}

template <int GN>
TPU_KV_AVX2 void key_dots_block_avx2(const uint8_t* k, bool fp8, int64_t d, const float* q, int64_t q_stride,
                                            float* dots) {
  const int64_t d8 = d / 8 * 8;
  __m256 acc[GN];
  #pragma GCC unroll 4
  for (int g = 0; g < GN; ++g) acc[g] = _mm256_setzero_ps();
  for (int64_t e = 0; e < d8; e += 8) {
    const __m256 x = widen8_avx2(k + e, fp8);
    #pragma GCC unroll 4
    for (int g = 0; g < GN; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * q_stride + e), x, acc[g]);
  }
  #pragma GCC unroll 4
  for (int g = 0; g < GN; ++g) {
    float tail = 0;
    for (int64_t e = d8; e < d; ++e) tail += q[g * q_stride + e] * widen1(k[e], fp8);
    dots[g] = hsum256(acc[g]) + tail;
  }
}


template <int GN>
TPU_KV_AVX2 void weighted_values_block_avx2(const uint8_t* v, bool fp8, int64_t d, const int64_t* pos,
                                                   int64_t count, const float* w, int64_t group, float* out,
                                                   int64_t out_stride) {
  const int64_t d8 = d / 8 * 8;
  for (int64_t e = 0; e < d8; e += 8) {
    __m256 acc[GN];
    #pragma GCC unroll 4
    for (int g = 0; g < GN; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t c = 0; c < count; ++c) {
      const __m256 x = widen8_avx2(v + pos[c] * d + e, fp8);
      const float* wc = w + c * group;
      #pragma GCC unroll 4
      for (int g = 0; g < GN; ++g) acc[g] = _mm256_fmadd_ps(_mm256_set1_ps(wc[g]), x, acc[g]);
    }
    #pragma GCC unroll 4
    for (int g = 0; g < GN; ++g) _mm256_storeu_ps(out + g * out_stride + e, acc[g]);
  }
  for (int64_t e = d8; e < d; ++e)
    #pragma GCC unroll 4
    for (int g = 0; g < GN; ++g) {
      float sum = 0;
      for (int64_t c = 0; c < count; ++c) sum += w[c * group + g] * widen1(v[pos[c] * d + e], fp8);
      out[g * out_stride + e] = sum;
    }
}


// The kernels of one ISA for 1, 2, 3 and 4 rows of the group at a time (index GN - 1).
struct RowFns {
  void (*key[4])(const uint8_t*, bool, int64_t, const float*, int64_t, float*);
  void (*value[4])(const uint8_t*, bool, int64_t, const int64_t*, int64_t, const float*, int64_t, float*, int64_t);
};

const RowFns& row_fns() {
  static const RowFns fns = [] {
    const CpuFeatures& f = cpu_features();
    unsigned a = 0, b = 0, c = 0, d = 0;  // F16C: cpuid leaf 1, ecx bit 29 (clang has no "f16c" for __builtin_cpu_supports)
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u) != 0;
    if (f.avx512f && f.avx512bw && f.avx512vl && f.fma && f16c)
      return RowFns{{key_dots_block_avx512<1>, key_dots_block_avx512<2>, key_dots_block_avx512<3>, key_dots_block_avx512<4>},
                    {weighted_values_block_avx512<1>, weighted_values_block_avx512<2>, weighted_values_block_avx512<3>,
                     weighted_values_block_avx512<4>}};
    if (f.avx2 && f.fma && f16c)
      return RowFns{{key_dots_block_avx2<1>, key_dots_block_avx2<2>, key_dots_block_avx2<3>, key_dots_block_avx2<4>},
                    {weighted_values_block_avx2<1>, weighted_values_block_avx2<2>, weighted_values_block_avx2<3>,
                     weighted_values_block_avx2<4>}};
    return RowFns{{key_dots_block_scalar<1>, key_dots_block_scalar<2>, key_dots_block_scalar<3>, key_dots_block_scalar<4>},
                  {weighted_values_block_scalar<1>, weighted_values_block_scalar<2>, weighted_values_block_scalar<3>,
                   weighted_values_block_scalar<4>}};
  }();
  return fns;
}

}  // namespace

void kv_key_dots(const uint8_t* k, bool fp8, int64_t d, const float* q, int64_t q_stride, int64_t group, float* dots) {
  const RowFns& f = row_fns();
  for (int64_t g = 0; g < group; g += 4)
    f.key[std::min<int64_t>(4, group - g) - 1](k, fp8, d, q + g * q_stride, q_stride, dots + g);
}

void kv_weighted_values(const uint8_t* v, bool fp8, int64_t d, const int64_t* pos, int64_t count, const float* w,
                        int64_t group, float* out, int64_t out_stride) {
  const RowFns& f = row_fns();
  for (int64_t g = 0; g < group; g += 4)
    f.value[std::min<int64_t>(4, group - g) - 1](v, fp8, d, pos, count, w + g, group, out + g * out_stride, out_stride);
}

}  // namespace tpu::kernels

TPU_INTRIN_DIAGNOSTICS_POP
