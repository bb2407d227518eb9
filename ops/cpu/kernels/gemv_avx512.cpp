// Few-row products against a weight stored as [N, K] rows (linear's x W^T): the decode steps of
// a language model multiply one token (or a small batch) by every weight matrix. The packed
// GEMM path repacks the whole weight on every call for that, which costs as much memory traffic
// as the product itself and then some (the transposed panels are gathered with a stride). Here
// the weight is read in place, streaming through the cache once per call. Two kernels:
// - up to kGemvDotRows rows: every output C[i, j] is a dot product of row i of A with row j of
//   the weight, both contiguous in K (four weight rows at a time, reused from L1 for every row
//   of A; one horizontal sum per output);
// - more rows (a decode batch): A is transposed once into a [K][16] panel (rows past M zero),
//   and each block of kBcastCols weight rows is streamed along K: one 16-lane FMA per weight
//   element, the element broadcast from memory, the panel row shared by the block. An
//   accumulator then holds one column of C for all 16 rows: no horizontal sums, and 1 + 1/8
//   loads per FMA instead of the 3/4 vector loads of the dot-product kernel. Up to
//   kGemvMaxRowsWide rows (a prefill of a decode batch) run in groups of 16 over each block of
//   weight rows while it is in L1, as long as the panel fits in half of the L2.
// Columns are split over the pool threads.
//
// The broadcast kernel sums every output as one chain of FMAs along K in its own lane, the order
// of the packed GEMM's micro-kernel; restarted at the GEMM's K blocks (gemv_chain_f32 /
// gemv_chain_bf16) it gives the GEMM's bits for any number of rows: the batch-invariant mode's
// few-row kernel.
//
// Only with AVX-512 (f32 FMA; bf16 with vdpbf16ps when avx512_bf16 is there, else widened to
// f32); gemv_avx2.cpp serves AVX2 CPUs and the driver falls back to the packed path otherwise.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/gemv.h"
#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "ops/cpu/kernels/scratch.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/parallel.h"

#define TPU_GEMV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TPU_GEMV_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

TPU_INTRIN_DIAGNOSTICS_PUSH

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
    // The first pass over the block prefetches the same line (a step is 64 bytes) of the next
    // block's weight rows: the hardware prefetchers start over on every row (a few KiB).
    const int64_t pf = j + kCols < j1 ? kCols * b_cs : 0;
    int64_t i = 0;
    for (; i + 2 <= M; i += 2) {
      const typename R::T *a0 = A + i * a_rs, *a1 = a0 + a_rs;
      const int64_t pfi = i == 0 ? pf : 0;
      __m512 s00 = _mm512_setzero_ps(), s01 = s00, s02 = s00, s03 = s00, s10 = s00, s11 = s00, s12 = s00, s13 = s00;
      for (int64_t k = 0; k < K; k += R::kStep) {
        const int64_t n = K - k;
        if (pfi)
          for (int c = 0; c < kCols; ++c) _mm_prefetch(reinterpret_cast<const char*>(w[c] + k + pfi), _MM_HINT_T0);
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
      const int64_t pfi = i == 0 ? pf : 0;
      __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      for (int64_t k = 0; k < K; k += R::kStep) {
        const int64_t n = K - k;
        if (pfi)
          for (int c = 0; c < kCols; ++c) _mm_prefetch(reinterpret_cast<const char*>(w[c] + k + pfi), _MM_HINT_T0);
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

// ---- Broadcast kernel (more than kGemvDotRows rows). ----

constexpr int kBcastCols = 8;  // weight rows per block (8 accumulators of 16 rows each)

// Thread-local scratch for the transposed A panel.
thread_local detail::ScratchBuffer t_panel;

// Per element type: P, one panel word (f32, or a pair of bf16 along K for vdpbf16ps); kPer, k
// values per word; pack(A) the panel; bcast_mac(acc, panel row, weight word pointer).
struct F32Bcast {
  using T = float;
  using P = float;
  static constexpr int kPer = 1;
  static void pack(int64_t M, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, float* pan) {
    const int64_t groups = (M + 15) / 16;
    std::memset(pan, 0, sizeof(float) * 16 * static_cast<size_t>(K * groups));
    for (int64_t i = 0; i < M; ++i) {
      float* g = pan + (i / 16) * K * 16 + i % 16;
      for (int64_t k = 0; k < K; ++k) g[k * 16] = A[i * a_rs + k * a_cs];
    }
  }
  TPU_GEMV_AVX512 static __m512 mac(__m512 acc, __m512 a, const float* w) {
    return _mm512_fmadd_ps(a, _mm512_set1_ps(*w), acc);
  }
  TPU_GEMV_AVX512 static __m512 load(const float* pan) { return _mm512_load_ps(pan); }
};

struct Bf16Bcast {
  using T = uint16_t;
  using P = uint32_t;
  static constexpr int kPer = 2;
  static void pack(int64_t M, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs, uint32_t* pan) {
    const int64_t kp = (K + 1) / 2, groups = (M + 15) / 16;
    std::memset(pan, 0, sizeof(uint32_t) * 16 * static_cast<size_t>(kp * groups));
    for (int64_t i = 0; i < M; ++i) {
      const uint16_t* a = A + i * a_rs;
      uint32_t* g = pan + (i / 16) * kp * 16 + i % 16;
      for (int64_t k = 0; k < K; ++k) {
        const uint32_t v = a[k * a_cs];
        g[(k / 2) * 16] |= (k & 1) ? v << 16 : v;
      }
    }
  }
  TPU_GEMV_AVX512_BF16 static __m512 mac(__m512 acc, __m512i a, const uint16_t* w) {
    uint32_t pair;
    std::memcpy(&pair, w, sizeof pair);
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a),
                            reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair))));
  }
  TPU_GEMV_AVX512_BF16 static __m512 mac_last(__m512 acc, __m512i a, const uint16_t* w) {
    const uint32_t pair = *w;  // odd K: the last k alone, paired with zero
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a),
                            reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair))));
  }
  TPU_GEMV_AVX512_BF16 static __m512i load(const uint32_t* pan) { return _mm512_load_si512(pan); }
};

