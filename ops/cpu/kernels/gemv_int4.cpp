// Products with packed int4 weights read in place (gemv_int4.h). As the int8 kernel: weight rows
// four at a time (blocks of four output columns, split over the pool threads), rows of A in
// groups of up to four sharing every unpacked weight vector. Per block of 32 weights and weight
// row, AVX-512 does one 16-byte load, a zero extension to 16 lanes and two table lookups
// (vpermps) into the 16 values of the group (low nibbles: weights 0..15; after a shift, high
// nibbles: weights 16..31); AVX2 masks, shifts, converts and applies the group's scale and
// offset by one FMA, in two halves of 8 lanes. The fp8 e4m3
// kernel (per-channel scales) has the same structure with 16 (8) weights per step.
#include "ops/cpu/kernels/gemv_int4.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/gemv.h"
#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "ops/cpu/kernels/simd.h"
#include "tpucore/core/batch_invariant.h"
#include "tpucore/core/float8.h"

#define TPU_INT4_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TPU_INT4_AVX2 __attribute__((target("avx2,fma")))

TPU_INTRIN_DIAGNOSTICS_PUSH

namespace tpu::kernels {
namespace {

constexpr int kQ4Cols = 4;  // weight rows per block
constexpr int kQ4Rows = 4;  // rows of A per group

// The block's weight rows and their scale rows (a short last block repeats its last row).
struct Q4Block {
  const uint8_t* w[kQ4Cols];
  Int4Scales s[kQ4Cols];
};

Q4Block q4_block(const uint8_t* W, Int4Scales scale, int64_t K, int64_t groups, int64_t j, int cols) {
  Q4Block b;
  for (int c = 0; c < kQ4Cols; ++c) {
    const int64_t row = j + std::min(c, cols - 1);
    b.w[c] = W + row * (K / 2);
    b.s[c] = scale + row * groups;
  }
  return b;
}

template <int R>
TPU_INT4_AVX512 void q4_group_avx512(int64_t K, int64_t group, const float* A, int64_t lda, const Q4Block& blk,
                                     int cols, float* C, int64_t ldc) {
  __m512 acc[R][kQ4Cols];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kQ4Cols; ++c) acc[r][c] = _mm512_setzero_ps();
  const __m512 nibbles = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const int64_t bpg = group / 32;  // blocks of 32 per group: a shift instead of a division when a power of two
  const bool pow2 = (bpg & (bpg - 1)) == 0;
  const int shift = __builtin_ctzll(static_cast<unsigned long long>(bpg));
  for (int64_t k = 0; k < K; k += 32) {
    const int64_t g = pow2 ? (k / 32) >> shift : (k / 32) / bpg;
    __m512 lo[kQ4Cols], hi[kQ4Cols];
#pragma GCC unroll 4
    for (int c = 0; c < kQ4Cols; ++c) {
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.w[c] + k / 2)));
      // The 16 weights a nibble can stand for, (n - 8) s as n s + (-8 s) (one rounding of the
      // exact value, as the dequantized weight), looked up by vpermps, which reads the low 4
      // bits of each index lane: the low nibbles directly, the high ones after a shift.
      const float sg = blk.s[c][g];
      const __m512 table = _mm512_fmadd_ps(nibbles, _mm512_set1_ps(sg), _mm512_set1_ps(-8.0f * sg));
      lo[c] = _mm512_permutexvar_ps(v, table);
      hi[c] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 x0 = _mm512_loadu_ps(A + r * lda + k), x1 = _mm512_loadu_ps(A + r * lda + k + 16);
#pragma GCC unroll 4
      for (int c = 0; c < kQ4Cols; ++c) acc[r][c] = _mm512_fmadd_ps(x1, hi[c], _mm512_fmadd_ps(x0, lo[c], acc[r][c]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) C[r * ldc + c] = _mm512_reduce_add_ps(acc[r][c]);
}

template <int R>
TPU_INT4_AVX2 void q4_group_avx2(int64_t K, int64_t group, const float* A, int64_t lda, const Q4Block& blk, int cols,
                                 float* C, int64_t ldc) {
  __m256 acc[R][kQ4Cols];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kQ4Cols; ++c) acc[r][c] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi32(0xF);
  const int64_t bpg = group / 32;
  const bool pow2 = (bpg & (bpg - 1)) == 0;
  const int shift = __builtin_ctzll(static_cast<unsigned long long>(bpg));
  for (int64_t k = 0; k < K; k += 32) {
    const int64_t g = pow2 ? (k / 32) >> shift : (k / 32) / bpg;
    for (int h = 0; h < 2; ++h) {  // bytes 8h..8h+7: weights 8h.. (low nibbles) and 16+8h.. (high)
      __m256 lo[kQ4Cols], hi[kQ4Cols];
#pragma GCC unroll 4
      for (int c = 0; c < kQ4Cols; ++c) {
        const __m256i v =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk.w[c] + k / 2 + 8 * h)));
        const float sg = blk.s[c][g];
        const __m256 s = _mm256_set1_ps(sg), off = _mm256_set1_ps(-8.0f * sg);
        lo[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, mask)), s, off);
        hi[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), s, off);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 x0 = _mm256_loadu_ps(A + r * lda + k + 8 * h), x1 = _mm256_loadu_ps(A + r * lda + k + 16 + 8 * h);
