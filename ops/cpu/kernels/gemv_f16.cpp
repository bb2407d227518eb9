// f16 (IEEE binary16) products, linear's x W^T with an f16 weight read in place.
//
// Few rows (up to kGemvMaxRows, W^T with unit stride along K): the rows of A are widened to f32
// once (a few KiB) and the weight is converted in registers (vcvtph2ps: 16 values per
// instruction with AVX-512, 8 with AVX2 and F16C), so it is read once per call at its own 2
// bytes per value: the decode step of an f16 model streams half the bytes of an f32 one and
// never materializes an f32 copy of the weight. Up to kGemvDotRows rows (and every row count on
// AVX2), every output is a dot product along K: a tile of up to 4 rows of A by 4 weight rows
// shares every converted weight vector among the rows, a block of 4 weight rows stays in L1
// while all row tiles pass over it, and the first tile prefetches the next block's rows. More
// rows (AVX-512) take the broadcast kernel below: one 16-lane FMA per weight value.
//
// More rows (a prefill) or other layouts: A is widened to f32 once (per-thread scratch) and the
// packed f32 GEMM runs with the weight widened while its panels are packed
// (gemm_f32a_f16b in gemm_driver.cpp: vcvtph2ps inside the AVX2 transposes), so the weight is
// read at 2 bytes per value and never copied whole. Batch-invariant mode and CPUs without AVX2
// widen panels of the weight (about 4 MiB each) and call gemm_f32, with its batch-invariant
// order (the panels split N only, so every output keeps gemm_f32's chain along K).
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/gemv.h"
#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "ops/cpu/kernels/scratch.h"
#include "ops/cpu/kernels/simd.h"
#include "tpucore/core/batch_invariant.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/half.h"
#include "tpucore/core/parallel.h"

#define TPU_F16_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TPU_F16_AVX2 __attribute__((target("avx2,fma,f16c")))

TPU_INTRIN_DIAGNOSTICS_PUSH

namespace tpu::kernels {
namespace {

constexpr int kF16Cols = 4;  // weight rows per block
constexpr int kF16Rows = 4;  // rows of A per tile

bool f16_avx512_ok() {
  const CpuFeatures& f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.fma;
}

// F16C: cpuid leaf 1, ecx bit 29 (every AVX2 CPU has it; asked anyway).
bool f16_avx2_ok() {
  static const bool f16c = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u) != 0;
  }();
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f16c;
}

TPU_F16_AVX512 void widen_f16_avx512(const uint16_t* src, int64_t n, float* dst) {
  int64_t k = 0;
  for (; k + 16 <= n; k += 16)
    _mm512_storeu_ps(dst + k, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k))));
  for (; k < n; ++k) dst[k] = f16::from_bits(src[k]).to_f32();
}

TPU_F16_AVX2 void widen_f16_avx2(const uint16_t* src, int64_t n, float* dst) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    _mm256_storeu_ps(dst + k, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k))));
  for (; k < n; ++k) dst[k] = f16::from_bits(src[k]).to_f32();
}

// n values src[0], src[stride], ... widened to dst[0 .. n).
void widen_f16(const uint16_t* src, int64_t stride, int64_t n, float* dst) {
  if (stride == 1 && f16_avx512_ok()) return widen_f16_avx512(src, n, dst);
  if (stride == 1 && f16_avx2_ok()) return widen_f16_avx2(src, n, dst);
  for (int64_t k = 0; k < n; ++k) dst[k] = f16::from_bits(src[k * stride]).to_f32();
}

// ---- AVX-512 ----

// C[r, c] (+)= sum_k a[r][k] w[c][k] for RB rows of a (row stride lda, f32) and `cols` weight rows.
template <int RB>
TPU_F16_AVX512 void tile_avx512(int64_t K, const float* a, int64_t lda, const uint16_t* const* w, float* C,
                                int64_t ldc, int cols, bool accumulate, int64_t pf) {
  __m512 acc[RB][kF16Cols];
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kF16Cols; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[kF16Cols];
    if (pf && (k & 31) == 0)
#pragma GCC unroll 4
      for (int c = 0; c < kF16Cols; ++c) _mm_prefetch(reinterpret_cast<const char*>(w[c] + k + pf), _MM_HINT_T0);
#pragma GCC unroll 4
    for (int c = 0; c < kF16Cols; ++c)
      wv[c] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[c] + k)));
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      const __m512 x = _mm512_loadu_ps(a + r * lda + k);
#pragma GCC unroll 4
      for (int c = 0; c < kF16Cols; ++c) acc[r][c] = _mm512_fmadd_ps(x, wv[c], acc[r][c]);
    }
  }
  if (k < K) {
    const __mmask16 m = static_cast<__mmask16>((1u << (K - k)) - 1);
    __m512 wv[kF16Cols];
#pragma GCC unroll 4
    for (int c = 0; c < kF16Cols; ++c) wv[c] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w[c] + k));
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      const __m512 x = _mm512_maskz_loadu_ps(m, a + r * lda + k);
#pragma GCC unroll 4
      for (int c = 0; c < kF16Cols; ++c) acc[r][c] = _mm512_fmadd_ps(x, wv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
    float v[kF16Cols];
#pragma GCC unroll 4
    for (int c = 0; c < kF16Cols; ++c) v[c] = _mm512_reduce_add_ps(acc[r][c]);
    float* out = C + r * ldc;
    for (int c = 0; c < cols; ++c) out[c] = accumulate ? out[c] + v[c] : v[c];
  }
}

