// The many-row int8 and int4 GEMMs on AVX-512 VNNI (ops/cpu/kernels/gemm_vnni.cpp) against naive
// loops that quantize the rows the documented way and sum the integer products exactly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "tpucore/core/parallel.h"

// int8 weights, many rows (gemm_vnni.cpp): a naive loop that quantizes A the documented way (blocks
// of 32 along K, scale max|a| / 127, round(a * (127 / max|a|)) to nearest even in f32), sums the
// integer products exactly and scales them in double. Ragged rows (tiles of 6), columns (panels
// of 32) and K (blocks of 32), a zero block, on 1 and 2 threads; skipped without AVX-512 VNNI
// (and under TPU_CPU_FEATURES=avx2, where gemm_int8_vnni must decline).
TEST_CASE("gemm_int8_vnni matches a naive loop over the quantized rows", "[gemm]") {
  using tpu::kernels::gemm_int8_vnni;
  if (!tpu::kernels::gemm_int8_vnni_available()) {
    std::vector<float> c(32);
    const std::vector<float> a(32 * 32, 1.0f), s(1, 1.0f);
    const std::vector<int8_t> w(32, 1);
    CHECK_FALSE(gemm_int8_vnni(32, 1, 32, a.data(), 32, w.data(), s.data(), c.data(), 1));
    WARN("no AVX-512 VNNI: the int8 GEMM is not run");
    return;
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> ua(-3.0f, 3.0f), us(0.001f, 0.02f);
  std::uniform_int_distribution<int> uw(-127, 127);
  const int saved = tpu::num_threads();
  struct Shape3 { int64_t M, N, K; };
  for (const Shape3 sh : {Shape3{32, 1, 5}, Shape3{37, 33, 77}, Shape3{45, 70, 200}, Shape3{64, 96, 64}}) {
    const int64_t M = sh.M, N = sh.N, K = sh.K;
    std::vector<float> A(M * K), scale(N), C(M * N, -1.0f);
    std::vector<int8_t> W(N * K);
    for (auto& v : A) v = ua(rng);
    for (int64_t k = 0; k < std::min<int64_t>(K, 32); ++k) A[k] = 0.0f;  // row 0's first block all zero
    for (auto& v : W) v = static_cast<int8_t>(uw(rng));
    for (auto& v : scale) v = us(rng);
    // The reference.
    std::vector<double> ref(M * N, 0.0), mag(M * N, 0.0);  // mag: sum of the blocks' |partial sums|
    for (int64_t i = 0; i < M; ++i)
      for (int64_t b0 = 0; b0 < K; b0 += 32) {
        const int64_t b1 = std::min(K, b0 + 32);
        float amax = 0.0f;
        for (int64_t k = b0; k < b1; ++k) amax = std::max(amax, std::fabs(A[i * K + k]));
        const float id = amax > 0 ? 127.0f / amax : 0.0f;
        std::vector<int> q(static_cast<size_t>(b1 - b0));
        for (int64_t k = b0; k < b1; ++k) q[k - b0] = static_cast<int>(std::nearbyint(A[i * K + k] * id));
        for (int64_t j = 0; j < N; ++j) {
          int64_t dot = 0;
          for (int64_t k = b0; k < b1; ++k) dot += int64_t{q[k - b0]} * W[j * K + k];
          ref[i * N + j] += static_cast<double>(dot) * static_cast<double>(amax / 127.0f);
          mag[i * N + j] += std::fabs(static_cast<double>(dot) * static_cast<double>(amax / 127.0f));
        }
      }
    for (int threads : {1, 2}) {
      tpu::set_num_threads(threads);
      REQUIRE(gemm_int8_vnni(M, N, K, A.data(), K, W.data(), scale.data(), C.data(), N));
      int64_t bad = 0;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          const double r = ref[i * N + j] * scale[j];
          // f32 accumulation over the blocks: a few units in the last place of the magnitudes.
          bad += std::fabs(C[i * N + j] - r) > 4e-7 * (mag[i * N + j] * scale[j]) * static_cast<double>((K + 31) / 32) + 1e-30;
        }
      INFO("M " << M << " N " << N << " K " << K << " threads " << threads);
      CHECK(bad == 0);
    }
  }
  tpu::set_num_threads(saved);
  std::vector<float> c(16);
  const std::vector<float> a(16 * 32, 1.0f), s(1, 1.0f);
  const std::vector<int8_t> w(32, 1);
  CHECK_FALSE(gemm_int8_vnni(16, 1, 32, a.data(), 32, w.data(), s.data(), c.data(), 1));  // too few rows
}

