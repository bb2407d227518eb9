// The AMX int8 products (ops/cpu/kernels/gemm_amx_int8.cpp: gemm_int8_amx, gemm_int4_amx) against a
// naive loop that quantizes A the documented way (blocks of 32 along K, d = max|a| / 127,
// q = round(a / d) to nearest even), dequantizes A (q d) and the weights (int8: q times the
// channel scale; int4: nibble - 8 times the group scale) and sums their products in double.
// Row counts around the 16-row tiles, column counts that are not multiples of 16, K over several
// blocks and groups of 32 and 128, f32 and f16 group scales, a zero block, 1 and 2 threads. Skipped (with a message) on
// CPUs without amx_int8, where the kernels must decline.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "tpucore/core/half.h"
#include "tpucore/core/batch_invariant.h"
#include "tpucore/core/parallel.h"

namespace {

// q(A) dequantized: the value each a[i, k] stands for in the product.
std::vector<double> dequantized_rows(const std::vector<float>& A, int64_t M, int64_t K) {
  std::vector<double> out(A.size());
  for (int64_t i = 0; i < M; ++i)
    for (int64_t b0 = 0; b0 < K; b0 += 32) {
      float amax = 0.0f;
      for (int64_t k = b0; k < b0 + 32; ++k) amax = std::max(amax, std::fabs(A[i * K + k]));
      const float id = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
      for (int64_t k = b0; k < b0 + 32; ++k)
        out[i * K + k] = std::nearbyint(A[i * K + k] * id) * static_cast<double>(d);
    }
  return out;
}

// Counts the outputs farther from the reference than f32 accumulation over the blocks allows
// (a few units in the last place of the sum of the magnitudes, per block).
int64_t count_bad(const std::vector<float>& C, const std::vector<double>& Aq, const std::vector<double>& Wd, int64_t M,
                  int64_t N, int64_t K) {
  int64_t bad = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        ref += Aq[i * K + k] * Wd[j * K + k];
        mag += std::fabs(Aq[i * K + k] * Wd[j * K + k]);
      }
      bad += !(std::fabs(C[i * N + j] - ref) <= 4e-7 * mag * static_cast<double>(K / 32) + 1e-30);
    }
  return bad;
}

}  // namespace

TEST_CASE("gemm_int8_amx matches a dequantize-then-float loop", "[gemm][amx-int8]") {
  using tpu::kernels::gemm_int8_amx;
  if (!tpu::kernels::gemm_int8_amx_available()) {
    std::vector<float> c(16);
    const std::vector<float> a(16 * 32, 1.0f), s(1, 1.0f);
    const std::vector<int8_t> w(32, 1);
    CHECK_FALSE(gemm_int8_amx(16, 1, 32, a.data(), 32, w.data(), s.data(), c.data(), 1));
    WARN("no AMX int8 (or TPU_CPU_AMX=0): the AMX int8 product is not run");
    return;
  }
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> ua(-3.0f, 3.0f), us(0.001f, 0.02f);
  std::uniform_int_distribution<int> uw(-127, 127);
  const int saved = tpu::num_threads();
  const int64_t N = 37, K = 160;
  std::vector<int8_t> W(N * K);
  std::vector<float> scale(N);
  for (auto& v : W) v = static_cast<int8_t>(uw(rng));
  for (auto& v : scale) v = us(rng);
  std::vector<double> Wd(N * K);
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k) Wd[j * K + k] = W[j * K + k] * static_cast<double>(scale[j]);
  for (const int64_t M : {1, 8, 15, 16, 17, 33, 64, 160}) {
    std::vector<float> A(M * K);
    for (auto& v : A) v = ua(rng);
    for (int64_t k = 32; k < 64; ++k) A[k] = 0.0f;  // row 0's second block all zero
    const std::vector<double> Aq = dequantized_rows(A, M, K);
    for (int threads : {1, 2}) {
      tpu::set_num_threads(threads);
      std::vector<float> C(M * N, -1.0f);
      REQUIRE(gemm_int8_amx(M, N, K, A.data(), K, W.data(), scale.data(), C.data(), N));
      INFO("M " << M << " N " << N << " K " << K << " threads " << threads);
      CHECK(count_bad(C, Aq, Wd, M, N, K) == 0);
    }
  }
  tpu::set_num_threads(saved);
  std::vector<float> C(16 * N);
  const std::vector<float> A(16 * K, 1.0f);
  CHECK_FALSE(gemm_int8_amx(16, N, K - 8, A.data(), K, W.data(), scale.data(), C.data(), N));  // K % 32
  tpu::BatchInvariantScope invariant;
  CHECK_FALSE(gemm_int8_amx(16, N, K, A.data(), K, W.data(), scale.data(), C.data(), N));
}