#pragma GCC unroll 4
        for (int c = 0; c < kQ4Cols; ++c)
          acc[r][c] = _mm256_fmadd_ps(x1, hi[c], _mm256_fmadd_ps(x0, lo[c], acc[r][c]));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) C[r * ldc + c] = hsum256(acc[r][c]);
}

template <int R>
void q4_group_scalar(int64_t K, int64_t group, const float* A, int64_t lda, const Q4Block& blk, int cols, float* C,
                     int64_t ldc) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += A[r * lda + k] * (static_cast<float>(int4_at(blk.w[c], k)) * blk.s[c][k / group]);
      C[r * ldc + c] = s;
    }
}

// The table of the path `p` resolves to (as the int8 kernels pick theirs).
template <class Fn>
const Fn* path_table(Int8GemvPath p, const Fn* avx512, const Fn* avx2, const Fn* scalar) {
  switch (int8_gemv_resolve(p)) {
    case Int8GemvPath::vnni:  // no vnni kernel here (int4 has its own, gemv_vnni.cpp)
    case Int8GemvPath::avx512: return avx512;
    case Int8GemvPath::avx2q8:  // nor an avx2q8 one (int4's: gemv_q8_avx2.cpp)
    case Int8GemvPath::avx2: return avx2;
    default: return scalar;
  }
}

using Q4GroupFn = void (*)(int64_t, int64_t, const float*, int64_t, const Q4Block&, int, float*, int64_t);

const Q4GroupFn* q4_table(Int8GemvPath p) {
  static constexpr Q4GroupFn avx512[kQ4Rows + 1] = {nullptr, &q4_group_avx512<1>, &q4_group_avx512<2>,
                                                    &q4_group_avx512<3>, &q4_group_avx512<4>};
  static constexpr Q4GroupFn avx2[kQ4Rows + 1] = {nullptr, &q4_group_avx2<1>, &q4_group_avx2<2>, &q4_group_avx2<3>,
                                                  &q4_group_avx2<4>};
  static constexpr Q4GroupFn scalar[kQ4Rows + 1] = {nullptr, &q4_group_scalar<1>, &q4_group_scalar<2>,
                                                    &q4_group_scalar<3>, &q4_group_scalar<4>};
  return path_table(p, avx512, avx2, scalar);
}

// Many rows: the weight dequantized to f32 in panels, then the float GEMM (gemm_dequantized_panels).
void q4_many_rows(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
                  Int4Scales scale, float* C, int64_t ldc) {
  const int64_t groups = K / group;
  detail::gemm_dequantized_panels(M, N, K, A, lda, C, ldc, [&](int64_t j, float* out) {
    const uint8_t* row = W + j * (K / 2);
    const Int4Scales s = scale + j * groups;
    for (int64_t k = 0; k < K; k += 32) {
      const float sg = s[k / group];
      for (int64_t b = 0; b < 16; ++b) {
        const uint8_t byte = row[k / 2 + b];
        out[k + b] = static_cast<float>((byte & 0xF) - 8) * sg;
        out[k + 16 + b] = static_cast<float>((byte >> 4) - 8) * sg;
      }
    }
  });
}

