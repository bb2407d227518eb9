// int8 and int4 weight products with the rows of A quantized to int8 (AVX-512 VNNI, vpdpbusd):
// the Int8GemvPath::vnni path of gemv_int8 and gemv_int4 (gemv_int8.h, gemv_int4.h).
//
// Each row of A is quantized once per call in blocks of 32 values along K: the block's scale
// d = max |a| / 127 and q = round(a / d) in [-127, 127] (round to nearest even), as llama.cpp's
// Q8_0 activations. The products of a block are then exact integer sums, scaled by d times the
// weight's scale (the channel's for int8, the group's for int4) and accumulated in f32. The
// result is that of the dequantized weight times the quantized A: each value of A moves by at
// most d / 2, a relative 1/254 of its block's largest magnitude.
//
// One vpdpbusd multiplies 64 unsigned bytes by 64 signed bytes and adds groups of four into 16
// int32 lanes; lanes 0-7 cover one block of 32, lanes 8-15 the next. Per 64 weights and output:
// - int8: A offset to unsigned (q + 128) against the signed weight; the offset's share, 128 times
//   the weight's lane sums, is taken from a vpdpbusd of the weight with 128s (once per weight
//   vector, shared by the rows of A);
// - int4: per 128 weights (64 bytes: four packed blocks of 16 bytes, one per 128-bit lane), the
//   weight's nibbles n = w + 8 (unsigned: the low nibbles by a mask, weights 0-15 of each block,
//   the high ones by a shift and a mask, weights 16-31) against the signed q, whose rows are
//   stored in the matching order (values 0-15 of four blocks, then their values 16-31); two
//   vpdpbusd into the same lanes, which start from -8 times the lanes' sums of q (computed once
//   per row), so they are exact sums of w q, four lanes per block.
// Then one conversion to f32 and one multiply-add by the lanes' scales. Rows of A in groups of up
// to four share each weight vector; four weight rows per block; blocks over the pool threads.
// Every output is the same sequence of operations whatever the number of rows.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "ops/cpu/kernels/gemv.h"
#include "ops/cpu/kernels/gemv_int4.h"
#include "ops/cpu/kernels/gemv_int8.h"
#include "ops/cpu/kernels/gemv_q8.h"
#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "ops/cpu/kernels/scratch.h"
#include "tpucore/core/cpu_features.h"

#define TPU_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

TPU_INTRIN_DIAGNOSTICS_PUSH

namespace tpu::kernels {
namespace {

using q8::kCols;
using q8::kRows;
// The quantized rows: int8 (quantize_rows): K padded with zeros to kp, a multiple of 64, q
// offset by 128, ls [M][kp / 64][16]; int4: quantize_rows_q4.
using VnRows = q8::Rows;
using q8::reserve_rows;
using q8::scale_at;

// One block of 32 values of a row, a[k0 .. k0 + 32) (zeros past K), quantized like Q8_0: the
// scale d = max |x| / 127 is returned and the values x / d, rounded to the nearest integer, go
// to q0 (values 0-15) and q1 (16-31). A NaN in the block makes its scale NaN, so that the outputs
// it touches are NaN.
TPU_VNNI inline float quantize_block32(const float* a, int64_t k0, int64_t K, __m128i& q0, __m128i& q1) {
  const int64_t n = std::max<int64_t>(0, std::min<int64_t>(32, K - k0));
  const __mmask16 m0 = static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << n) - 1);
  const __mmask16 m1 = static_cast<__mmask16>(n >= 32 ? 0xffffu : n > 16 ? (1u << (n - 16)) - 1 : 0u);
  const __m512 x0 = _mm512_maskz_loadu_ps(m0, a + std::min(k0, K)), x1 = _mm512_maskz_loadu_ps(m1, a + std::min(k0 + 16, K));
  float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  if (_mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q)) amax = __builtin_nanf("");
  const float id = amax > 0 && amax <= 3.4e38f ? 127.0f / amax : 0.0f;
  const __m512 vid = _mm512_set1_ps(id);
  q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)));
  q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x1, vid)));
  return amax / 127.0f;
}

