// Few-row products against a weight stored as [N, K] rows (linear's x W^T): the decode steps of
// a language model multiply one token (or a small batch) by every weight matrix. The packed
// GEMM path repacks the whole weight on every call for that, which costs as much memory traffic
// as the product itself and then some (the transposed panels are gathered with a stride). Here
// every output C[i, j] is a dot product of row i of A with row j of the weight, both contiguous
// in K, read in place: the weight streams through the cache once per call (four weight rows at a
// time, reused from L1 for every row of A). Columns are split over the pool threads.
//
// Only with AVX-512 (f32 FMA; bf16 with vdpbf16ps when avx512_bf16 is there, else widened to
// f32); the driver falls back to the packed path otherwise.
#include <immintrin.h>

#include <algorithm>

#include "ops/cpu/kernels/gemv.h"
#include "tpucore/cpu_features.h"
#include "tpucore/parallel.h"

#define TPU_GEMV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TPU_GEMV_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

// GCC 12 reports the undefined upper halves inside its own intrinsics (_mm512_reduce_add_ps,
// the widening conversions) as maybe-uninitialized; they are not.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tpu::kernels {
namespace {

constexpr int kCols = 4;  // weight rows per block

struct F32Rows {
  using T = float;
  static constexpr int kStep = 16;
  TPU_GEMV_AVX512 static __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  TPU_GEMV_AVX512 static __m512 fma(__m512 acc, const float* a, const float* b, int64_t n) {
    const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
    return _mm512_fmadd_ps(load(a, m), load(b, m), acc);
  }
};

// bf16 widened to f32 (AVX-512 without avx512_bf16).
struct Bf16Widen {
  using T = uint16_t;
  static constexpr int kStep = 16;
  TPU_GEMV_AVX512 static __m512 load(const uint16_t* p, __mmask16 m) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  TPU_GEMV_AVX512 static __m512 fma(__m512 acc, const uint16_t* a, const uint16_t* b, int64_t n) {
    const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
    return _mm512_fmadd_ps(load(a, m), load(b, m), acc);
  }
};

// bf16 pairs with vdpbf16ps: 32 values per step, each lane adds two products.
struct Bf16Dot {
  using T = uint16_t;
  static constexpr int kStep = 32;
  TPU_GEMV_AVX512_BF16 static __m512 fma(__m512 acc, const uint16_t* a, const uint16_t* b, int64_t n) {
    const __mmask32 m = n >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << n) - 1);
    const __m512i va = _mm512_maskz_loadu_epi16(m, a), vb = _mm512_maskz_loadu_epi16(m, b);
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(va), reinterpret_cast<__m512bh>(vb));
  }
};

// C[i, j0 .. j1) for every row i. Carries the bf16 target so that Bf16Dot inlines; the f32 and
// widening instantiations emit no avx512_bf16 instruction and run without it.
template <class R>
TPU_GEMV_AVX512_BF16 void gemv_cols(int64_t M, int64_t K, const typename R::T* A, int64_t a_rs,
                                    const typename R::T* B, int64_t b_cs, float* C, int64_t ldc, bool accumulate,
                                    int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; j += kCols) {
    const int cols = static_cast<int>(std::min<int64_t>(kCols, j1 - j));
    const typename R::T* w[kCols];
    for (int c = 0; c < kCols; ++c) w[c] = B + (j + std::min(c, cols - 1)) * b_cs;
    for (int64_t i = 0; i < M; ++i) {
      const typename R::T* a = A + i * a_rs;
      // Named accumulators (an array of them was kept on the stack by the compiler).
      __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
      int64_t k = 0;
      for (; k + R::kStep <= K; k += R::kStep) {
        s0 = R::fma(s0, a + k, w[0] + k, R::kStep);
        s1 = R::fma(s1, a + k, w[1] + k, R::kStep);
        s2 = R::fma(s2, a + k, w[2] + k, R::kStep);
        s3 = R::fma(s3, a + k, w[3] + k, R::kStep);
      }
      if (k < K) {
        s0 = R::fma(s0, a + k, w[0] + k, K - k);
        s1 = R::fma(s1, a + k, w[1] + k, K - k);
        s2 = R::fma(s2, a + k, w[2] + k, K - k);
        s3 = R::fma(s3, a + k, w[3] + k, K - k);
      }
      const __m512 acc[kCols] = {s0, s1, s2, s3};
      float* out = C + i * ldc + j;
      for (int c = 0; c < cols; ++c) {
        const float s = _mm512_reduce_add_ps(acc[c]);
        out[c] = accumulate ? out[c] + s : s;
      }
    }
  }
}

template <class R>
void gemv_run(int64_t M, int64_t N, int64_t K, const typename R::T* A, int64_t a_rs, const typename R::T* B,
              int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  // Blocks of kCols columns; a thread takes at least ~256K multiply-adds.
  const int64_t blocks = (N + kCols - 1) / kCols;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, M * K * kCols));
  tpu::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    gemv_cols<R>(M, K, A, a_rs, B, b_cs, C, ldc, accumulate, b0 * kCols, std::min(N, b1 * kCols));
  });
}

bool applies(int64_t M, int64_t N, int64_t K, int64_t a_cs, int64_t b_rs) {
  const CpuFeatures& f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.fma && M >= 1 && M <= kGemvMaxRows && N >= 1 && K >= 16 &&
         a_cs == 1 && b_rs == 1;
}

}  // namespace

bool gemv_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
              int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  if (!applies(M, N, K, a_cs, b_rs)) return false;
  gemv_run<F32Rows>(M, N, K, A, a_rs, B, b_cs, C, ldc, accumulate);
  return true;
}

bool gemv_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs, const uint16_t* B,
               int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  if (!applies(M, N, K, a_cs, b_rs)) return false;
  if (cpu_features().avx512_bf16)
    gemv_run<Bf16Dot>(M, N, K, A, a_rs, B, b_cs, C, ldc, accumulate);
  else
    gemv_run<Bf16Widen>(M, N, K, A, a_rs, B, b_cs, C, ldc, accumulate);
  return true;
}

}  // namespace tpu::kernels

#pragma GCC diagnostic pop