// ---- fp8 e4m3 weights, one scale per output channel ----

// Sixteen e4m3 bytes as f32 times 2^-8: the bytes placed in f16 bit patterns (sign to bit 15,
// exponent and mantissa to bits 7..14; the f16 bias 15 is the e4m3 bias 7 plus 8).
TPU_INT4_AVX512 inline __m512 f8_to_ps_avx512(__m128i b) {
  const __m256i h = _mm256_cvtepu8_epi16(b);
  const __m256i bits = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8),
                                       _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7F)), 7));
  return _mm512_cvtph_ps(bits);
}

template <int R>
TPU_INT4_AVX512 void f8_group_avx512(int64_t K, const float* A, int64_t lda, const uint8_t* const* w, int cols,
                                     const float* scale, float* C, int64_t ldc) {
  __m512 acc[R][kQ4Cols];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kQ4Cols; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const bool tail = K - k < 16;
    const __mmask16 m = tail ? static_cast<__mmask16>((1u << (K - k)) - 1) : static_cast<__mmask16>(0xFFFF);
    __m512 wv[kQ4Cols];
#pragma GCC unroll 4
    for (int c = 0; c < kQ4Cols; ++c) wv[c] = f8_to_ps_avx512(_mm_maskz_loadu_epi8(m, w[c] + k));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_maskz_loadu_ps(m, A + r * lda + k);
#pragma GCC unroll 4
      for (int c = 0; c < kQ4Cols; ++c) acc[r][c] = _mm512_fmadd_ps(x, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) C[r * ldc + c] = _mm512_reduce_add_ps(acc[r][c]) * (scale[c] * 256.0f);
}

// Eight e4m3 bytes as exact f32: normals by rebiasing the exponent (127 - 7), subnormals
// (exponent 0) as 2^-6 (1 + m / 8) - 2^-6.
TPU_INT4_AVX2 inline __m256 f8_to_ps_avx2(const uint8_t* p) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7F));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
  const __m256i sub = _mm256_cmpeq_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x78)), _mm256_setzero_si256());
  const __m256 normal = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
  const __m256 tiny = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(121 << 23))),
                                    _mm256_set1_ps(0x1p-6f));
  const __m256 v = _mm256_blendv_ps(normal, tiny, _mm256_castsi256_ps(sub));
  return _mm256_or_ps(v, _mm256_castsi256_ps(sign));
}

template <int R>
TPU_INT4_AVX2 void f8_group_avx2(int64_t K, const float* A, int64_t lda, const uint8_t* const* w, int cols,
                                 const float* scale, float* C, int64_t ldc) {
  __m256 acc[R][kQ4Cols];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kQ4Cols; ++c) acc[r][c] = _mm256_setzero_ps();
  const int64_t k8 = K & ~int64_t{7};
  for (int64_t k = 0; k < k8; k += 8) {
    __m256 wv[kQ4Cols];
#pragma GCC unroll 4
    for (int c = 0; c < kQ4Cols; ++c) wv[c] = f8_to_ps_avx2(w[c] + k);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_loadu_ps(A + r * lda + k);
#pragma GCC unroll 4
      for (int c = 0; c < kQ4Cols; ++c) acc[r][c] = _mm256_fmadd_ps(x, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) {
      float s = hsum256(acc[r][c]);
      for (int64_t k = k8; k < K; ++k) s += A[r * lda + k] * f8e4m3::from_bits(w[c][k]).to_f32();
      C[r * ldc + c] = s * scale[c];
    }
}

template <int R>
void f8_group_scalar(int64_t K, const float* A, int64_t lda, const uint8_t* const* w, int cols, const float* scale,
                     float* C, int64_t ldc) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += A[r * lda + k] * f8e4m3::from_bits(w[c][k]).to_f32();
      C[r * ldc + c] = s * scale[c];
    }
}

using F8GroupFn = void (*)(int64_t, const float*, int64_t, const uint8_t* const*, int, const float*, float*, int64_t);