TPU_VNNI void quantize_rows(int64_t M, int64_t K, const float* A, int64_t lda, VnRows& v) {
  const int64_t chunks = (K + 63) / 64;
  reserve_rows(M, chunks, 64, v);
  for (int64_t i = 0; i < M; ++i) {
    const float* a = A + i * lda;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      uint8_t* q = v.q + i * v.kp + ch * 64;
      float* ls = v.ls + (i * chunks + ch) * 16;
      for (int h = 0; h < 2; ++h) {
        __m128i q0, q1;
        const float d = quantize_block32(a, ch * 64 + h * 32, K, q0, q1);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + h * 32), q0);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + h * 32 + 16), q1);
        for (int l = 0; l < 8; ++l) ls[h * 8 + l] = d;
      }
      _mm512_storeu_si512(q, _mm512_xor_si512(_mm512_loadu_si512(q), _mm512_set1_epi8(static_cast<char>(0x80))));
    }
  }
}

// C[r, c] = (scale[c] times, unless null) the sum of acc[r][c]'s lanes for the block's `cols`
// columns. Every accumulator is summed with constant indices: indexing them by the run-time
// `cols` would keep the whole array in memory, stored on every step of the loop before.
template <int R>
TPU_VNNI __attribute__((always_inline)) inline void store_sums(const __m512 (&acc)[R][kCols], int cols,
                                                               const float* scale, float* C, int64_t ldc) {
  float sum[R][kCols];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) sum[r][c] = _mm512_reduce_add_ps(acc[r][c]);
  q8::write_sums<R>(sum, cols, scale, C, ldc);
}

// One step of 64 values of vn8_group (m: the values present; `pf`: prefetch distance or 0).
template <int R>
TPU_VNNI __attribute__((always_inline)) inline void vn8_step(__m512 (&acc)[R][kCols], const VnRows& v, int64_t i0,
                                                             int64_t chunks, int64_t ch, __mmask64 m,
                                                             const int8_t* const* w, int64_t pf) {
  const int64_t k = ch * 64;
  const __m512i v128 = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i wv[kCols], off[kCols];
#pragma GCC unroll 4
  for (int c = 0; c < kCols; ++c) {
    if (pf) _mm_prefetch(reinterpret_cast<const char*>(w[c] + k + pf), _MM_HINT_T0);
    wv[c] = _mm512_maskz_loadu_epi8(m, w[c] + k);
    off[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v128, wv[c]);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m512i x = _mm512_load_si512(v.q + (i0 + r) * v.kp + k);
    const __m512 d = _mm512_load_ps(v.ls + ((i0 + r) * chunks + ch) * 16);
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) {
      const __m512i dot = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), x, wv[c]), off[c]);
      acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), d, acc[r][c]);
    }
  }
}

// int8: R rows of A (quantized, offset) by kCols weight rows of K values: whole steps of 64 in
// a loop whose only test is the loop-invariant prefetch one, a last partial step apart.
template <int R>
TPU_VNNI void vn8_group(int64_t K, const VnRows& v, int64_t i0, const int8_t* const* w, int cols, const float* scale,
                        float* C, int64_t ldc, int64_t pf) {
  const int64_t chunks = v.kp / 64, full = K / 64;
  __m512 acc[R][kCols];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm512_setzero_ps();
  if (pf)
    for (int64_t ch = 0; ch < full; ++ch) vn8_step<R>(acc, v, i0, chunks, ch, ~__mmask64{0}, w, pf);
  else
    for (int64_t ch = 0; ch < full; ++ch) vn8_step<R>(acc, v, i0, chunks, ch, ~__mmask64{0}, w, 0);
  if (chunks > full) vn8_step<R>(acc, v, i0, chunks, full, (__mmask64{1} << (K - full * 64)) - 1, w, pf);
  store_sums<R>(acc, cols, scale, C, ldc);
}

