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
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/parallel.h"

#define TPU_GEMV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TPU_GEMV_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

// GCC 12 reports the undefined upper halves inside its own intrinsics (_mm512_reduce_add_ps,
// the widening conversions) as maybe-uninitialized; they are not.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tpu::kernels {
namespace {

constexpr int kCols = 4;  // weight rows per block

// Per element type: V, the register of one step; load(p, n) of the next min(n, kStep) values
// (zeros past them); mac(acc, a, w) adds the step's products to 16 f32 lanes.
struct F32Rows {
  using T = float;
  using V = __m512;
  static constexpr int kStep = 16;
  TPU_GEMV_AVX512 static V load(const float* p, int64_t n) {
    const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
    return _mm512_maskz_loadu_ps(m, p);
  }
  TPU_GEMV_AVX512 static __m512 mac(__m512 acc, V a, V w) { return _mm512_fmadd_ps(a, w, acc); }
};

// bf16 widened to f32 (AVX-512 without avx512_bf16).
struct Bf16Widen {
  using T = uint16_t;
  using V = __m512;
  static constexpr int kStep = 16;
  TPU_GEMV_AVX512 static V load(const uint16_t* p, int64_t n) {
    const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  TPU_GEMV_AVX512 static __m512 mac(__m512 acc, V a, V w) { return _mm512_fmadd_ps(a, w, acc); }
};

// bf16 pairs with vdpbf16ps: 32 values per step, each lane adds two products.
struct Bf16Dot {
  using T = uint16_t;
  using V = __m512i;
  static constexpr int kStep = 32;
  TPU_GEMV_AVX512_BF16 static V load(const uint16_t* p, int64_t n) {
    const __mmask32 m = n >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << n) - 1);
    return _mm512_maskz_loadu_epi16(m, p);
  }
  TPU_GEMV_AVX512_BF16 static __m512 mac(__m512 acc, V a, V w) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(w));
  }
};

template <class R>
TPU_GEMV_AVX512_BF16 inline void store4(float* out, int cols, bool accumulate, __m512 s0, __m512 s1, __m512 s2,
                                        __m512 s3) {
  const float v[kCols] = {_mm512_reduce_add_ps(s0), _mm512_reduce_add_ps(s1), _mm512_reduce_add_ps(s2),
                          _mm512_reduce_add_ps(s3)};
  for (int c = 0; c < cols; ++c) out[c] = accumulate ? out[c] + v[c] : v[c];
}

// C[i, j0 .. j1) for every row i: blocks of 4 weight rows; two rows of A at a time share each
// loaded weight vector (8 accumulators, 6 loads per 8 multiply-adds), a last odd row alone.
// Named accumulators: an array of them was kept on the stack by the compiler. Carries the bf16
// target so that Bf16Dot inlines; the f32 and widening instantiations emit no avx512_bf16
// instruction and run without it.
template <class R>
TPU_GEMV_AVX512_BF16 void gemv_cols(int64_t M, int64_t K, const typename R::T* A, int64_t a_rs,
                                    const typename R::T* B, int64_t b_cs, float* C, int64_t ldc, bool accumulate,
                                    int64_t j0, int64_t j1) {
  using V = typename R::V;
  for (int64_t j = j0; j < j1; j += kCols) {
    const int cols = static_cast<int>(std::min<int64_t>(kCols, j1 - j));
    const typename R::T* w[kCols];
    for (int c = 0; c < kCols; ++c) w[c] = B + (j + std::min(c, cols - 1)) * b_cs;
    int64_t i = 0;
    for (; i + 2 <= M; i += 2) {
      const typename R::T *a0 = A + i * a_rs, *a1 = a0 + a_rs;
      __m512 s00 = _mm512_setzero_ps(), s01 = s00, s02 = s00, s03 = s00, s10 = s00, s11 = s00, s12 = s00, s13 = s00;
      for (int64_t k = 0; k < K; k += R::kStep) {
        const int64_t n = K - k;
        const V w0 = R::load(w[0] + k, n), w1 = R::load(w[1] + k, n), w2 = R::load(w[2] + k, n),
                w3 = R::load(w[3] + k, n);
        const V x0 = R::load(a0 + k, n), x1 = R::load(a1 + k, n);
        s00 = R::mac(s00, x0, w0);
        s01 = R::mac(s01, x0, w1);
        s02 = R::mac(s02, x0, w2);
        s03 = R::mac(s03, x0, w3);
        s10 = R::mac(s10, x1, w0);
        s11 = R::mac(s11, x1, w1);
        s12 = R::mac(s12, x1, w2);
        s13 = R::mac(s13, x1, w3);
      }
      store4<R>(C + i * ldc + j, cols, accumulate, s00, s01, s02, s03);
      store4<R>(C + (i + 1) * ldc + j, cols, accumulate, s10, s11, s12, s13);
    }
    if (i < M) {
      const typename R::T* a0 = A + i * a_rs;
      __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      for (int64_t k = 0; k < K; k += R::kStep) {
        const int64_t n = K - k;
        const V x0 = R::load(a0 + k, n);
        s0 = R::mac(s0, x0, R::load(w[0] + k, n));
        s1 = R::mac(s1, x0, R::load(w[1] + k, n));
        s2 = R::mac(s2, x0, R::load(w[2] + k, n));
        s3 = R::mac(s3, x0, R::load(w[3] + k, n));
      }
      store4<R>(C + i * ldc + j, cols, accumulate, s0, s1, s2, s3);
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
