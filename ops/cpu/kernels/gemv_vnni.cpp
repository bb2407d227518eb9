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
// - int4: the weight's nibbles n = w + 8 (unsigned, unpacked in registers: low nibbles of a 16-byte
//   block are its weights 0-15, high nibbles 16-31) against the signed q; the lane sums start
//   from -8 times the lanes' sums of q (computed once per row), so they are exact sums of w q.
// Then one conversion to f32 and one multiply-add by the lanes' scales. Rows of A in groups of up
// to four share each weight vector; four weight rows per block; blocks over the pool threads.
// Every output is the same sequence of operations whatever the number of rows.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "ops/cpu/kernels/gemv.h"
#include "ops/cpu/kernels/gemv_int4.h"
#include "ops/cpu/kernels/gemv_int8.h"
#include "ops/cpu/kernels/scratch.h"
#include "tpucore/core/cpu_features.h"

#define TPU_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

#pragma GCC diagnostic push
#ifndef __clang__
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace tpu::kernels {
namespace {

constexpr int kVnCols = 4;  // weight rows per block
constexpr int kVnRows = 4;  // rows of A per group

// The quantized rows of A: q [M][kp] bytes (K padded with zeros to kp, a multiple of 64; offset
// by 128 for int8), lane scales ls [M][kp / 64][16] (d of the lane's block), and for int4 the
// lane start values init [M][kp / 64][16] (-8 times the lane's sum of q).
struct VnRows {
  int64_t kp = 0;
  uint8_t* q = nullptr;
  float* ls = nullptr;
  int32_t* init = nullptr;
};

thread_local detail::ScratchBuffer t_vnni_rows;

TPU_VNNI void quantize_rows(int64_t M, int64_t K, const float* A, int64_t lda, bool offset, VnRows& v) {
  const int64_t chunks = (K + 63) / 64;
  v.kp = chunks * 64;
  const size_t qbytes = static_cast<size_t>(M * v.kp), lanes = static_cast<size_t>(M * chunks * 16);
  auto* base = static_cast<uint8_t*>(t_vnni_rows.get(qbytes + lanes * 8));
  v.q = base;
  v.ls = reinterpret_cast<float*>(base + qbytes);
  v.init = reinterpret_cast<int32_t*>(base + qbytes + lanes * 4);
  for (int64_t i = 0; i < M; ++i) {
    const float* a = A + i * lda;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      uint8_t* q = v.q + i * v.kp + ch * 64;
      float* ls = v.ls + (i * chunks + ch) * 16;
      for (int h = 0; h < 2; ++h) {
        const int64_t k0 = ch * 64 + h * 32;
        const int64_t n = std::max<int64_t>(0, std::min<int64_t>(32, K - k0));
        const __mmask16 m0 = static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << n) - 1);
        const __mmask16 m1 = static_cast<__mmask16>(n >= 32 ? 0xffffu : n > 16 ? (1u << (n - 16)) - 1 : 0u);
        const __m512 x0 = _mm512_maskz_loadu_ps(m0, a + std::min(k0, K)),
                     x1 = _mm512_maskz_loadu_ps(m1, a + std::min(k0 + 16, K));
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        // NaN in the block: its scale NaN, so that the outputs it touches are NaN.
        if (_mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q)) amax = __builtin_nanf("");
        const float d = amax / 127.0f;
        const float id = amax > 0 && amax <= 3.4e38f ? 127.0f / amax : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        const __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)));
        const __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x1, vid)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + h * 32), q0);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + h * 32 + 16), q1);
        for (int l = 0; l < 8; ++l) ls[h * 8 + l] = d;
      }
      const __m512i qv = _mm512_loadu_si512(q);
      if (offset) {
        _mm512_storeu_si512(q, _mm512_xor_si512(qv, _mm512_set1_epi8(static_cast<char>(0x80))));
      } else {
        const __m512i s8 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), qv);
        _mm512_storeu_si512(v.init + (i * chunks + ch) * 16, _mm512_sub_epi32(_mm512_setzero_si512(), s8));
      }
    }
  }
}