// int4: the rows of A quantized as above, laid out for the packed weight. Per chunk of 128
// values (four blocks of 32) 128 bytes: first the values 0-15 of the four blocks (16 bytes
// each, matching the low nibbles of the chunk's 64 weight bytes), then their values 16-31
// (matching the high nibbles); lane scales ls [M][kp / 128][16] with lane l the d of block l / 4
// (the 128-bit lane its products land in), and start values init (-8 times the sum of the q
// that a lane's products take: the weight's offset n = w + 8). K padded with zeros to kp, a
// multiple of 128.
TPU_VNNI void quantize_rows_q4(int64_t M, int64_t K, const float* A, int64_t lda, VnRows& v) {
  const int64_t chunks = (K + 127) / 128;
  reserve_rows(M, chunks, 128, v);
  for (int64_t i = 0; i < M; ++i) {
    const float* a = A + i * lda;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      uint8_t* q = v.q + i * v.kp + ch * 128;
      float* ls = v.ls + (i * chunks + ch) * 16;
      for (int b = 0; b < 4; ++b) {
        __m128i q0, q1;
        const float d = quantize_block32(a, ch * 128 + b * 32, K, q0, q1);
        _mm_store_si128(reinterpret_cast<__m128i*>(q + b * 16), q0);
        _mm_store_si128(reinterpret_cast<__m128i*>(q + 64 + b * 16), q1);
        for (int l = 0; l < 4; ++l) ls[b * 4 + l] = d;
      }
      const __m512i eights = _mm512_set1_epi8(8);
      const __m512i s8 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), eights, _mm512_load_si512(q)),
                                             eights, _mm512_load_si512(q + 64));
      _mm512_storeu_si512(v.init + (i * chunks + ch) * 16, _mm512_sub_epi32(_mm512_setzero_si512(), s8));
    }
  }
}

// The weight scales of the four blocks of chunk ch of a row, lane l holding block l / 4's
// (blocks past K: 0).
struct Q4Scales {
  int64_t K, bpg;
  int kind;  // 0: one group per block (a 16-byte load); 1: the chunk inside one group; 2: any
  int shift;
};

// Four consecutive scales in lanes 0-3 (the others unspecified).
TPU_VNNI __attribute__((always_inline)) inline __m512 load4_scales(const float* s) {
  return _mm512_castps128_ps512(_mm_loadu_ps(s));
}
TPU_VNNI __attribute__((always_inline)) inline __m512 load4_scales(const f16* s) {
  return _mm512_cvtph_ps(_mm256_zextsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s))));
}
// One scale in every lane.
TPU_VNNI __attribute__((always_inline)) inline __m512 broadcast_scale(const float* s) { return _mm512_set1_ps(*s); }
TPU_VNNI __attribute__((always_inline)) inline __m512 broadcast_scale(const f16* s) {
  return _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(s->bits)));
}

template <int Kind, class S>
TPU_VNNI __attribute__((always_inline)) inline __m512 q4_chunk_scales(const Q4Scales& g, const S* s, int64_t ch,
                                                                       bool full) {
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const int64_t b0 = ch * 4;
  if (Kind == 0 && full) return _mm512_permutexvar_ps(spread, load4_scales(s + b0));
  if (Kind == 1 && full) return broadcast_scale(s + (b0 >> g.shift));
  const int64_t nb = std::min<int64_t>(4, g.K / 32 - b0);
  alignas(16) float v[4] = {0, 0, 0, 0};
  for (int64_t b = 0; b < nb; ++b) v[b] = scale_at(s, (b0 + b) / g.bpg);
  return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_load_ps(v)));
}

