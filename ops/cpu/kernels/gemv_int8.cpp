// Products with int8 weights read in place (gemv_int8.h). Weight rows are taken four at a time
// (blocks of four output columns, split over the pool threads); the rows of A in groups of up
// to four share every loaded weight vector: per step of 16 (AVX-512) or 8 (AVX2) weights, one
// 16- or 8-byte load, a sign extension and a conversion per weight row, then one FMA per row of
// A. The weight block stays in L1 while the groups of A pass over it, so a batch reads the
// weight from memory once.
//
// These paths keep A in f32; the int8 x int8 byte products, which need A quantized to 8 bits as
// well, are the vnni path (AVX-512 VNNI, gemv_vnni.cpp) and the avx2q8 path (gemv_q8_avx2.cpp).
#include "ops/cpu/kernels/gemv_int8.h"

#include <immintrin.h>

#include <algorithm>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/gemv.h"
#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "ops/cpu/kernels/simd.h"
#include "tpucore/core/batch_invariant.h"
#include "tpucore/core/cpu_features.h"

#define TPU_INT8_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TPU_INT8_AVX2 __attribute__((target("avx2,fma")))

TPU_INTRIN_DIAGNOSTICS_PUSH

namespace tpu::kernels {
namespace {

constexpr int kCols = 4;  // weight rows per block
constexpr int kRows = 4;  // rows of A per group

// Pointers to the block's weight rows (a short last block repeats its last row: reads stay in
// bounds, the extra sums are not stored).
void block_rows(const int8_t* W, int64_t K, int64_t j, int cols, const int8_t* w[kCols]) {
  for (int c = 0; c < kCols; ++c) w[c] = W + (j + std::min(c, cols - 1)) * K;
}

// One step of 16 weights (the first n of them when n < 16: masked loads read nothing past them).
template <int R, bool kTail>
TPU_INT8_AVX512 inline void step_avx512(__m512 (&acc)[R][kCols], const float* A, int64_t lda, const int8_t* const* w,
                                        int64_t k, __mmask16 m) {
  __m512 wv[kCols];
#pragma GCC unroll 4
  for (int c = 0; c < kCols; ++c) {
    const __m128i b = kTail ? _mm_maskz_loadu_epi8(m, w[c] + k) : _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[c] + k));
    wv[c] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m512 x = kTail ? _mm512_maskz_loadu_ps(m, A + r * lda + k) : _mm512_loadu_ps(A + r * lda + k);
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm512_fmadd_ps(x, wv[c], acc[r][c]);
  }
}

template <int R>
TPU_INT8_AVX512 void group_avx512(int64_t K, const float* A, int64_t lda, const int8_t* const* w, int cols,
                                  const float* scale, float* C, int64_t ldc) {
  __m512 acc[R][kCols];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t k16 = K & ~int64_t{15};
  for (int64_t k = 0; k < k16; k += 16) step_avx512<R, false>(acc, A, lda, w, k, 0);
  if (k16 < K) step_avx512<R, true>(acc, A, lda, w, k16, static_cast<__mmask16>((1u << (K - k16)) - 1));
  float sums[R][kCols];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) sums[r][c] = _mm512_reduce_add_ps(acc[r][c]);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) C[r * ldc + c] = scale[c] * sums[r][c];
}

template <int R>
TPU_INT8_AVX2 void group_avx2(int64_t K, const float* A, int64_t lda, const int8_t* const* w, int cols,
                              const float* scale, float* C, int64_t ldc) {
  __m256 acc[R][kCols];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_setzero_ps();
  const int64_t k8 = K & ~int64_t{7};
  for (int64_t k = 0; k < k8; k += 8) {
    __m256 wv[kCols];
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c)
      wv[c] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[c] + k))));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_loadu_ps(A + r * lda + k);
#pragma GCC unroll 4
      for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_fmadd_ps(x, wv[c], acc[r][c]);
    }
  }
  float sums[R][kCols];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) sums[r][c] = hsum256(acc[r][c]);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) {
      float s = sums[r][c];
      for (int64_t k = k8; k < K; ++k) s += A[r * lda + k] * static_cast<float>(w[c][k]);
      C[r * ldc + c] = scale[c] * s;
    }
}

template <int R>
void group_scalar(int64_t K, const float* A, int64_t lda, const int8_t* const* w, int cols, const float* scale, float* C,
                  int64_t ldc) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += A[r * lda + k] * static_cast<float>(w[c][k]);
      C[r * ldc + c] = scale[c] * s;
    }
}

using GroupFn = void (*)(int64_t, const float*, int64_t, const int8_t* const*, int, const float*, float*, int64_t);