// ---- AVX-512, more than kGemvDotRows rows (a decode batch): the broadcast kernel. ----
// A is transposed once into a [K][16] f32 panel (rows past M zero). Each block of kBcastCols
// weight rows is streamed along K, 16 values per row at a time widened into an L1 buffer, and
// every widened value is broadcast (from memory, into the FMA) against the panel row: one
// 16-lane FMA per weight value, whose lanes are the 16 rows of A, so an accumulator is a
// column of C and no horizontal sums are needed. Each lane sums its products along K in order.

constexpr int kBcastCols = 8;  // weight rows per block (8 accumulators of 16 rows)

thread_local detail::ScratchBuffer t_f16_rows;
thread_local detail::ScratchBuffer t_f16_gemm_a;  // gemm_f16's widened A
thread_local detail::ScratchBuffer t_f16_gemm_b;  // its widened weight panels (batch-invariant mode)
thread_local detail::ScratchBuffer t_f16_panel;  // the broadcast kernel's [K][16] panel

// kBf16: the weight is bf16 (each value the top half of an f32) instead of f16; the kernel of
// bf16 products on AVX-512 CPUs without avx512_bf16 (gemv_bf16_widened_bcast).
template <bool kBf16>
TPU_F16_AVX512 void bcast_block_avx512(int64_t M, int64_t K, const float* pan, const uint16_t* const* w, float* C,
                                       int64_t ldc, int cols, bool accumulate, int64_t pf) {
  __m512 acc[kBcastCols];
#pragma GCC unroll 8
  for (int c = 0; c < kBcastCols; ++c) acc[c] = _mm512_setzero_ps();
  alignas(64) float wb[kBcastCols][16];
  for (int64_t k = 0; k < K; k += 16) {
    const int64_t n = std::min<int64_t>(16, K - k);
    const __mmask16 m = n == 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
    if (pf && (k & 31) == 0)  // the same line of the next block's rows (see f16_rows_run)
#pragma GCC unroll 8
      for (int c = 0; c < kBcastCols; ++c) _mm_prefetch(reinterpret_cast<const char*>(w[c] + k + pf), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int c = 0; c < kBcastCols; ++c) {
      const __m256i h = _mm256_maskz_loadu_epi16(m, w[c] + k);
      _mm512_store_ps(wb[c], kBf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                                   : _mm512_cvtph_ps(h));
    }
    // The values are read back from memory, each broadcast by the load unit into its FMA: kept
    // in registers, the compiler would broadcast them with shuffles on the FMA port.
    asm volatile("" ::: "memory");
    const float* pk = pan + k * 16;
    if (n == 16) {
#pragma GCC unroll 16
      for (int q = 0; q < 16; ++q) {
        const __m512 a = _mm512_load_ps(pk + q * 16);
#pragma GCC unroll 8
        for (int c = 0; c < kBcastCols; ++c) acc[c] = _mm512_fmadd_ps(a, _mm512_set1_ps(wb[c][q]), acc[c]);
      }
    } else {
      for (int q = 0; q < n; ++q) {
        const __m512 a = _mm512_load_ps(pk + q * 16);
#pragma GCC unroll 8
        for (int c = 0; c < kBcastCols; ++c) acc[c] = _mm512_fmadd_ps(a, _mm512_set1_ps(wb[c][q]), acc[c]);
      }
    }
  }
  alignas(64) float out[kBcastCols][16];
#pragma GCC unroll 8
  for (int c = 0; c < kBcastCols; ++c) _mm512_store_ps(out[c], acc[c]);
  for (int64_t i = 0; i < M; ++i) {
    float* ci = C + i * ldc;
    for (int c = 0; c < cols; ++c) ci[c] = accumulate ? ci[c] + out[c][i] : out[c][i];
  }
}