// Packed int4 weights (the layout of gemv_int4.h: 16 bytes per 32 weights, low nibbles 0-15,
// high nibbles 16-31, q + 8) with group scales: the same naive loop over the quantized rows,
// each block's integer sum times its group's scale. Groups of 32 and 64; K not a multiple of 32
// or group 16 decline.
TEST_CASE("gemm_int4_vnni matches a naive loop over the quantized rows", "[gemm]") {
  using tpu::kernels::gemm_int4_vnni;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> ua(-2.0f, 2.0f), us(0.001f, 0.03f);
  std::uniform_int_distribution<int> un(0, 15);
  struct Case { int64_t M, N, K, group; };
  for (const Case cs : {Case{32, 5, 32, 32}, Case{41, 67, 128, 32}, Case{38, 40, 192, 64}}) {
    const int64_t M = cs.M, N = cs.N, K = cs.K, G = cs.group;
    std::vector<float> A(M * K), scale(N * (K / G)), C(M * N, -1.0f);
    std::vector<uint8_t> W(N * K / 2);
    for (auto& v : A) v = ua(rng);
    for (auto& v : W) v = static_cast<uint8_t>(un(rng) | (un(rng) << 4));
    for (auto& v : scale) v = us(rng);
    auto wq = [&](int64_t j, int64_t k) {
      const uint8_t b = W[j * (K / 2) + (k / 32) * 16 + (k % 16)];
      return ((k % 32) < 16 ? (b & 0xF) : (b >> 4)) - 8;
    };
    if (!tpu::kernels::gemm_int8_vnni_available()) {
      CHECK_FALSE(gemm_int4_vnni(M, N, K, G, A.data(), K, W.data(), scale.data(), C.data(), N));
      WARN("no AVX-512 VNNI: the int4 GEMM is not run");
      return;
    }
    std::vector<double> ref(M * N, 0.0), mag(M * N, 0.0);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t b0 = 0; b0 < K; b0 += 32) {
        float amax = 0.0f;
        for (int64_t k = b0; k < b0 + 32; ++k) amax = std::max(amax, std::fabs(A[i * K + k]));
        const float id = amax > 0 ? 127.0f / amax : 0.0f;
        for (int64_t j = 0; j < N; ++j) {
          int64_t dot = 0;
          for (int64_t k = b0; k < b0 + 32; ++k) dot += static_cast<int64_t>(std::nearbyint(A[i * K + k] * id)) * wq(j, k);
          const double t = static_cast<double>(dot) * static_cast<double>(amax / 127.0f) * scale[j * (K / G) + b0 / G];
          ref[i * N + j] += t;
          mag[i * N + j] += std::fabs(t);
        }
      }
    REQUIRE(gemm_int4_vnni(M, N, K, G, A.data(), K, W.data(), scale.data(), C.data(), N));
    int64_t bad = 0;
    for (int64_t e = 0; e < M * N; ++e) bad += std::fabs(C[e] - ref[e]) > 4e-7 * mag[e] * static_cast<double>(K / 32) + 1e-30;
    INFO("M " << M << " N " << N << " K " << K << " group " << G);
    CHECK(bad == 0);
    CHECK_FALSE(gemm_int4_vnni(M, N, K, 16, A.data(), K, W.data(), scale.data(), C.data(), N));
    CHECK_FALSE(gemm_int4_vnni(M, N, K - 2, G, A.data(), K, W.data(), scale.data(), C.data(), N));
  }
}