// One chunk of 128 weights of vn4_group (`m`: the chunk's weight bytes present).
template <int R, int Kind, class S>
TPU_VNNI __attribute__((always_inline)) inline void vn4_step(__m512 (&acc)[R][kCols], const VnRows& v, int64_t i0,
                                                             int64_t chunks, int64_t ch, bool full, __mmask64 m,
                                                             const Q4Scales& g, const uint8_t* const* w,
                                                             const S* const* s, int64_t pf) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i lo[kCols], hi[kCols];
  __m512 sv[kCols];
#pragma GCC unroll 4
  for (int c = 0; c < kCols; ++c) {
    if (pf) _mm_prefetch(reinterpret_cast<const char*>(w[c] + ch * 64 + pf), _MM_HINT_T0);
    // 64 bytes: four blocks of 16, one per 128-bit lane; low nibbles are each block's weights
    // 0-15, high nibbles its weights 16-31.
    const __m512i raw = _mm512_maskz_loadu_epi8(m, w[c] + ch * 64);
    lo[c] = _mm512_and_si512(raw, low4);
    hi[c] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
    if (!(std::is_same_v<S, f16> && Kind == 0)) sv[c] = q4_chunk_scales<Kind>(g, s[c], ch, full);
  }
  if constexpr (std::is_same_v<S, f16> && Kind == 0) {
    if (full) {
      // The four columns' four f16 block scales (8 bytes each) widened by one vcvtph2ps, lanes
      // 4c..4c+3 column c's, then spread to column c's lanes.
      int64_t h[kCols];
#pragma GCC unroll 4
      for (int c = 0; c < kCols; ++c) std::memcpy(&h[c], s[c] + ch * 4, 8);
      const __m512 all = _mm512_cvtph_ps(_mm256_setr_epi64x(h[0], h[1], h[2], h[3]));
#pragma GCC unroll 4
      for (int c = 0; c < kCols; ++c)
        sv[c] = _mm512_permutexvar_ps(_mm512_add_epi32(_mm512_set1_epi32(4 * c),
                                                       _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)),
                                      all);
    } else {
#pragma GCC unroll 4
      for (int c = 0; c < kCols; ++c) sv[c] = q4_chunk_scales<Kind>(g, s[c], ch, full);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const int64_t lane = ((i0 + r) * chunks + ch) * 16;
    const uint8_t* q = v.q + (i0 + r) * v.kp + ch * 128;
    const __m512i xlo = _mm512_load_si512(q), xhi = _mm512_load_si512(q + 64);
    const __m512i init = _mm512_load_si512(v.init + lane);
    const __m512 d = _mm512_load_ps(v.ls + lane);
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) {
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, lo[c], xlo), hi[c], xhi);
      acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, sv[c]), acc[r][c]);
    }
  }
}

// int4 (K a multiple of 32): whole chunks of 128 weights (64 bytes of each weight row) in a
// loop whose only test is the loop-invariant prefetch one, a last partial chunk apart; Kind: the
// way the scales are read (Q4Scales).
template <int R, int Kind, class S>
TPU_VNNI void vn4_chunks(int64_t K, const Q4Scales& g, const VnRows& v, int64_t i0, const uint8_t* const* w,
                         const S* const* s, int cols, float* C, int64_t ldc, int64_t pf) {
  const int64_t chunks = v.kp / 128, full = K / 128;
  const __mmask64 all = ~__mmask64{0};
  __m512 acc[R][kCols];  // local (not a caller's array), so that they stay in registers
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm512_setzero_ps();
  if (pf)
    for (int64_t ch = 0; ch < full; ++ch) vn4_step<R, Kind, S>(acc, v, i0, chunks, ch, true, all, g, w, s, pf);
  else
    for (int64_t ch = 0; ch < full; ++ch) vn4_step<R, Kind, S>(acc, v, i0, chunks, ch, true, all, g, w, s, 0);
  if (chunks > full)
    vn4_step<R, Kind, S>(acc, v, i0, chunks, full, false, (__mmask64{1} << ((K - full * 128) / 2)) - 1, g, w, s, pf);
  store_sums<R>(acc, cols, nullptr, C, ldc);
}