// The broadcast kernel over all weight rows: M <= 16 rows of A (f16, or bf16 with kBf16; any strides).
template <bool kBf16>
void f16_bcast_run(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs, const uint16_t* B,
                   int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  float* pan = t_f16_panel.get_as<float>(static_cast<size_t>(K * 16));
  std::memset(pan, 0, sizeof(float) * static_cast<size_t>(K * 16));
  if (kBf16) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) {
        const uint32_t bits = static_cast<uint32_t>(A[i * a_rs + k * a_cs]) << 16;
        std::memcpy(pan + k * 16 + i, &bits, sizeof bits);
      }
  } else {
    float* a = t_f16_rows.get_as<float>(static_cast<size_t>(M * K));
    for (int64_t i = 0; i < M; ++i) widen_f16(A + i * a_rs, a_cs, K, a + i * K);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) pan[k * 16 + i] = a[i * K + k];
  }
  const int64_t blocks = (N + kBcastCols - 1) / kBcastCols;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, 16 * K * kBcastCols));
  detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j = b * kBcastCols;
      const int cols = static_cast<int>(std::min<int64_t>(kBcastCols, N - j));
      const uint16_t* w[kBcastCols];
      for (int c = 0; c < kBcastCols; ++c) w[c] = B + (j + std::min(c, cols - 1)) * b_cs;
      bcast_block_avx512<kBf16>(M, K, pan, w, C + j, ldc, cols, accumulate, b + 1 < b1 ? kBcastCols * b_cs : 0);
    }
  }, detail::next_rows(B, N, b_cs));
}

// ---- AVX2 + F16C: tiles of up to 2 rows (8 accumulators, 4 weight and 2 row registers), the
// first tile prefetching the next block's rows as on AVX-512. ----

// One step of 8 values along K: acc[r][c] += x[r] * w[c].
template <int RB>
TPU_F16_AVX2 inline void step_avx2(__m256 (&acc)[RB][kF16Cols], const uint16_t* const* wp, const float* const* xp) {
  __m256 wv[kF16Cols];
#pragma GCC unroll 4
  for (int c = 0; c < kF16Cols; ++c) wv[c] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp[c])));
#pragma GCC unroll 2
  for (int r = 0; r < RB; ++r) {
    const __m256 x = _mm256_loadu_ps(xp[r]);
#pragma GCC unroll 4
    for (int c = 0; c < kF16Cols; ++c) acc[r][c] = _mm256_fmadd_ps(x, wv[c], acc[r][c]);
  }
}

template <int RB>
TPU_F16_AVX2 void tile_avx2(int64_t K, const float* a, int64_t lda, const uint16_t* const* w, float* C, int64_t ldc,
                            int cols, bool accumulate, int64_t pf) {
  __m256 acc[RB][kF16Cols];
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kF16Cols; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    if (pf && (k & 31) == 0)  // the same line of the next block's rows (see f16_rows_run)
#pragma GCC unroll 4
      for (int c = 0; c < kF16Cols; ++c) _mm_prefetch(reinterpret_cast<const char*>(w[c] + k + pf), _MM_HINT_T0);
    const uint16_t* wp[kF16Cols] = {w[0] + k, w[1] + k, w[2] + k, w[3] + k};
    const float* xp[RB];
    for (int r = 0; r < RB; ++r) xp[r] = a + r * lda + k;
    step_avx2<RB>(acc, wp, xp);
  }
  if (k < K) {  // the tail through zero-padded copies
    alignas(32) uint16_t wt[kF16Cols][8] = {};
    alignas(32) float xt[RB][8] = {};
    const uint16_t* wp[kF16Cols];
    const float* xp[RB];
    for (int c = 0; c < kF16Cols; ++c) {
      std::memcpy(wt[c], w[c] + k, sizeof(uint16_t) * static_cast<size_t>(K - k));
      wp[c] = wt[c];
    }
    for (int r = 0; r < RB; ++r) {
      std::memcpy(xt[r], a + r * lda + k, sizeof(float) * static_cast<size_t>(K - k));
      xp[r] = xt[r];
    }
    step_avx2<RB>(acc, wp, xp);
  }
  for (int r = 0; r < RB; ++r) {
    float* out = C + r * ldc;
    for (int c = 0; c < cols; ++c) {
      const float v = hsum256(acc[r][c]);
      out[c] = accumulate ? out[c] + v : v;
    }
  }
}