const F8GroupFn* f8_table(Int8GemvPath p) {
  static constexpr F8GroupFn avx512[kQ4Rows + 1] = {nullptr, &f8_group_avx512<1>, &f8_group_avx512<2>,
                                                    &f8_group_avx512<3>, &f8_group_avx512<4>};
  static constexpr F8GroupFn avx2[kQ4Rows + 1] = {nullptr, &f8_group_avx2<1>, &f8_group_avx2<2>, &f8_group_avx2<3>,
                                                  &f8_group_avx2<4>};
  static constexpr F8GroupFn scalar[kQ4Rows + 1] = {nullptr, &f8_group_scalar<1>, &f8_group_scalar<2>,
                                                    &f8_group_scalar<3>, &f8_group_scalar<4>};
  return path_table(p, avx512, avx2, scalar);
}

// ---- fp8 e4m3 weights with one scale per block of bn x bk ----

// The block's columns: their byte rows and their rows of block scales (ceil(K / bk) each).
struct F8Block {
  const uint8_t* w[kQ4Cols];
  const float* s[kQ4Cols];
};

template <int R>
TPU_INT4_AVX512 void f8b_group_avx512(int64_t K, int64_t bk, const float* A, int64_t lda, const F8Block& blk, int cols,
                                      float* C, int64_t ldc) {
  __m512 acc[R][kQ4Cols];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kQ4Cols; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += bk, ++b) {
    const int64_t k1 = std::min(K, k0 + bk);
    __m512 sv[kQ4Cols];  // the block's scales times 256 (the widened bytes are 2^-8 times their value)
#pragma GCC unroll 4
    for (int c = 0; c < kQ4Cols; ++c) sv[c] = _mm512_set1_ps(blk.s[c][b] * 256.0f);
    int64_t k = k0;
    for (; k + 16 <= k1; k += 16) {
      __m512 wv[kQ4Cols];
#pragma GCC unroll 4
      for (int c = 0; c < kQ4Cols; ++c)
        wv[c] = _mm512_mul_ps(f8_to_ps_avx512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.w[c] + k))), sv[c]);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_loadu_ps(A + r * lda + k);
#pragma GCC unroll 4
        for (int c = 0; c < kQ4Cols; ++c) acc[r][c] = _mm512_fmadd_ps(x, wv[c], acc[r][c]);
      }
    }
    if (k < k1) {  // the block's last (< 16) columns
      const __mmask16 m = static_cast<__mmask16>((1u << (k1 - k)) - 1);
      __m512 wv[kQ4Cols];
#pragma GCC unroll 4
      for (int c = 0; c < kQ4Cols; ++c) wv[c] = _mm512_mul_ps(f8_to_ps_avx512(_mm_maskz_loadu_epi8(m, blk.w[c] + k)), sv[c]);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_maskz_loadu_ps(m, A + r * lda + k);
#pragma GCC unroll 4
        for (int c = 0; c < kQ4Cols; ++c) acc[r][c] = _mm512_fmadd_ps(x, wv[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) C[r * ldc + c] = _mm512_reduce_add_ps(acc[r][c]);
}

template <int R>
TPU_INT4_AVX2 void f8b_group_avx2(int64_t K, int64_t bk, const float* A, int64_t lda, const F8Block& blk, int cols,
                                  float* C, int64_t ldc) {
  __m256 acc[R][kQ4Cols];
  float tail[R][kQ4Cols] = {};  // the last (< 8) columns of each block
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kQ4Cols; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += bk, ++b) {
    const int64_t k1 = std::min(K, k0 + bk), k8 = k0 + ((k1 - k0) & ~int64_t{7});
    __m256 sv[kQ4Cols];
#pragma GCC unroll 4
    for (int c = 0; c < kQ4Cols; ++c) sv[c] = _mm256_set1_ps(blk.s[c][b]);
    for (int64_t k = k0; k < k8; k += 8) {
      __m256 wv[kQ4Cols];
#pragma GCC unroll 4
      for (int c = 0; c < kQ4Cols; ++c) wv[c] = _mm256_mul_ps(f8_to_ps_avx2(blk.w[c] + k), sv[c]);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_loadu_ps(A + r * lda + k);
#pragma GCC unroll 4
        for (int c = 0; c < kQ4Cols; ++c) acc[r][c] = _mm256_fmadd_ps(x, wv[c], acc[r][c]);
      }
    }
    for (int64_t k = k8; k < k1; ++k)
      for (int c = 0; c < kQ4Cols; ++c) {
        const float w = f8e4m3::from_bits(blk.w[c][k]).to_f32() * blk.s[c][b];
        for (int r = 0; r < R; ++r) tail[r][c] += A[r * lda + k] * w;
      }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) C[r * ldc + c] = hsum256(acc[r][c]) + tail[r][c];
}