template <int R, class S>
void vn4_group(int64_t K, const Q4Scales& g, const VnRows& v, int64_t i0, const uint8_t* const* w, const S* const* s,
               int cols, float* C, int64_t ldc, int64_t pf) {
  switch (g.kind) {
    case 0: vn4_chunks<R, 0, S>(K, g, v, i0, w, s, cols, C, ldc, pf); break;
    case 1: vn4_chunks<R, 1, S>(K, g, v, i0, w, s, cols, C, ldc, pf); break;
    default: vn4_chunks<R, 2, S>(K, g, v, i0, w, s, cols, C, ldc, pf); break;
  }
}

}  // namespace

bool int8_vnni_available() {
  const CpuFeatures& f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.fma && __builtin_cpu_supports("avx512vnni");
}

void gemv_int8_vnni(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const int8_t* W, const float* scale,
                    float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  VnRows v;
  quantize_rows(M, K, A, lda, v);
  q8::run_blocks(M, N, K, K, W, [&](int64_t j, int cols, int64_t i, int rows, int64_t ahead) {
    const int64_t pf = i == 0 ? ahead * kCols * K : 0;
    const int8_t* w[kCols];
    for (int c = 0; c < kCols; ++c) w[c] = W + (j + std::min(c, cols - 1)) * K;
    float* out = C + i * ldc + j;
    q8::with_rows(rows, [&](auto r) { vn8_group<decltype(r)::value>(K, v, i, w, cols, scale + j, out, ldc, pf); });
  });
}

namespace {

// gemv_int4_vnni over scales of type S (f32 or f16).
template <class S>
void vn4_run(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
             const S* scale, float* C, int64_t ldc) {
  VnRows v;
  quantize_rows_q4(M, K, A, lda, v);
  const int64_t groups = K / group;
  Q4Scales g{K, group / 32, 2, 0};
  if (group == 32) g.kind = 0;
  else if ((g.bpg & (g.bpg - 1)) == 0 && g.bpg >= 4) {  // a power of two of at least 4 blocks
    g.kind = 1;
    g.shift = __builtin_ctzll(static_cast<unsigned long long>(g.bpg));
  }
  q8::run_blocks(M, N, K, K / 2, W, [&](int64_t j, int cols, int64_t i, int rows, int64_t ahead) {
    const int64_t pf = i == 0 ? ahead * kCols * (K / 2) : 0;
    const uint8_t* w[kCols];
    const S* s[kCols];
    for (int c = 0; c < kCols; ++c) {
      const int64_t row = j + std::min(c, cols - 1);
      w[c] = W + row * (K / 2);
      s[c] = scale + row * groups;
    }
    float* out = C + i * ldc + j;
    q8::with_rows(rows, [&](auto r) { vn4_group<decltype(r)::value, S>(K, g, v, i, w, s, cols, out, ldc, pf); });
  });
}

}  // namespace

void gemv_int4_vnni(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
                    Int4Scales scale, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (scale.is_f16())
    vn4_run(M, N, K, group, A, lda, W, scale.half(), C, ldc);
  else
    vn4_run(M, N, K, group, A, lda, W, scale.f32(), C, ldc);
}

namespace q8 {

namespace {
thread_local detail::ScratchBuffer t_rows;
}  // namespace

void reserve_rows(int64_t M, int64_t chunks, int64_t chunk, Rows& v) {
  v.kp = chunks * chunk;
  const size_t qbytes = static_cast<size_t>(M * v.kp), lanes = static_cast<size_t>(M * chunks * 16);
  auto* base = static_cast<uint8_t*>(t_rows.get(qbytes + lanes * 8));
  v.q = base;
  v.ls = reinterpret_cast<float*>(base + qbytes);
  v.init = reinterpret_cast<int32_t*>(base + qbytes + lanes * 4);
}

}  // namespace q8

}  // namespace tpu::kernels

TPU_INTRIN_DIAGNOSTICS_POP