// bf16 widened to f32 (AVX-512 without avx512_bf16): an f32 panel, each weight element widened
// as it is broadcast (exact: every bf16 is an f32).
struct Bf16WidenBcast {
  using T = uint16_t;
  using P = float;
  static constexpr int kPer = 1;
  static void pack(int64_t M, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs, float* pan) {
    const int64_t groups = (M + 15) / 16;
    std::memset(pan, 0, sizeof(float) * 16 * static_cast<size_t>(K * groups));
    for (int64_t i = 0; i < M; ++i) {
      float* g = pan + (i / 16) * K * 16 + i % 16;
      for (int64_t k = 0; k < K; ++k) {
        const uint32_t bits = static_cast<uint32_t>(A[i * a_rs + k * a_cs]) << 16;
        std::memcpy(g + k * 16, &bits, sizeof bits);
      }
    }
  }
  TPU_GEMV_AVX512 static __m512 mac(__m512 acc, __m512 a, const uint16_t* w) {
    return _mm512_fmadd_ps(a, _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(uint32_t{*w} << 16))), acc);
  }
  TPU_GEMV_AVX512 static __m512 load(const float* pan) { return _mm512_load_ps(pan); }
};

// C[0 .. M, j0 .. j1) from the panel: blocks of kBcastCols weight rows, each streamed along K once
// per group of 16 rows (the block stays in L1 across the groups; panel group g holds rows
// 16 g .. 16 g + 15 at pan + g * words * 16). Every output is one chain of multiply-adds along K
// in its own lane, whatever M. With seg_words > 0 (a multiple of 16) the chain restarts from
// zero every seg_words panel words and the segments' sums are added in turn to C (to C's old
// value first when accumulating): the packed GEMM's order with that K blocking, so that both
// give the same bits.
template <class R>
TPU_GEMV_AVX512_BF16 void bcast_cols(int64_t M, int64_t K, const typename R::P* pan, const typename R::T* B,
                                     int64_t b_cs, float* C, int64_t ldc, bool accumulate, int64_t j0, int64_t j1,
                                     int64_t seg_words) {
  const int64_t kfull = K / R::kPer;  // whole panel words
  const int64_t words = (K + R::kPer - 1) / R::kPer;
  const int64_t seg = seg_words > 0 ? seg_words : words;
  alignas(64) float out[kBcastCols][16];
  for (int64_t j = j0; j < j1; j += kBcastCols) {
    const int cols = static_cast<int>(std::min<int64_t>(kBcastCols, j1 - j));
    const typename R::T* w[kBcastCols];
    for (int c = 0; c < kBcastCols; ++c) w[c] = B + (j + std::min(c, cols - 1)) * b_cs;
    for (int64_t g = 0; g * 16 < M; ++g) {
    const typename R::P* gp = pan + g * words * 16;
    const int64_t rows = std::min<int64_t>(16, M - g * 16);
    // Each 16 panel words take one cache line of every weight row; meanwhile the same line of
    // the next block's rows is prefetched into the L2. The weight streams through once, and the
    // hardware prefetchers, which start over on every row (a few KiB) at the cost of a few
    // exposed misses each, fell behind: 16 rows x [32000, 512] went 10.7 -> 7.1 ms on one
    // core of the Intel Xeon, 6.0 -> 3.9 ms on two. Not for later row groups: the block is in
    // L1 by then.
    const bool pf = g == 0 && j + kBcastCols < j1;
    for (int64_t s0w = 0; s0w < words; s0w += seg) {
    const int64_t s1w = std::min(words, s0w + seg);
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    const int64_t pend = std::min(kfull, s1w);
    for (int64_t p0 = s0w; p0 < pend; p0 += 16) {
      if (pf)
        for (int c = 0; c < kBcastCols; ++c)
          _mm_prefetch(reinterpret_cast<const char*>(w[c] + p0 * R::kPer + kBcastCols * b_cs), _MM_HINT_T1);
      const int64_t pe = std::min<int64_t>(pend, p0 + 16);
      for (int64_t p = p0; p < pe; ++p) {
        const auto a = R::load(gp + p * 16);
        const int64_t k = p * R::kPer;
        s0 = R::mac(s0, a, w[0] + k);
        s1 = R::mac(s1, a, w[1] + k);
        s2 = R::mac(s2, a, w[2] + k);
        s3 = R::mac(s3, a, w[3] + k);
        s4 = R::mac(s4, a, w[4] + k);
        s5 = R::mac(s5, a, w[5] + k);
        s6 = R::mac(s6, a, w[6] + k);
        s7 = R::mac(s7, a, w[7] + k);
      }
    }
    if constexpr (R::kPer == 2) {
      if ((K & 1) && kfull < s1w) {
        const auto a = R::load(gp + kfull * 16);
        const int64_t k = kfull * 2;
        s0 = R::mac_last(s0, a, w[0] + k);
        s1 = R::mac_last(s1, a, w[1] + k);
        s2 = R::mac_last(s2, a, w[2] + k);
        s3 = R::mac_last(s3, a, w[3] + k);
        s4 = R::mac_last(s4, a, w[4] + k);
        s5 = R::mac_last(s5, a, w[5] + k);
        s6 = R::mac_last(s6, a, w[6] + k);
        s7 = R::mac_last(s7, a, w[7] + k);
      }
    }
    if (s0w == 0) {
      _mm512_store_ps(out[0], s0);
      _mm512_store_ps(out[1], s1);
      _mm512_store_ps(out[2], s2);
      _mm512_store_ps(out[3], s3);
      _mm512_store_ps(out[4], s4);
      _mm512_store_ps(out[5], s5);
      _mm512_store_ps(out[6], s6);
      _mm512_store_ps(out[7], s7);
      if (accumulate)
        for (int64_t i = 0; i < rows; ++i) {
          const float* c = C + (g * 16 + i) * ldc + j;
          for (int q = 0; q < cols; ++q) out[q][i] = c[q] + out[q][i];
        }
    } else {
      _mm512_store_ps(out[0], _mm512_add_ps(_mm512_load_ps(out[0]), s0));
      _mm512_store_ps(out[1], _mm512_add_ps(_mm512_load_ps(out[1]), s1));
      _mm512_store_ps(out[2], _mm512_add_ps(_mm512_load_ps(out[2]), s2));
      _mm512_store_ps(out[3], _mm512_add_ps(_mm512_load_ps(out[3]), s3));
      _mm512_store_ps(out[4], _mm512_add_ps(_mm512_load_ps(out[4]), s4));
      _mm512_store_ps(out[5], _mm512_add_ps(_mm512_load_ps(out[5]), s5));
      _mm512_store_ps(out[6], _mm512_add_ps(_mm512_load_ps(out[6]), s6));
      _mm512_store_ps(out[7], _mm512_add_ps(_mm512_load_ps(out[7]), s7));
    }
    }
    for (int64_t i = 0; i < rows; ++i) {
      float* c = C + (g * 16 + i) * ldc + j;
      for (int q = 0; q < cols; ++q) c[q] = out[q][i];
    }
    }
  }
}

