// Few-row products against a weight stored as [N, K] rows (see gemv.h), AVX2+FMA: the path for
// x86 CPUs without AVX-512. The weight is read in place, as on AVX-512 (gemv_avx512.cpp):
// - one or two rows: dot products along K, four weight rows at a time (8-lane FMAs, a scalar
//   tail, one horizontal sum per output), the first row's pass prefetching the next four rows;
// - more rows: A is transposed once into a [K][8 * V] panel (V = 1 or 2 registers of 8 rows,
//   rows past M zero) and each block of six weight rows streams along K, every weight element
//   broadcast and multiplied into V registers (6 x V accumulators, no horizontal sums).
// bf16 is widened to f32 (the panel once; the weight eight values a row at a time), exact since
// every bf16 is an f32. Columns are split over the pool threads. The broadcast kernel restarted at
// the AVX2 GEMM's K blocks is the batch-invariant mode's few-row kernel (gemv_chain_f32_avx2).
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "ops/cpu/kernels/gemv.h"
#include "ops/cpu/kernels/scratch.h"
#include "ops/cpu/kernels/simd.h"
#include "tpucore/core/parallel.h"

#define TPU_GEMV_AVX2 __attribute__((target("avx2,fma")))

namespace tpu::kernels {
namespace {

TPU_GEMV_AVX2 inline float f32_of(float v) { return v; }
TPU_GEMV_AVX2 inline float f32_of(uint16_t v) {
  const uint32_t b = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
TPU_GEMV_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
TPU_GEMV_AVX2 inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// ---- Dot products (one or two rows). ----
template <class T>
TPU_GEMV_AVX2 void dot_cols(int64_t M, int64_t K, const T* A, int64_t a_rs, const T* B, int64_t b_cs, float* C,
                            int64_t ldc, bool accumulate, int64_t j0, int64_t j1) {
  const int64_t k8 = K / 8 * 8;
  // Every cache line of the block's rows names the same line of the next block's rows (L1), on
  // the first row's pass: the hardware prefetchers start over on every row (a few KiB).
  constexpr int64_t kLineSteps = 64 / (8 * static_cast<int64_t>(sizeof(T)));
  for (int64_t j = j0; j < j1; j += 4) {
    const int cols = static_cast<int>(std::min<int64_t>(4, j1 - j));
    const T* w[4];
    for (int c = 0; c < 4; ++c) w[c] = B + (j + std::min(c, cols - 1)) * b_cs;
    const int64_t pf = j + 4 < j1 ? 4 * b_cs : 0;
    for (int64_t i = 0; i < M; ++i) {
      const T* a = A + i * a_rs;
      const int64_t pfi = i == 0 ? pf : 0;
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      for (int64_t k = 0; k < k8; k += 8) {
        if (pfi && (k / 8) % kLineSteps == 0)
          for (int c = 0; c < 4; ++c) _mm_prefetch(reinterpret_cast<const char*>(w[c] + k + pfi), _MM_HINT_T0);
        const __m256 x = load8(a + k);
        s0 = _mm256_fmadd_ps(x, load8(w[0] + k), s0);
        s1 = _mm256_fmadd_ps(x, load8(w[1] + k), s1);
        s2 = _mm256_fmadd_ps(x, load8(w[2] + k), s2);
        s3 = _mm256_fmadd_ps(x, load8(w[3] + k), s3);
      }
      float v[4] = {hsum256(s0), hsum256(s1), hsum256(s2), hsum256(s3)};
      for (int64_t k = k8; k < K; ++k)
        for (int c = 0; c < 4; ++c) v[c] += f32_of(a[k]) * f32_of(w[c][k]);
      float* out = C + i * ldc + j;
      for (int c = 0; c < cols; ++c) out[c] = accumulate ? out[c] + v[c] : v[c];
    }
  }
}

// ---- Broadcast kernel (three to sixteen rows). ----
constexpr int kCols = 6;

thread_local detail::ScratchBuffer t_panel;

// Every output is one chain of FMAs along K in its lane, whatever M; with seg > 0 the chain
// restarts every seg k and the segments' sums are added in turn to C (to C's old value first
// when accumulating): the packed GEMM's order with that K blocking (see gemv_chain_f32_avx2).
template <int V, class T>
TPU_GEMV_AVX2 void bcast_cols(int64_t M, int64_t K, const float* pan, const T* B, int64_t b_cs, float* C,
                              int64_t ldc, bool accumulate, int64_t j0, int64_t j1, int64_t seg) {
  alignas(32) float out[kCols][8 * V];
  if (seg <= 0) seg = K;
  for (int64_t j = j0; j < j1; j += kCols) {
    const int cols = static_cast<int>(std::min<int64_t>(kCols, j1 - j));
    const T* w[kCols];
    for (int c = 0; c < kCols; ++c) w[c] = B + (j + std::min(c, cols - 1)) * b_cs;
    // Per cache line of the weight rows, the same line of the next block's rows is prefetched
    // into the L2 (see bcast_cols in gemv_avx512.cpp: the hardware prefetchers restart on
    // every row of a few KiB and fall behind).
    constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
    const bool pf = j + kCols < j1;
    for (int64_t s0 = 0; s0 < K; s0 += seg) {
      const int64_t s1 = std::min(K, s0 + seg);
      __m256 s[kCols][V];
      for (int c = 0; c < kCols; ++c)
        for (int v = 0; v < V; ++v) s[c][v] = _mm256_setzero_ps();
      for (int64_t k0 = s0; k0 < s1; k0 += kLine) {
        if (pf)
          for (int c = 0; c < kCols; ++c)
            _mm_prefetch(reinterpret_cast<const char*>(w[c] + k0 + kCols * b_cs), _MM_HINT_T1);
        const int64_t ke = std::min(s1, k0 + kLine);
        int64_t k = k0;
        if constexpr (sizeof(T) == 2) {
          // bf16: eight values of each row widened at once into wb, then broadcast from memory
          // by the load unit into each FMA (widened one by one, every value cost a shift and a
          // shuffle on the FMA's port). The same FMAs in the same order as below.
          alignas(32) float wb[kCols][8];
          for (; k + 8 <= ke; k += 8) {
#pragma GCC unroll 6
            for (int c = 0; c < kCols; ++c) _mm256_store_ps(wb[c], load8(w[c] + k));
            asm volatile("" ::: "memory");  // keep wb in memory: broadcasts as loads
#pragma GCC unroll 8
            for (int q = 0; q < 8; ++q) {
              __m256 a[V];
              for (int v = 0; v < V; ++v) a[v] = _mm256_load_ps(pan + (k + q) * 8 * V + 8 * v);
#pragma GCC unroll 6
              for (int c = 0; c < kCols; ++c) {
                const __m256 b = _mm256_broadcast_ss(&wb[c][q]);
                for (int v = 0; v < V; ++v) s[c][v] = _mm256_fmadd_ps(a[v], b, s[c][v]);
              }
            }
          }
        }
        for (; k < ke; ++k) {
          __m256 a[V];
          for (int v = 0; v < V; ++v) a[v] = _mm256_load_ps(pan + k * 8 * V + 8 * v);
#pragma GCC unroll 6
          for (int c = 0; c < kCols; ++c) {
            const __m256 b = _mm256_set1_ps(f32_of(w[c][k]));
            for (int v = 0; v < V; ++v) s[c][v] = _mm256_fmadd_ps(a[v], b, s[c][v]);
          }
        }
      }
      if (s0 == 0) {
        for (int c = 0; c < kCols; ++c)
          for (int v = 0; v < V; ++v) _mm256_store_ps(out[c] + 8 * v, s[c][v]);
        if (accumulate)
          for (int64_t i = 0; i < M; ++i)
            for (int c = 0; c < cols; ++c) out[c][i] = C[i * ldc + j + c] + out[c][i];
      } else {
        for (int c = 0; c < kCols; ++c)
          for (int v = 0; v < V; ++v)
            _mm256_store_ps(out[c] + 8 * v, _mm256_add_ps(_mm256_load_ps(out[c] + 8 * v), s[c][v]));
      }
    }
    for (int64_t i = 0; i < M; ++i) {
      float* o = C + i * ldc + j;
      for (int c = 0; c < cols; ++c) o[c] = out[c][i];
    }
  }
}

// The broadcast kernel over M <= 16 rows (A through its strides), K restarted every seg k (0:
// never).
template <class T>
void bcast_run(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_cs,
               float* C, int64_t ldc, bool accumulate, int64_t seg) {
  const int V = M <= 8 ? 1 : 2;
  const int lanes = 8 * V;
  float* pan = t_panel.get_as<float>(static_cast<size_t>(lanes * K));
  std::memset(pan, 0, sizeof(float) * static_cast<size_t>(lanes * K));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) pan[k * lanes + i] = f32_of(A[i * a_rs + k * a_cs]);
  const int64_t blocks = (N + kCols - 1) / kCols;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, lanes * K * kCols));
  detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t j0 = b0 * kCols, j1 = std::min(N, b1 * kCols);
    if (V == 1)
      bcast_cols<1, T>(M, K, pan, B, b_cs, C, ldc, accumulate, j0, j1, seg);
    else
      bcast_cols<2, T>(M, K, pan, B, b_cs, C, ldc, accumulate, j0, j1, seg);
  }, detail::next_rows(B, N, b_cs));
}

