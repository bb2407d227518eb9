// int8 and int4 weight products with the rows of A quantized to int8 on AVX2: the
// Int8GemvPath::avx2q8 path of gemv_int8 and gemv_int4 (gemv_int8.h, gemv_int4.h), the one CPUs
// without AVX-512 VNNI take by default.
//
// The scheme is the vnni path's (gemv_vnni.cpp): each row of A quantized once per call in blocks
// of 32 values along K, d = max |a| / 127 and q = round(a / d) in [-127, 127] (ties to even), as
// llama.cpp's Q8_0 activations; exact integer sums per block, scaled by d times the weight's scale
// (the channel's for int8, the group's for int4) and accumulated in f32. The byte products are
// AVX2's: vpmaddubsw multiplies 32 unsigned bytes by 32 signed bytes and adds adjacent pairs
// into 16 int16 lanes (saturating), vpmaddwd against ones adds those pairs into 8 int32 lanes.
// - int8: |w| (unsigned, up to 128 for a weight of -128) against q carrying w's sign (vpsignb):
//   a pair sums to at most 2 * 128 * 127 = 32,512, never saturated. One block of 32 per step,
//   its 8 lanes all scaled by the block's d.
// - int4: per 64 weights (32 bytes: two packed blocks of 16, one per 128-bit lane) the nibbles
//   n = w + 8 (0..15) against q stored in the matching order (values 0-15 of both blocks, then
//   their values 16-31); the two pair-sum vectors are added in int16 (at most 4 * 15 * 127 =
//   7,620), then one vpmaddwd, onto the lanes' start values (-8 times the sums of the q each
//   lane takes): exact sums of w q, lanes 0-3 the first block's, 4-7 the second's.
// Then one conversion to f32 and one multiply-add by the lanes' scales (int4: d times the
// group's scale; f16 group scales are widened to f32 once per block of four weight rows). Rows of
// A in groups of up to four share each weight vector; four weight rows per block; blocks over
// the pool threads. Every output is the same sequence of operations whatever the number of rows.
// gemv_int4 takes this kernel below kInt4Q8ManyRows rows (and for any number in batch-invariant
// mode); more rows go to the float GEMM over dequantized panels, which is faster there.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/cpu/kernels/gemv_int4.h"
#include "ops/cpu/kernels/gemv_int8.h"
#include "ops/cpu/kernels/gemv_q8.h"
#include "ops/cpu/kernels/half_convert.h"
#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "ops/cpu/kernels/simd.h"

#define TPU_Q8AVX2 __attribute__((target("avx2,fma")))

TPU_INTRIN_DIAGNOSTICS_PUSH

namespace tpu::kernels {
namespace {

using q8::kCols;

TPU_Q8AVX2 inline float hmax256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// One block of 32 values of a row, a[k0 .. k0 + 32) (zeros past K), quantized as the vnni path
// quantizes it: the scale d = max |x| / 127 is returned and x * (127 / max |x|), rounded to the
// nearest integer, goes to q0 (values 0-15) and q1 (16-31). A NaN in the block makes the scale
// NaN, so that the outputs it touches are NaN.
TPU_Q8AVX2 inline float quantize_block32(const float* a, int64_t k0, int64_t K, __m128i& q0, __m128i& q1) {
  alignas(32) float tail[32];
  const float* src = a + std::min(k0, K);
  const int64_t n = std::clamp<int64_t>(K - k0, 0, 32);
  if (n < 32) {
    std::fill(tail, tail + 32, 0.0f);
    if (n > 0) std::memcpy(tail, src, static_cast<size_t>(n) * sizeof(float));
    src = tail;
  }
  __m256 x[4];
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    x[j] = _mm256_loadu_ps(src + 8 * j);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, x[j]));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x[j], x[j], _CMP_UNORD_Q));
  }
  float m = hmax256(amax);
  if (_mm256_movemask_ps(nan)) m = __builtin_nanf("");
  const float id = m > 0 && m <= 3.4e38f ? 127.0f / m : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  __m256i i[4];
  for (int j = 0; j < 4; ++j) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(x[j], vid));
  // packs work per 128-bit lane: the bytes come out as the 4-value groups 0-3 of i0, i1, i2, i3,
  // then 4-7 of each; the permute puts them back in order.
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
  const __m256i q = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  q0 = _mm256_castsi256_si128(q);
  q1 = _mm256_extracti128_si256(q, 1);
  return m / 127.0f;
}

// int8: q [M][kp] (signed, kp = 32 per block, zeros past K), ls [M][blocks] one d per block.
TPU_Q8AVX2 void quantize_rows_i8(int64_t M, int64_t K, const float* A, int64_t lda, q8::Rows& v) {
  const int64_t blocks = (K + 31) / 32;
  q8::reserve_rows(M, blocks, 32, v);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t b = 0; b < blocks; ++b) {
      __m128i q0, q1;
      v.ls[i * blocks + b] = quantize_block32(A + i * lda, b * 32, K, q0, q1);
      uint8_t* q = v.q + i * v.kp + b * 32;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q), q0);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), q1);
    }
}