template <class R>
void bcast_run(int64_t M, int64_t N, int64_t K, const typename R::T* A, int64_t a_rs, int64_t a_cs,
               const typename R::T* B, int64_t b_cs, float* C, int64_t ldc, bool accumulate, int64_t seg_words = 0) {
  const int64_t words = (K + R::kPer - 1) / R::kPer;
  const int64_t groups = (M + 15) / 16;
  auto* pan = static_cast<typename R::P*>(
      t_panel.get(sizeof(typename R::P) * 16 * static_cast<size_t>(words * groups)));
  R::pack(M, K, A, a_rs, a_cs, pan);
  const int64_t blocks = (N + kBcastCols - 1) / kBcastCols;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, 16 * groups * K * kBcastCols));
  detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
    bcast_cols<R>(M, K, pan, B, b_cs, C, ldc, accumulate, b0 * kBcastCols, std::min(N, b1 * kBcastCols), seg_words);
  }, detail::next_rows(B, N, b_cs));
}

template <class R>
void gemv_run(int64_t M, int64_t N, int64_t K, const typename R::T* A, int64_t a_rs, const typename R::T* B,
              int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  // Blocks of kCols columns; a thread takes at least ~256K multiply-adds.
  const int64_t blocks = (N + kCols - 1) / kCols;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, M * K * kCols));
  detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
    gemv_cols<R>(M, K, A, a_rs, B, b_cs, C, ldc, accumulate, b0 * kCols, std::min(N, b1 * kCols));
  }, detail::next_rows(B, N, b_cs));
}