// One step of 64 values of vn8_group (m: the values present; `pf`: prefetch distance or 0).
template <int R>
TPU_VNNI __attribute__((always_inline)) inline void vn8_step(__m512 (&acc)[R][kVnCols], const VnRows& v, int64_t i0,
                                                             int64_t chunks, int64_t ch, __mmask64 m,
                                                             const int8_t* const* w, int64_t pf) {
  const int64_t k = ch * 64;
  const __m512i v128 = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i wv[kVnCols], off[kVnCols];
#pragma GCC unroll 4
  for (int c = 0; c < kVnCols; ++c) {
    if (pf) _mm_prefetch(reinterpret_cast<const char*>(w[c] + k + pf), _MM_HINT_T0);
    wv[c] = _mm512_maskz_loadu_epi8(m, w[c] + k);
    off[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v128, wv[c]);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m512i x = _mm512_load_si512(v.q + (i0 + r) * v.kp + k);
    const __m512 d = _mm512_load_ps(v.ls + ((i0 + r) * chunks + ch) * 16);
#pragma GCC unroll 4
    for (int c = 0; c < kVnCols; ++c) {
      const __m512i dot = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), x, wv[c]), off[c]);
      acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), d, acc[r][c]);
    }
  }
}

// int8: R rows of A (quantized, offset) by kVnCols weight rows of K values: whole steps of 64 in
// a loop whose only test is the loop-invariant prefetch one, a last partial step apart.
template <int R>
TPU_VNNI void vn8_group(int64_t K, const VnRows& v, int64_t i0, const int8_t* const* w, int cols, const float* scale,
                        float* C, int64_t ldc, int64_t pf) {
  const int64_t chunks = v.kp / 64, full = K / 64;
  __m512 acc[R][kVnCols];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kVnCols; ++c) acc[r][c] = _mm512_setzero_ps();
  if (pf)
    for (int64_t ch = 0; ch < full; ++ch) vn8_step<R>(acc, v, i0, chunks, ch, ~__mmask64{0}, w, pf);
  else
    for (int64_t ch = 0; ch < full; ++ch) vn8_step<R>(acc, v, i0, chunks, ch, ~__mmask64{0}, w, 0);
  if (chunks > full) vn8_step<R>(acc, v, i0, chunks, full, (__mmask64{1} << (K - full * 64)) - 1, w, pf);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) C[r * ldc + c] = scale[c] * _mm512_reduce_add_ps(acc[r][c]);
}

// One step of 64 weights (two blocks of 32; `two` false: one block left) of vn4_group, with
// the blocks' group indices g0, g1.
template <int R>
TPU_VNNI __attribute__((always_inline)) inline void vn4_step(__m512 (&acc)[R][kVnCols], const VnRows& v, int64_t i0,
                                                             int64_t chunks, int64_t ch, bool two, int64_t g0,
                                                             int64_t g1, const uint8_t* const* w,
                                                             const float* const* s) {
  const int64_t k = ch * 64;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i nib[kVnCols];
  __m512 sv[kVnCols];
#pragma GCC unroll 4
  for (int c = 0; c < kVnCols; ++c) {
    const __m256i raw = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[c] + k / 2))
                            : _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[c] + k / 2)));
    // 128-bit lanes [block 0, block 0, block 1, block 1]; lanes 1 and 3 shifted to their high nibbles.
    const __m512i t = _mm512_shuffle_i64x2(_mm512_castsi256_si512(raw), _mm512_castsi256_si512(raw), 0x50);
    nib[c] = _mm512_and_si512(_mm512_mask_srli_epi16(t, 0xFF00FF00u, t, 4), low4);
    sv[c] = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s[c][g0]), _mm512_set1_ps(two ? s[c][g1] : 0.0f));
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const int64_t lane = ((i0 + r) * chunks + ch) * 16;
    const __m512i x = _mm512_load_si512(v.q + (i0 + r) * v.kp + k);
    const __m512i init = _mm512_load_si512(v.init + lane);
    const __m512 d = _mm512_load_ps(v.ls + lane);
#pragma GCC unroll 4
    for (int c = 0; c < kVnCols; ++c) {
      const __m512i dot = _mm512_dpbusd_epi32(init, nib[c], x);
      acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, sv[c]), acc[r][c]);
    }
  }
}