template <int R>
void f8b_group_scalar(int64_t K, int64_t bk, const float* A, int64_t lda, const F8Block& blk, int cols, float* C,
                      int64_t ldc) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += A[r * lda + k] * (f8e4m3::from_bits(blk.w[c][k]).to_f32() * blk.s[c][k / bk]);
      C[r * ldc + c] = s;
    }
}

using F8BlockGroupFn = void (*)(int64_t, int64_t, const float*, int64_t, const F8Block&, int, float*, int64_t);

const F8BlockGroupFn* f8b_table(Int8GemvPath p) {
  static constexpr F8BlockGroupFn avx512[kQ4Rows + 1] = {nullptr, &f8b_group_avx512<1>, &f8b_group_avx512<2>,
                                                         &f8b_group_avx512<3>, &f8b_group_avx512<4>};
  static constexpr F8BlockGroupFn avx2[kQ4Rows + 1] = {nullptr, &f8b_group_avx2<1>, &f8b_group_avx2<2>,
                                                       &f8b_group_avx2<3>, &f8b_group_avx2<4>};
  static constexpr F8BlockGroupFn scalar[kQ4Rows + 1] = {nullptr, &f8b_group_scalar<1>, &f8b_group_scalar<2>,
                                                         &f8b_group_scalar<3>, &f8b_group_scalar<4>};
  return path_table(p, avx512, avx2, scalar);
}

// One weight row dequantized to f32 (s: its row of block scales).
TPU_INT4_AVX512 void f8b_dequant_row_avx512(const uint8_t* row, const float* s, int64_t K, int64_t bk, float* out) {
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += bk, ++b) {
    const int64_t k1 = std::min(K, k0 + bk);
    const __m512 sv = _mm512_set1_ps(s[b] * 256.0f);
    for (int64_t k = k0; k < k1; k += 16) {
      const __mmask16 m = k1 - k < 16 ? static_cast<__mmask16>((1u << (k1 - k)) - 1) : static_cast<__mmask16>(0xFFFF);
      _mm512_mask_storeu_ps(out + k, m, _mm512_mul_ps(f8_to_ps_avx512(_mm_maskz_loadu_epi8(m, row + k)), sv));
    }
  }
}

void f8b_dequant_row_scalar(const uint8_t* row, const float* s, int64_t K, int64_t bk, float* out) {
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += bk, ++b)
    for (int64_t k = k0; k < std::min(K, k0 + bk); ++k) out[k] = f8e4m3::from_bits(row[k]).to_f32() * s[b];
}

// Many rows: panels of up to 256 weight rows dequantized to f32, then the float GEMM.
void f8b_many_rows(int64_t M, int64_t N, int64_t K, int64_t bn, int64_t bk, const float* A, int64_t lda,
                   const uint8_t* W, const float* scale, float* C, int64_t ldc) {
  const int64_t kb = (K + bk - 1) / bk;
  const auto dequant_row =
      int8_gemv_path_available(Int8GemvPath::avx512) ? &f8b_dequant_row_avx512 : &f8b_dequant_row_scalar;
  detail::gemm_dequantized_panels(M, N, K, A, lda, C, ldc, [&](int64_t j, float* out) {
    dequant_row(W + j * K, scale + (j / bn) * kb, K, bk, out);
  });
}

}  // namespace

bool int4_gemv_quantizes_rows(Int8GemvPath path, int64_t M) {
  const Int8GemvPath r = int8_gemv_resolve(path);
  return r == Int8GemvPath::vnni || (r == Int8GemvPath::avx2q8 && (M < kInt4Q8ManyRows || batch_invariant()));
}