// int4: per chunk of 64 values (two blocks of 32) 64 bytes: values 0-15 of both blocks (the low
// nibbles of the chunk's 32 weight bytes), then their values 16-31 (the high nibbles); lane
// scales ls [M][chunks][8] (lanes 0-3 the first block's d, 4-7 the second's) and start values
// init [M][chunks][8]. K padded with zeros to kp, a multiple of 64.
TPU_Q8AVX2 void quantize_rows_i4(int64_t M, int64_t K, const float* A, int64_t lda, q8::Rows& v) {
  const int64_t chunks = (K + 63) / 64;
  q8::reserve_rows(M, chunks, 64, v);
  const __m256i eights = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      uint8_t* q = v.q + i * v.kp + ch * 64;
      float* ls = v.ls + (i * chunks + ch) * 8;
      for (int b = 0; b < 2; ++b) {
        __m128i q0, q1;
        const float d = quantize_block32(A + i * lda, ch * 64 + b * 32, K, q0, q1);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * 16), q0);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 + b * 16), q1);
        for (int l = 0; l < 4; ++l) ls[b * 4 + l] = d;
      }
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
      const __m256i s8 = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(eights, lo),
                                                            _mm256_maddubs_epi16(eights, hi)), ones);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(v.init + (i * chunks + ch) * 8),
                          _mm256_sub_epi32(_mm256_setzero_si256(), s8));
    }
}

// C[r, c] = (scale[c] times, unless null) the sum of acc[r][c]'s lanes for the block's `cols`
// columns (every accumulator summed with constant indices, so that they stay in registers).
template <int R>
TPU_Q8AVX2 __attribute__((always_inline)) inline void store_sums(const __m256 (&acc)[R][kCols], int cols,
                                                                 const float* scale, float* C, int64_t ldc) {
  float sum[R][kCols];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) sum[r][c] = hsum256(acc[r][c]);
  q8::write_sums<R>(sum, cols, scale, C, ldc);
}

// One block of 32 weights of i8_group (`wv`: the kCols weight rows' bytes).
template <int R>
TPU_Q8AVX2 __attribute__((always_inline)) inline void i8_step(__m256 (&acc)[R][kCols], const q8::Rows& v, int64_t i0,
                                                              int64_t blocks, int64_t b, const __m256i (&wv)[kCols]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i aw[kCols];
#pragma GCC unroll 4
  for (int c = 0; c < kCols; ++c) aw[c] = _mm256_sign_epi8(wv[c], wv[c]);  // |w|, -128 as 128 unsigned
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(v.q + (i0 + r) * v.kp + b * 32));
    const __m256 d = _mm256_broadcast_ss(v.ls + (i0 + r) * blocks + b);
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) {
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[c], _mm256_sign_epi8(x, wv[c])), ones);
      acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), d, acc[r][c]);
    }
  }
}

// int8: R rows of A (quantized) by kCols weight rows of K values; `pf`: prefetch distance or 0.
template <int R>
TPU_Q8AVX2 void i8_group(int64_t K, const q8::Rows& v, int64_t i0, const int8_t* const* w, int cols,
                         const float* scale, float* C, int64_t ldc, int64_t pf) {
  const int64_t blocks = v.kp / 32, full = K / 32;
  __m256 acc[R][kCols];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_setzero_ps();
  __m256i wv[kCols];
  for (int64_t b = 0; b < full; ++b) {
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) {
      if (pf) _mm_prefetch(reinterpret_cast<const char*>(w[c] + b * 32 + pf), _MM_HINT_T0);
      wv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[c] + b * 32));
    }
    i8_step<R>(acc, v, i0, blocks, b, wv);
  }
  if (blocks > full) {  // the last, partial block: its bytes past K read as zeros
    alignas(32) int8_t tail[kCols][32] = {};
    for (int c = 0; c < kCols; ++c) std::memcpy(tail[c], w[c] + full * 32, static_cast<size_t>(K - full * 32));
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) wv[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail[c]));
    i8_step<R>(acc, v, i0, blocks, full, wv);
  }
  store_sums<R>(acc, cols, scale, C, ldc);
}

// The weight scales of chunk ch's two blocks of a row of f32 scales: lanes 0-3 the first
// block's, 4-7 the second's (0 past K). Kind 0: a group per block; 1: both blocks in one group
// (blocks per group even); 2: any.
template <int Kind>
TPU_Q8AVX2 __attribute__((always_inline)) inline __m256 i4_chunk_scales(const float* s, int64_t bpg, int64_t ch,
                                                                         bool whole) {
  if (Kind == 0 && whole)
    return _mm256_permutevar8x32_ps(
        _mm256_castps128_ps256(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 2 * ch)))),
        _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  if (Kind == 1 && whole) return _mm256_broadcast_ss(s + (2 * ch) / bpg);
  const float s0 = s[(2 * ch) / bpg], s1 = whole ? s[(2 * ch + 1) / bpg] : 0.0f;
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(s0)), _mm_set1_ps(s1), 1);
}