template <class T>
void run(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, const T* B, int64_t b_cs, float* C,
         int64_t ldc, bool accumulate) {
  if (M <= 2) {
    const int64_t blocks = (N + 3) / 4;
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, M * K * 4));
    detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
      dot_cols<T>(M, K, A, a_rs, B, b_cs, C, ldc, accumulate, b0 * 4, std::min(N, b1 * 4));
    }, detail::next_rows(B, N, b_cs));
    return;
  }
  bcast_run<T>(M, N, K, A, a_rs, 1, B, b_cs, C, ldc, accumulate, 0);
}

}  // namespace

bool gemv_chain_f32_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                         int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate, int64_t kc) {
  if (M < 1 || M > kGemvMaxRows || N < 1 || K < 1 || b_rs != 1 || kc <= 0) return false;
  bcast_run<float>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate, kc);
  return true;
}

bool gemv_chain_bf16_avx2(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                          const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate,
                          int64_t kc) {
  if (M < 1 || M > kGemvMaxRows || N < 1 || K < 1 || b_rs != 1 || kc <= 0) return false;
  bcast_run<uint16_t>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate, kc);
  return true;
}

bool gemv_f32_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                   int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  if (!gemv_applies(M, N, K, a_cs, b_rs)) return false;
  run<float>(M, N, K, A, a_rs, B, b_cs, C, ldc, accumulate);
  return true;
}

bool gemv_bf16_avx2(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                    const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  if (!gemv_applies(M, N, K, a_cs, b_rs)) return false;
  run<uint16_t>(M, N, K, A, a_rs, B, b_cs, C, ldc, accumulate);
  return true;
}

}  // namespace tpu::kernels
