// Few-row products C = A B where column j of B is contiguous in K (linear's x W^T with W
// [N, K] row-major), read in place without packing (see gemv_avx512.cpp, gemv_avx2.cpp). Return
// false when they do not apply (more than kGemvMaxRows rows, other strides, K < 16, neither
// AVX-512 nor AVX2+FMA): the caller then takes the packed GEMM path. Same contract as gemm_f32 /
// gemm_bf16 otherwise.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/idle_prefetch.h"
#include "tpucore/core/parallel.h"

namespace tpu::kernels {

constexpr int64_t kGemvMaxRows = 16;
// With AVX-512 (f32, or bf16 with avx512_bf16), up to this many rows also take the broadcast
// kernel when its A panel fits in half of the L2 (tpu::cpu_caches()).
constexpr int64_t kGemvMaxRowsWide = 128;
// Up to this many rows the AVX-512 path takes dot products along K; more rows the broadcast
// kernel (a [K][16] panel of A, one FMA per weight element).
constexpr int64_t kGemvDotRows = 4;

inline bool gemv_applies(int64_t M, int64_t N, int64_t K, int64_t a_cs, int64_t b_rs) {
  return M >= 1 && M <= kGemvMaxRows && N >= 1 && K >= 16 && a_cs == 1 && b_rs == 1;
}

bool gemv_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
              int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);
bool gemv_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs, const uint16_t* B,
               int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);

// f16 weight read in place (gemv_f16.cpp): A and B f16 bit patterns, any A strides, b_rs 1,
// 1 <= M <= kGemvMaxRows, K >= 16; AVX-512 (vcvtph2ps on 16 values), else AVX2 with F16C.
// Returns false (nothing done) otherwise. gemv_f16_avx2 takes the AVX2 path whatever the CPU
// has beyond it (tests use it to cover that path).
bool gemv_f16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs, const uint16_t* B,
              int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);
bool gemv_f16_avx2(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                   const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);

// Batch-invariant products (tpucore/core/batch_invariant.h) on AVX-512, B = W^T (b_rs 1, any
// a_rs / a_cs): every output is the chain of multiply-adds along K of the packed GEMM's
// micro-kernel (f32 FMA; bf16 pairs by vdpbf16ps with avx512_bf16, else widened to f32 FMA),
// restarted every kc_words k-steps (the GEMM's K blocking, a multiple of 16; a k-step is one
// value, or a bf16 pair with avx512_bf16) and added block by block to C, so each row's result
// is the GEMM's whatever the row count. The weight is read in place, once per call; the rows sit
// in the lanes of the accumulators. Return false (nothing done) without AVX-512, for another B
// layout, or for more rows than the broadcast kernel takes (gemv_f32's limits).
bool gemv_chain_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                    int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate, int64_t kc_words);
bool gemv_chain_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                     const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate,
                     int64_t kc_words);
// The bf16 product widened to f32 FMA (the path of AVX-512 CPUs without avx512_bf16), whatever the
// CPU has beyond AVX-512 (tests use it to cover that path).
bool gemv_chain_bf16_widened(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                             const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate,
                             int64_t kc_words);

// The same on AVX2+FMA (gemv_avx2.cpp; only call when gemm_avx2_available()): the chains of the
// AVX2 micro-kernel, every k-step one value (bf16 widened to f32), up to kGemvMaxRows rows.
bool gemv_chain_f32_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                         int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate, int64_t kc);
bool gemv_chain_bf16_avx2(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                          const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate,
                          int64_t kc);

// The AVX2+FMA paths whatever the best kernel of the CPU is (tests use them to cover that path
// on AVX-512 machines). Only call them when gemm_avx2_available(); same return contract.
bool gemv_f32_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                   int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);
// bf16 x W^T for kGemvDotRows < M <= kGemvMaxRows on AVX-512 CPUs without avx512_bf16 (gemv_bf16
// takes it): f16's broadcast kernel (gemv_f16.cpp) with the weight widened from bf16, exact.
// Only call it where gemv_bf16's AVX-512 path applies (b_rs 1, AVX-512 F/BW/VL and FMA).
void gemv_bf16_widened_bcast(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                             const uint16_t* B, int64_t b_cs, float* C, int64_t ldc, bool accumulate);
bool gemv_bf16_avx2(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                    const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);