// The few-row kernel on the given ISA: A widened into f32 rows, then blocks of kF16Cols weight
// rows over the pool threads, each block swept by every tile of rows.
template <bool kAvx512>
void f16_rows_run(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs, const uint16_t* B,
                  int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  float* a = t_f16_rows.get_as<float>(static_cast<size_t>(M * K));
  for (int64_t i = 0; i < M; ++i) widen_f16(A + i * a_rs, a_cs, K, a + i * K);
  constexpr int rb_max = kAvx512 ? kF16Rows : 2;
  const int64_t blocks = (N + kF16Cols - 1) / kF16Cols;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, M * K * kF16Cols));
  detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t j1 = std::min(N, b1 * kF16Cols);
    for (int64_t j = b0 * kF16Cols; j < j1; j += kF16Cols) {
      const int cols = static_cast<int>(std::min<int64_t>(kF16Cols, j1 - j));
      const uint16_t* w[kF16Cols];
      for (int c = 0; c < kF16Cols; ++c) w[c] = B + (j + std::min(c, cols - 1)) * b_cs;
      // The first row tile prefetches the same lines of the next block's weight rows (the
      // hardware prefetchers start over on every row, a few KiB); later tiles find the block in L1.
      for (int64_t i = 0; i < M; i += rb_max) {
        const int64_t pf = i == 0 && j + kF16Cols < j1 ? kF16Cols * b_cs : 0;
        const int rows = static_cast<int>(std::min<int64_t>(rb_max, M - i));
        float* c = C + i * ldc + j;
        const float* ai = a + i * K;
        if constexpr (kAvx512) {
          switch (rows) {
            case 1: tile_avx512<1>(K, ai, K, w, c, ldc, cols, accumulate, pf); break;
            case 2: tile_avx512<2>(K, ai, K, w, c, ldc, cols, accumulate, pf); break;
            case 3: tile_avx512<3>(K, ai, K, w, c, ldc, cols, accumulate, pf); break;
            default: tile_avx512<4>(K, ai, K, w, c, ldc, cols, accumulate, pf); break;
          }
        } else {
          if (rows == 1) tile_avx2<1>(K, ai, K, w, c, ldc, cols, accumulate, pf);
          else tile_avx2<2>(K, ai, K, w, c, ldc, cols, accumulate, pf);
        }
      }
    }
  }, detail::next_rows(B, N, b_cs));
}

}  // namespace

bool gemv_f16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs, const uint16_t* B,
              int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  if (M < 1 || M > kGemvMaxRows || N < 1 || K < 16 || b_rs != 1) return false;
  if (f16_avx512_ok()) {
    if (M > kGemvDotRows) f16_bcast_run<false>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate);
    else f16_rows_run<true>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate);
    return true;
  }
  return gemv_f16_avx2(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate);
}

bool gemv_f16_avx2(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                   const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  if (M < 1 || M > kGemvMaxRows || N < 1 || K < 16 || b_rs != 1 || !f16_avx2_ok()) return false;
  f16_rows_run<false>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate);
  return true;
}

void gemm_f16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs, const uint16_t* B,
              int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  const bool invariant = batch_invariant();
  if (!invariant && gemv_f16(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate)) return;
  // A widened once to [M, K] f32 rows (per-thread scratch, reused across calls).
  float* af = t_f16_gemm_a.get_as<float>(static_cast<size_t>(std::max<int64_t>(1, M * K)));
  const int64_t ga = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, K));
  tpu::parallel_for(0, M, ga, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) widen_f16(A + i * a_rs, a_cs, K, af + i * K);
  });
  // The packed f32 kernels, B widened while it is packed.
  if (!invariant && gemm_f32a_f16b(M, N, K, af, K, 1, B, b_rs, b_cs, C, ldc, accumulate)) return;
  // Batch-invariant mode (gemm_f32's order for every row count) and CPUs without AVX2: the
  // weight widened in panels of [rows, K] (B = W^T, b_rs 1, b_cs K), about 4 MiB each, so that
  // a large weight never needs an f32 copy of its own size.
  const int64_t panel = std::min(N, std::max<int64_t>(64, (int64_t{1} << 20) / std::max<int64_t>(1, K)));
  float* bf = t_f16_gemm_b.get_as<float>(static_cast<size_t>(std::max<int64_t>(1, panel * K)));
  for (int64_t j0 = 0; j0 < N; j0 += panel) {
    const int64_t n = std::min(panel, N - j0);
    tpu::parallel_for(0, n, ga, [&](int64_t j1, int64_t j2) {
      for (int64_t j = j1; j < j2; ++j) widen_f16(B + (j0 + j) * b_cs, b_rs, K, bf + j * K);
    });
    gemm_f32(M, n, K, af, K, 1, bf, 1, K, C + j0, ldc, accumulate);
  }
}

void gemv_bf16_widened_bcast(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                             const uint16_t* B, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  f16_bcast_run<true>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate);
}

}  // namespace tpu::kernels

TPU_INTRIN_DIAGNOSTICS_POP