// int4: whole chunks of 64 weights (32 bytes of each weight row), a last chunk of one block
// apart; bpg: blocks of 32 per scale group; s: the weight rows' f32 scales.
template <int R, int Kind>
TPU_Q8AVX2 void i4_group(int64_t K, int64_t bpg, const q8::Rows& v, int64_t i0, const uint8_t* const* w,
                         const float* const* s, int cols, float* C, int64_t ldc, int64_t pf) {
  const int64_t chunks = v.kp / 64, full = K / 64;
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[R][kCols];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const bool whole = ch < full;
    __m256i lo[kCols], hi[kCols];
    __m256 sv[kCols];
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) {
      if (pf) _mm_prefetch(reinterpret_cast<const char*>(w[c] + ch * 32 + pf), _MM_HINT_T0);
      const __m256i raw =
          whole ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[c] + ch * 32))
                : _mm256_inserti128_si256(_mm256_setzero_si256(),
                                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[c] + ch * 32)), 0);
      lo[c] = _mm256_and_si256(raw, low4);
      hi[c] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      sv[c] = i4_chunk_scales<Kind>(s[c], bpg, ch, whole);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int64_t lane = ((i0 + r) * chunks + ch) * 8;
      const uint8_t* q = v.q + (i0 + r) * v.kp + ch * 64;
      const __m256i xlo = _mm256_load_si256(reinterpret_cast<const __m256i*>(q));
      const __m256i xhi = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 32));
      const __m256i init = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v.init + lane));
      const __m256 d = _mm256_loadu_ps(v.ls + lane);
#pragma GCC unroll 4
      for (int c = 0; c < kCols; ++c) {
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo[c], xlo), _mm256_maddubs_epi16(hi[c], xhi));
        const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(p, ones), init);
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, sv[c]), acc[r][c]);
      }
    }
  }
  store_sums<R>(acc, cols, nullptr, C, ldc);
}

template <int Kind>
void i4_rows(int rows, int64_t K, int64_t bpg, const q8::Rows& v, int64_t i, const uint8_t* const* w,
             const float* const* s, int cols, float* C, int64_t ldc, int64_t pf) {
  q8::with_rows(rows, [&](auto r) { i4_group<decltype(r)::value, Kind>(K, bpg, v, i, w, s, cols, C, ldc, pf); });
}

// The block's f16 scales widened once (the row groups after the first reuse them).
thread_local std::vector<float> t_scales;

}  // namespace

void gemv_int8_q8avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const int8_t* W, const float* scale,
                      float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  q8::Rows v;
  quantize_rows_i8(M, K, A, lda, v);
  q8::run_blocks(M, N, K, K, W, [&](int64_t j, int cols, int64_t i, int rows, int64_t ahead) {
    const int64_t pf = i == 0 ? ahead * kCols * K : 0;
    const int8_t* w[kCols];
    for (int c = 0; c < kCols; ++c) w[c] = W + (j + std::min(c, cols - 1)) * K;
    float* out = C + i * ldc + j;
    q8::with_rows(rows, [&](auto r) { i8_group<decltype(r)::value>(K, v, i, w, cols, scale + j, out, ldc, pf); });
  });
}

void gemv_int4_q8avx2(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
                      Int4Scales scale, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  q8::Rows v;
  quantize_rows_i4(M, K, A, lda, v);
  const int64_t groups = K / group, bpg = group / 32;
  const int kind = bpg == 1 ? 0 : bpg % 2 == 0 ? 1 : 2;
  q8::run_blocks(M, N, K, K / 2, W, [&](int64_t j, int cols, int64_t i, int rows, int64_t ahead) {
    const int64_t pf = i == 0 ? ahead * kCols * (K / 2) : 0;
    const uint8_t* w[kCols];
    const float* s[kCols];
    if (scale.is_f16() && i == 0) {  // the block's rows of scales, widened to f32
      t_scales.resize(static_cast<size_t>(kCols * groups));
      f16_to_f32(reinterpret_cast<const uint16_t*>(scale.half() + j * groups), t_scales.data(), cols * groups);
    }
    for (int c = 0; c < kCols; ++c) {
      const int64_t row = std::min(c, cols - 1);
      w[c] = W + (j + row) * (K / 2);
      s[c] = scale.is_f16() ? t_scales.data() + row * groups : scale.f32() + (j + row) * groups;
    }
    float* out = C + i * ldc + j;
    switch (kind) {
      case 0: i4_rows<0>(rows, K, bpg, v, i, w, s, cols, out, ldc, pf); break;
      case 1: i4_rows<1>(rows, K, bpg, v, i, w, s, cols, out, ldc, pf); break;
      default: i4_rows<2>(rows, K, bpg, v, i, w, s, cols, out, ldc, pf); break;
    }
  });
}

}  // namespace tpu::kernels

TPU_INTRIN_DIAGNOSTICS_POP