namespace detail {

using tpu::detail::NextWeight;

// Runs fn(b0, b1) over [0, blocks) on the pool threads, in runs of consecutive blocks: the
// calling thread takes its runs from the front, the others from the back, each run 1/nt of what
// is left (guided scheduling, down to single blocks). The first runs are long streams through
// the weight, the last ones short, so the threads finish close together, and on a host shared
// with other work a descheduled thread holds up the others for one shrinking run, not for a
// fixed share of the product. Many equal short runs cost more than they balance: with a fixed
// 1/64 of an int4 2048 x 768 product per run, two threads took 23-25 us where these runs take
// 16-17 us (bench_quantize, BM_gemv_int4_kernel, 2-vCPU Intel Xeon); ending on runs of grain / 4
// blocks instead of one, the caller of an int4 decode step's products waited 2.7-3.6 us for the
// other thread per product on average, against 0.7-1.0 us.
//
// `next`: the weight the caller's next few-row product is expected to read (follow_weight()).
// The first pool worker then prefetches the end of it (the blocks a back-taking thread starts
// from in that product, up to half its L2) while the caller runs the serial work between the two
// products (tpucore/core/idle_prefetch.h). int4 decode of bench_decode_profile's model, 8
// interleaved runs each (2-vCPU Intel Xeon): one shared front 680 tokens/s (median), two ends
// 703, two ends with 512 KiB prefetched 738, with 1 MiB 752.
// Inline when there are at most `grain` blocks.
template <class F>
void gemv_for_blocks(int64_t blocks, int64_t grain, F&& fn, NextWeight next = {}) {
  const int nt = tpu::num_threads();
  if (blocks <= grain || nt <= 1 || blocks > int64_t{0xffffffff}) {
    fn(int64_t{0}, blocks);
    return;
  }
  // The front and back ends of the blocks not yet taken, in one word (front in the low half).
  struct alignas(64) Ends {
    std::atomic<uint64_t> fb{0};
  } c;
  c.fb.store(static_cast<uint64_t>(blocks) << 32, std::memory_order_relaxed);
  tpu::parallel_for(0, nt, 1, [&](int64_t t, int64_t) {
    const bool front = t == 0;  // chunk 0 runs on the calling thread
    uint64_t cur = c.fb.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t f = static_cast<int64_t>(cur & 0xffffffffu), b = static_cast<int64_t>(cur >> 32);
      if (f >= b) break;
      const int64_t r = std::max<int64_t>(1, (b - f) / nt);
      const int64_t s = front ? f : b - r, e = front ? f + r : b;
      const uint64_t want = front ? (static_cast<uint64_t>(b) << 32 | static_cast<uint64_t>(e))
                                  : (static_cast<uint64_t>(s) << 32 | static_cast<uint64_t>(f));
      if (!c.fb.compare_exchange_weak(cur, want, std::memory_order_relaxed)) continue;  // cur reloaded
      fn(s, e);
      cur = c.fb.load(std::memory_order_relaxed);
    }
    if (t == 1 && next.p != nullptr) {
      const size_t l2 = static_cast<size_t>(std::max<long long>(0, tpu::cpu_caches().l2));
      const size_t n = std::min(next.bytes, l2 > 0 ? l2 / 2 : size_t{1} << 20);
      tpu::detail::prefetch_after_chunk(static_cast<const char*>(next.p) + (next.bytes - n), n);
    }
  });
}

// The next-weight guess for a product over weight rows B (row stride b_cs elements, N rows).
template <class T>
NextWeight next_rows(const T* B, int64_t N, int64_t b_cs) {
  return tpu::detail::follow_weight(B, static_cast<size_t>(N) * static_cast<size_t>(b_cs) * sizeof(T));
}

// Many rows of A times a quantized weight W [N, K]: C = A W^T (row stride ldc) through panels of
// 256 weight rows dequantized to f32, dequant_row(j, out) writing row j's K values (the rows of
// a panel over the pool threads), each panel then multiplied by the float GEMM.
template <class F>
void gemm_dequantized_panels(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, float* C, int64_t ldc,
                             F&& dequant_row) {
  constexpr int64_t kPanel = 256;
  std::vector<float> panel(static_cast<size_t>(std::min(N, kPanel) * K));
  for (int64_t j0 = 0; j0 < N; j0 += kPanel) {
    const int64_t n = std::min(kPanel, N - j0);
    gemv_for_blocks(n, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, K)), [&](int64_t a, int64_t e) {
      for (int64_t j = a; j < e; ++j) dequant_row(j0 + j, panel.data() + j * K);
    });
    gemm_f32(M, n, K, A, lda, 1, panel.data(), 1, K, C + j0, ldc, false);
  }
}

}  // namespace detail
}  // namespace tpu::kernels