// Rows the broadcast kernel takes beyond kGemvMaxRows: up to kGemvMaxRowsWide while the panel
// (16-row groups x K, 4 bytes a value) takes at most half of the L2, so it stays there while
// each block of weight rows is reused from L1 by every group.
bool wide_ok(int64_t M, int64_t N, int64_t K, int64_t a_cs, int64_t b_rs) {
  if (M <= kGemvMaxRows || M > kGemvMaxRowsWide || N < 1 || K < 16 || a_cs != 1 || b_rs != 1) return false;
  const int64_t l2 = cpu_caches().l2 > 0 ? cpu_caches().l2 : int64_t{512} << 10;
  return (M + 15) / 16 * 16 * K * 4 <= l2 / 2;
}

bool avx512_ok() {
  const CpuFeatures& f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.fma;
}

// ---- Transposing kernel (batch-invariant mode, up to kGemvDotRows rows). ----
// The chains of the broadcast kernel with the weight rows in the lanes instead of the rows of A:
// 16 weight rows x 16 words along K are loaded and transposed in registers (64 shuffles), then
// every word of the block, in order, is multiplied into one accumulator per row of A (the A word
// broadcast from the panel). Each output is the same chain of multiply-adds as in bcast_cols,
// at a quarter of its vector operations for one row.

// Per element type: tload(w, n) the next 16 words of a weight row as 32-bit lanes (zero past n
// elements); tmac(acc, a, col) the word products of the broadcast A word a and the column col.
struct F32Transposed : F32Bcast {
  TPU_GEMV_AVX512 static __m512i tload(const float* w, int64_t n) {
    return _mm512_castps_si512(F32Rows::load(w, n));
  }
  TPU_GEMV_AVX512 static __m512 tmac(__m512 acc, __m512i a, __m512i col) {
    return _mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(col), acc);
  }
};
struct Bf16WidenTransposed : Bf16WidenBcast {
  TPU_GEMV_AVX512 static __m512i tload(const uint16_t* w, int64_t n) {
    return _mm512_castps_si512(Bf16Widen::load(w, n));
  }
  TPU_GEMV_AVX512 static __m512 tmac(__m512 acc, __m512i a, __m512i col) {
    return _mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(col), acc);
  }
};
struct Bf16PairsTransposed : Bf16Bcast {
  TPU_GEMV_AVX512_BF16 static __m512i tload(const uint16_t* w, int64_t n) { return Bf16Dot::load(w, n); }
  TPU_GEMV_AVX512_BF16 static __m512 tmac(__m512 acc, __m512i a, __m512i col) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(col));
  }
};