template <template <int> class Sel>
struct Groups {
  static constexpr GroupFn fns[kRows + 1] = {nullptr, Sel<1>::fn, Sel<2>::fn, Sel<3>::fn, Sel<4>::fn};
};
template <int R> struct SelAvx512 { static constexpr GroupFn fn = &group_avx512<R>; };
template <int R> struct SelAvx2 { static constexpr GroupFn fn = &group_avx2<R>; };
template <int R> struct SelScalar { static constexpr GroupFn fn = &group_scalar<R>; };

const GroupFn* group_table(Int8GemvPath p) {
  switch (p) {
    case Int8GemvPath::avx512: return Groups<SelAvx512>::fns;
    case Int8GemvPath::avx2: return Groups<SelAvx2>::fns;
    case Int8GemvPath::scalar: return Groups<SelScalar>::fns;
    case Int8GemvPath::best: case Int8GemvPath::vnni: case Int8GemvPath::avx2q8: break;
  }
  return nullptr;
}

// Many rows (the avx2q8 path's): panels of the weight dequantized to f32 (each row times its
// scale), then the float GEMM.
void i8_many_rows(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const int8_t* W, const float* scale,
                  float* C, int64_t ldc) {
  detail::gemm_dequantized_panels(M, N, K, A, lda, C, ldc, [&](int64_t j, float* out) {
    const int8_t* row = W + j * K;
    for (int64_t k = 0; k < K; ++k) out[k] = static_cast<float>(row[k]) * scale[j];
  });
}

}  // namespace

Int8GemvPath int8_gemv_resolve(Int8GemvPath p) {
  if (p != Int8GemvPath::best) return p;
  const CpuFeatures& f = cpu_features();
  if (int8_vnni_available()) return Int8GemvPath::vnni;
  if (f.avx2 && f.fma) return Int8GemvPath::avx2q8;
  return Int8GemvPath::scalar;
}

bool int8_gemv_quantizes_rows(Int8GemvPath p, int64_t M) {
  const Int8GemvPath r = int8_gemv_resolve(p);
  return r == Int8GemvPath::vnni || (r == Int8GemvPath::avx2q8 && (M < kInt8Q8ManyRows || batch_invariant()));
}

bool int8_gemv_path_available(Int8GemvPath p) {
  const CpuFeatures& f = cpu_features();
  switch (p) {
    case Int8GemvPath::avx512: return f.avx512f && f.avx512bw && f.avx512vl && f.fma;
    case Int8GemvPath::avx2: case Int8GemvPath::avx2q8: return f.avx2 && f.fma;
    case Int8GemvPath::vnni: return int8_vnni_available();
    case Int8GemvPath::best: case Int8GemvPath::scalar: return true;
  }
  return false;
}

const char* int8_gemv_best_path() {
  switch (int8_gemv_resolve(Int8GemvPath::best)) {
    case Int8GemvPath::vnni: return "vnni";
    case Int8GemvPath::avx2q8: return "avx2q8";
    case Int8GemvPath::avx512: return "avx512";
    case Int8GemvPath::avx2: return "avx2";
    default: return "scalar";
  }
}

void gemv_int8(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const int8_t* W, const float* scale,
               float* C, int64_t ldc, Int8GemvPath path) {
  if (M <= 0 || N <= 0) return;
  const Int8GemvPath resolved = int8_gemv_resolve(path);
  if (resolved == Int8GemvPath::vnni) return gemv_int8_vnni(M, N, K, A, lda, W, scale, C, ldc);
  if (resolved == Int8GemvPath::avx2q8)
    return int8_gemv_quantizes_rows(resolved, M) ? gemv_int8_q8avx2(M, N, K, A, lda, W, scale, C, ldc)
                                                 : i8_many_rows(M, N, K, A, lda, W, scale, C, ldc);
  const GroupFn* fns = group_table(resolved);
  const int64_t blocks = (N + kCols - 1) / kCols;
  // About 64K multiply-adds per block run before the work is worth a second thread.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, K * M * kCols));
  detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j = b * kCols;
      const int cols = static_cast<int>(std::min<int64_t>(kCols, N - j));
      const int8_t* w[kCols];
      block_rows(W, K, j, cols, w);
      for (int64_t i = 0; i < M; i += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, M - i));
        fns[rows](K, A + i * lda, lda, w, cols, scale + j, C + i * ldc + j, ldc);
      }
    }
  }, detail::next_rows(W, N, K));
}

}  // namespace tpu::kernels

TPU_INTRIN_DIAGNOSTICS_POP