void gemv_int4(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
               Int4Scales scale, float* C, int64_t ldc, Int8GemvPath path) {
  if (M <= 0 || N <= 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return;
  }
  const Int8GemvPath resolved = int8_gemv_resolve(path);
  if (resolved == Int8GemvPath::vnni) return gemv_int4_vnni(M, N, K, group, A, lda, W, scale, C, ldc);
  if (int4_gemv_quantizes_rows(resolved, M)) return gemv_int4_q8avx2(M, N, K, group, A, lda, W, scale, C, ldc);
  if (M >= kInt4ManyRows && !batch_invariant()) {
    q4_many_rows(M, N, K, group, A, lda, W, scale, C, ldc);
    return;
  }
  const Q4GroupFn* fns = q4_table(path);
  const int64_t groups = K / group;
  const int64_t blocks = (N + kQ4Cols - 1) / kQ4Cols;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, K * M * kQ4Cols));
  detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j = b * kQ4Cols;
      const int cols = static_cast<int>(std::min<int64_t>(kQ4Cols, N - j));
      const Q4Block blk = q4_block(W, scale, K, groups, j, cols);
      for (int64_t i = 0; i < M; i += kQ4Rows) {
        const int rows = static_cast<int>(std::min<int64_t>(kQ4Rows, M - i));
        fns[rows](K, group, A + i * lda, lda, blk, cols, C + i * ldc + j, ldc);
      }
    }
  }, detail::next_rows(W, N, K / 2));
}

void gemv_fp8(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint8_t* W, const float* scale,
              float* C, int64_t ldc, Int8GemvPath path) {
  if (M <= 0 || N <= 0) return;
  const F8GroupFn* fns = f8_table(path);
  const int64_t blocks = (N + kQ4Cols - 1) / kQ4Cols;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, K * M * kQ4Cols));
  detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j = b * kQ4Cols;
      const int cols = static_cast<int>(std::min<int64_t>(kQ4Cols, N - j));
      const uint8_t* w[kQ4Cols];
      for (int c = 0; c < kQ4Cols; ++c) w[c] = W + (j + std::min(c, cols - 1)) * K;
      for (int64_t i = 0; i < M; i += kQ4Rows) {
        const int rows = static_cast<int>(std::min<int64_t>(kQ4Rows, M - i));
        fns[rows](K, A + i * lda, lda, w, cols, scale + j, C + i * ldc + j, ldc);
      }
    }
  }, detail::next_rows(W, N, K));
}

void gemv_fp8_block(int64_t M, int64_t N, int64_t K, int64_t bn, int64_t bk, const float* A, int64_t lda,
                    const uint8_t* W, const float* scale, float* C, int64_t ldc, Int8GemvPath path) {
  if (M <= 0 || N <= 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return;
  }
  if (M >= kFp8BlockManyRows && !batch_invariant()) {
    f8b_many_rows(M, N, K, bn, bk, A, lda, W, scale, C, ldc);
    return;
  }
  const F8BlockGroupFn* fns = f8b_table(path);
  const int64_t kb = (K + bk - 1) / bk;
  const int64_t blocks = (N + kQ4Cols - 1) / kQ4Cols;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, K * M * kQ4Cols));
  detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j = b * kQ4Cols;
      const int cols = static_cast<int>(std::min<int64_t>(kQ4Cols, N - j));
      F8Block blk;
      for (int c = 0; c < kQ4Cols; ++c) {
        const int64_t row = j + std::min(c, cols - 1);
        blk.w[c] = W + row * K;
        blk.s[c] = scale + (row / bn) * kb;
      }
      for (int64_t i = 0; i < M; i += kQ4Rows) {
        const int rows = static_cast<int>(std::min<int64_t>(kQ4Rows, M - i));
        fns[rows](K, bk, A + i * lda, lda, blk, cols, C + i * ldc + j, ldc);
      }
    }
  }, detail::next_rows(W, N, K));
}

}  // namespace tpu::kernels

TPU_INTRIN_DIAGNOSTICS_POP