// int4 (K a multiple of 32): the packed 16-byte blocks of 32 weights, two per step of 64. The
// loop over whole steps carries no per-step test but the prefetch of every other step (the
// scalar bookkeeping of a step is a large share of its instructions); a last half step apart.
template <int R>
TPU_VNNI void vn4_group(int64_t K, int64_t group, const VnRows& v, int64_t i0, const uint8_t* const* w,
                        const float* const* s, int cols, float* C, int64_t ldc, int64_t pf) {
  const int64_t chunks = v.kp / 64, full = K / 64;
  __m512 acc[R][kVnCols];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kVnCols; ++c) acc[r][c] = _mm512_setzero_ps();
  // The group of block b (32 weights) is b / (group / 32): a shift when that is a power of two
  // (two integer divisions per step cost about as much as the step's arithmetic).
  const int64_t bpg = group / 32;
  const bool pow2 = (bpg & (bpg - 1)) == 0;
  const int shift = __builtin_ctzll(static_cast<unsigned long long>(bpg));
  const uint8_t* const p[kVnCols] = {w[0] + pf, w[1] + pf, w[2] + pf, w[3] + pf};
  if (pow2) {
    int64_t ch = 0;
    for (; ch + 2 <= full; ch += 2) {  // two steps: one 64-byte line of each weight row
      if (pf)
#pragma GCC unroll 4
        for (int c = 0; c < kVnCols; ++c) _mm_prefetch(reinterpret_cast<const char*>(p[c] + ch * 32), _MM_HINT_T0);
      vn4_step<R>(acc, v, i0, chunks, ch, true, (2 * ch) >> shift, (2 * ch + 1) >> shift, w, s);
      vn4_step<R>(acc, v, i0, chunks, ch + 1, true, (2 * ch + 2) >> shift, (2 * ch + 3) >> shift, w, s);
    }
    if (ch < full) vn4_step<R>(acc, v, i0, chunks, ch, true, (2 * ch) >> shift, (2 * ch + 1) >> shift, w, s);
  } else {
    for (int64_t ch = 0; ch < full; ++ch) vn4_step<R>(acc, v, i0, chunks, ch, true, 2 * ch / bpg, (2 * ch + 1) / bpg, w, s);
  }
  if (chunks > full) vn4_step<R>(acc, v, i0, chunks, full, false, 2 * full / bpg, 2 * full / bpg, w, s);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) C[r * ldc + c] = _mm512_reduce_add_ps(acc[r][c]);
}

// Blocks of kVnCols weight rows over the pool threads; group_fn(j, cols, i, rows, next) for every
// group of rows, `next` telling whether the thread's next block follows (its weight rows are
// then prefetched by the block's first group: the hardware prefetchers start over on every row).
template <class F>
void vn_run(int64_t M, int64_t N, int64_t K, F&& group_fn) {
  const int64_t blocks = (N + kVnCols - 1) / kVnCols;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 17) / std::max<int64_t>(1, K * M * kVnCols));
  detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j = b * kVnCols;
      const int cols = static_cast<int>(std::min<int64_t>(kVnCols, N - j));
      for (int64_t i = 0; i < M; i += kVnRows)
        group_fn(j, cols, i, static_cast<int>(std::min<int64_t>(kVnRows, M - i)), b + 1 < b1);
    }
  });
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
  quantize_rows(M, K, A, lda, true, v);
  vn_run(M, N, K, [&](int64_t j, int cols, int64_t i, int rows, bool next) {
    const int64_t pf = next && i == 0 ? kVnCols * K : 0;
    const int8_t* w[kVnCols];
    for (int c = 0; c < kVnCols; ++c) w[c] = W + (j + std::min(c, cols - 1)) * K;
    float* out = C + i * ldc + j;
    switch (rows) {
      case 1: vn8_group<1>(K, v, i, w, cols, scale + j, out, ldc, pf); break;
      case 2: vn8_group<2>(K, v, i, w, cols, scale + j, out, ldc, pf); break;
      case 3: vn8_group<3>(K, v, i, w, cols, scale + j, out, ldc, pf); break;
      default: vn8_group<4>(K, v, i, w, cols, scale + j, out, ldc, pf); break;
    }
  });
}

void gemv_int4_vnni(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
                    const float* scale, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  VnRows v;
  quantize_rows(M, K, A, lda, false, v);
  const int64_t groups = K / group;
  vn_run(M, N, K, [&](int64_t j, int cols, int64_t i, int rows, bool next) {
    const int64_t pf = next && i == 0 ? kVnCols * (K / 2) : 0;
    const uint8_t* w[kVnCols];
    const float* s[kVnCols];
    for (int c = 0; c < kVnCols; ++c) {
      const int64_t row = j + std::min(c, cols - 1);
      w[c] = W + row * (K / 2);
      s[c] = scale + row * groups;
    }
    float* out = C + i * ldc + j;
    switch (rows) {
      case 1: vn4_group<1>(K, group, v, i, w, s, cols, out, ldc, pf); break;
      case 2: vn4_group<2>(K, group, v, i, w, s, cols, out, ldc, pf); break;
      case 3: vn4_group<3>(K, group, v, i, w, s, cols, out, ldc, pf); break;
      default: vn4_group<4>(K, group, v, i, w, s, cols, out, ldc, pf); break;
    }
  });
}

}  // namespace tpu::kernels

#pragma GCC diagnostic pop