// r[c] = 16 words of row c -> r[w] = word w of rows 0..15 (32-bit lanes).
TPU_GEMV_AVX512 inline void transpose16_words(__m512i (&r)[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // u[4 i + q], 128-bit lane L: rows 4 i .. 4 i + 3 of word 4 L + q.
  for (int q = 0; q < 4; ++q) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x44), v1 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xee);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x44), v3 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xee);
    r[q] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + q] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
    r[8 + q] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + q] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
  }
}

// C[0 .. M, j0 .. j1) for M (<= 4, kGemvDotRows) rows from the panel of bcast_run (row i in lane i), K
// restarted every seg_words words as in bcast_cols.
template <class R, int M>
TPU_GEMV_AVX512_BF16 void tdot_cols(int64_t K, const typename R::P* pan, const typename R::T* B,
                                    int64_t b_cs, float* C, int64_t ldc, bool accumulate, int64_t j0, int64_t j1,
                                    int64_t seg_words) {
  const int64_t words = (K + R::kPer - 1) / R::kPer;
  const int64_t seg = seg_words > 0 ? seg_words : words;
  for (int64_t j = j0; j < j1; j += 16) {
    const int cols = static_cast<int>(std::min<int64_t>(16, j1 - j));
    const __mmask16 mask = cols >= 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1);
    const typename R::T* w[16];
    for (int c = 0; c < 16; ++c) w[c] = B + (j + std::min(c, cols - 1)) * b_cs;
    // Each step prefetches the same line of the next block's 16 weight rows (as gemv_cols): the
    // hardware prefetchers start over on every row.
    const bool pf_next = j + 16 < j1;
    const int pf_cols = pf_next ? static_cast<int>(std::min<int64_t>(16, j1 - j - 16)) : 0;
    __m512 tot[M];
    for (int64_t s0w = 0; s0w < words; s0w += seg) {
      const int64_t s1w = std::min(words, s0w + seg);
      __m512 acc[M];
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps();
      for (int64_t p0 = s0w; p0 < s1w; p0 += 16) {
        const int64_t n = K - p0 * R::kPer;  // elements left in the rows
        __m512i r[16];
#pragma GCC unroll 16
        for (int c = 0; c < 16; ++c) r[c] = R::tload(w[c] + p0 * R::kPer, n);
        for (int c = 0; c < pf_cols; ++c)
          _mm_prefetch(reinterpret_cast<const char*>(w[c] + 16 * b_cs + p0 * R::kPer), _MM_HINT_T0);
        transpose16_words(r);
        const uint32_t* aw = reinterpret_cast<const uint32_t*>(pan + p0 * 16);
        if (p0 + 16 <= s1w) {
#pragma GCC unroll 16
          for (int q = 0; q < 16; ++q)
#pragma GCC unroll 4
            for (int i = 0; i < M; ++i) acc[i] = R::tmac(acc[i], _mm512_set1_epi32(static_cast<int>(aw[q * 16 + i])), r[q]);
        } else {
          for (int64_t q = 0; q < s1w - p0; ++q)
#pragma GCC unroll 4
            for (int i = 0; i < M; ++i) acc[i] = R::tmac(acc[i], _mm512_set1_epi32(static_cast<int>(aw[q * 16 + i])), r[q]);
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) {
        if (s0w > 0) tot[i] = _mm512_add_ps(tot[i], acc[i]);
        else if (accumulate) tot[i] = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, C + i * ldc + j), acc[i]);
        else tot[i] = acc[i];
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) _mm512_mask_storeu_ps(C + i * ldc + j, mask, tot[i]);
  }
}

template <class R>
void tdot_run(int64_t M, int64_t N, int64_t K, const typename R::T* A, int64_t a_rs, int64_t a_cs,
              const typename R::T* B, int64_t b_cs, float* C, int64_t ldc, bool accumulate, int64_t seg_words) {
  const int64_t words = (K + R::kPer - 1) / R::kPer;
  auto* pan = static_cast<typename R::P*>(t_panel.get(sizeof(typename R::P) * 16 * static_cast<size_t>(words)));
  R::pack(M, K, A, a_rs, a_cs, pan);
  const int64_t blocks = (N + 15) / 16;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, 16 * K));
  detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t j0 = b0 * 16, j1 = std::min(N, b1 * 16);
    switch (M) {
      case 1: tdot_cols<R, 1>(K, pan, B, b_cs, C, ldc, accumulate, j0, j1, seg_words); break;
      case 2: tdot_cols<R, 2>(K, pan, B, b_cs, C, ldc, accumulate, j0, j1, seg_words); break;
      case 3: tdot_cols<R, 3>(K, pan, B, b_cs, C, ldc, accumulate, j0, j1, seg_words); break;
      default: tdot_cols<R, 4>(K, pan, B, b_cs, C, ldc, accumulate, j0, j1, seg_words); break;
    }
  }, detail::next_rows(B, N, b_cs));
}