TEST_CASE("gemm_int4_amx matches a dequantize-then-float loop", "[gemm][amx-int8]") {
  using tpu::kernels::gemm_int4_amx;
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> ua(-2.0f, 2.0f), us(0.001f, 0.03f);
  std::uniform_int_distribution<int> un(0, 15);
  // K 384: 12 blocks, 3 groups of 128; K 416: 13 blocks (one block before the rounds of four, and
  // 208 packed bytes a row: 64 per 128 weights and a remainder). 37 columns: two whole panels of
  // 16 (the first prefetches the second) and a partial one.
  const int64_t N = 37;
  const int saved = tpu::num_threads();
  for (const auto& [G, K] : {std::pair<int64_t, int64_t>{32, 384}, {128, 384}, {32, 416}}) {
    std::vector<uint8_t> W(N * K / 2);
    std::vector<float> scale(N * (K / G));
    for (auto& v : W) v = static_cast<uint8_t>(un(rng) | (un(rng) << 4));
    for (auto& v : scale) v = us(rng);
    // The same scales held as f16 (the f32 ones rounded to f16, which both references use).
    std::vector<tpu::f16> scale16(scale.size());
    for (size_t i = 0; i < scale.size(); ++i) scale16[i] = tpu::f16(scale[i]);
    if (!tpu::kernels::gemm_int8_amx_available()) {
      std::vector<float> A(16 * K, 1.0f), C(16 * N);
      CHECK_FALSE(gemm_int4_amx(16, N, K, G, A.data(), K, W.data(), scale.data(), C.data(), N));
      WARN("no AMX int8 (or TPU_CPU_AMX=0): the AMX int4 product is not run");
      return;
    }
    for (const bool f16_scales : {false, true}) {
      // The weights' layout (gemv_int4.h), decoded independently.
      std::vector<double> Wd(N * K);
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k) {
          const uint8_t b = W[j * (K / 2) + (k / 32) * 16 + (k % 16)];
          const int q = ((k % 32) < 16 ? (b & 0xF) : (b >> 4)) - 8;
          const size_t si = static_cast<size_t>(j * (K / G) + k / G);
          Wd[j * K + k] = q * static_cast<double>(f16_scales ? scale16[si].to_f32() : scale[si]);
        }
      const tpu::kernels::Int4Scales sc = f16_scales ? tpu::kernels::Int4Scales(scale16.data())
                                                     : tpu::kernels::Int4Scales(scale.data());
      // 80 rows: 5 groups of 16, more than one chunk of groups at this K (the panels are then
      // prepared once per batch and kept for the later chunks).
      for (const int64_t M : {1, 8, 15, 16, 17, 33, 64, 80}) {
        std::vector<float> A(M * K);
        for (auto& v : A) v = ua(rng);
        const std::vector<double> Aq = dequantized_rows(A, M, K);
        for (int threads : {1, 2}) {
          tpu::set_num_threads(threads);
          std::vector<float> C(M * N, -1.0f);
          REQUIRE(gemm_int4_amx(M, N, K, G, A.data(), K, W.data(), sc, C.data(), N));
          INFO("M " << M << " N " << N << " K " << K << " group " << G << " f16 scales " << f16_scales << " threads "
                    << threads);
          CHECK(count_bad(C, Aq, Wd, M, N, K) == 0);
        }
      }
    }
    tpu::set_num_threads(saved);
    std::vector<float> A(16 * K, 1.0f), C(16 * N);
    CHECK_FALSE(gemm_int4_amx(16, N, K, 16, A.data(), K, W.data(), scale.data(), C.data(), N));  // group 16
  }
}