// Whether the broadcast kernel takes M rows in batch-invariant mode: any M up to kGemvMaxRows,
// and up to kGemvMaxRowsWide while the panel takes at most half of the L2 (as wide_ok).
bool chain_ok(int64_t M, int64_t N, int64_t K, int64_t b_rs, int64_t kc_words) {
  if (!avx512_ok() || M < 1 || N < 1 || K < 1 || b_rs != 1 || kc_words <= 0 || kc_words % 16 != 0) return false;
  if (M <= kGemvMaxRows) return true;
  const int64_t l2 = cpu_caches().l2 > 0 ? cpu_caches().l2 : int64_t{512} << 10;
  return M <= kGemvMaxRowsWide && (M + 15) / 16 * 16 * K * 4 <= l2 / 2;
}

}  // namespace

bool gemv_chain_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                    int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate, int64_t kc_words) {
  if (!chain_ok(M, N, K, b_rs, kc_words)) return false;
  if (M <= kGemvDotRows) tdot_run<F32Transposed>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate, kc_words);
  else bcast_run<F32Bcast>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate, kc_words);
  return true;
}

bool gemv_chain_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                     const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate,
                     int64_t kc_words) {
  if (!chain_ok(M, N, K, b_rs, kc_words)) return false;
  if (!cpu_features().avx512_bf16)
    return gemv_chain_bf16_widened(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate, kc_words);
  if (M <= kGemvDotRows) tdot_run<Bf16PairsTransposed>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate, kc_words);
  else bcast_run<Bf16Bcast>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate, kc_words);
  return true;
}

bool gemv_chain_bf16_widened(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                             const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate,
                             int64_t kc_words) {
  if (!chain_ok(M, N, K, b_rs, kc_words)) return false;
  if (M <= kGemvDotRows) tdot_run<Bf16WidenTransposed>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate, kc_words);
  else bcast_run<Bf16WidenBcast>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate, kc_words);
  return true;
}

bool gemv_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
              int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  if (avx512_ok() && wide_ok(M, N, K, a_cs, b_rs)) {
    bcast_run<F32Bcast>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate);
    return true;
  }
  if (!gemv_applies(M, N, K, a_cs, b_rs)) return false;
  if (!avx512_ok())
    return gemm_avx2_available() && gemv_f32_avx2(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate);
  if (M > kGemvDotRows)
    bcast_run<F32Bcast>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate);
  else
    gemv_run<F32Rows>(M, N, K, A, a_rs, B, b_cs, C, ldc, accumulate);
  return true;
}

bool gemv_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs, const uint16_t* B,
               int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  if (avx512_ok() && cpu_features().avx512_bf16 && wide_ok(M, N, K, a_cs, b_rs)) {
    bcast_run<Bf16Bcast>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate);
    return true;
  }
  if (!gemv_applies(M, N, K, a_cs, b_rs)) return false;
  if (!avx512_ok())
    return gemm_avx2_available() && gemv_bf16_avx2(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate);
  if (cpu_features().avx512_bf16 && M > kGemvDotRows)
    bcast_run<Bf16Bcast>(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate);
  else if (cpu_features().avx512_bf16)
    gemv_run<Bf16Dot>(M, N, K, A, a_rs, B, b_cs, C, ldc, accumulate);
  else if (M > kGemvDotRows)
    gemv_bf16_widened_bcast(M, N, K, A, a_rs, a_cs, B, b_cs, C, ldc, accumulate);
  else
    gemv_run<Bf16Widen>(M, N, K, A, a_rs, B, b_cs, C, ldc, accumulate);
  return true;
}

}  // namespace tpu::kernels

TPU_INTRIN_DIAGNOSTICS_POP
