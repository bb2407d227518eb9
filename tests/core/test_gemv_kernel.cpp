// The few-row product kernels (ops/cpu/kernels/gemv.h) against a naive loop accumulated in
// double: ragged M, N, K (tails of the 16- and 32-wide steps, of the 4-column blocks), padded
// row strides, accumulate on and off, and the cases they must decline (the packed GEMM path
// then takes them). M covers both AVX-512 kernels (dot products up to kGemvDotRows rows, the
// broadcast panel above) and the AVX2 paths (dot products for 1-2 rows, one or two 8-row
// registers above), each forced through its entry point. Skipped with a warning on CPUs
// without the ISA.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/gemv.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/half.h"

namespace {

float bf16_value(uint16_t v) {
  const uint32_t b = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

bool have_avx512() {
  const auto& f = tpu::cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.fma;
}

// A [M, K] with row stride K + 3, W [N, K] with row stride K + 5 (B = W^T: b_rs 1, b_cs K + 5),
// C [M, N] with ldc N + 2 (the padding of C must stay untouched).
template <class T, class ToFloat, class Make>
void check(int64_t M, int64_t N, int64_t K, bool accumulate, ToFloat value, Make make, bool avx2 = false) {
  std::mt19937 rng(static_cast<uint32_t>(M * 1000003 + N * 1009 + K));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t a_rs = K + 3, w_rs = K + 5, ldc = N + 2;
  std::vector<T> a(static_cast<size_t>(M * a_rs)), w(static_cast<size_t>(N * w_rs));
  for (auto& x : a) x = make(u(rng));
  for (auto& x : w) x = make(u(rng));
  std::vector<float> c(static_cast<size_t>(M * ldc));
  for (auto& x : c) x = u(rng);
  const std::vector<float> c0 = c;
  bool took;
  if constexpr (std::is_same_v<T, float>)
    took = avx2 ? tpu::kernels::gemv_f32_avx2(M, N, K, a.data(), a_rs, 1, w.data(), 1, w_rs, c.data(), ldc, accumulate)
                : tpu::kernels::gemv_f32(M, N, K, a.data(), a_rs, 1, w.data(), 1, w_rs, c.data(), ldc, accumulate);
  else
    took = avx2 ? tpu::kernels::gemv_bf16_avx2(M, N, K, a.data(), a_rs, 1, w.data(), 1, w_rs, c.data(), ldc, accumulate)
                : tpu::kernels::gemv_bf16(M, N, K, a.data(), a_rs, 1, w.data(), 1, w_rs, c.data(), ldc, accumulate);
  REQUIRE(took);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double ref = accumulate ? c0[static_cast<size_t>(i * ldc + j)] : 0.0, mag = std::fabs(ref);
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(value(a[static_cast<size_t>(i * a_rs + k)])) * value(w[static_cast<size_t>(j * w_rs + k)]);
        ref += p;
        mag += std::fabs(p);
      }
      INFO((avx2 ? "avx2 " : "") << "M " << M << " N " << N << " K " << K << " acc " << accumulate << " at " << i << "," << j);
      REQUIRE(std::fabs(c[static_cast<size_t>(i * ldc + j)] - ref) <= 1e-5 * mag + 1e-6);
    }
    for (int64_t j = N; j < ldc; ++j) REQUIRE(c[static_cast<size_t>(i * ldc + j)] == c0[static_cast<size_t>(i * ldc + j)]);
  }
}

}  // namespace

TEST_CASE("gemv kernels: f32 and bf16 against a naive double loop", "[gemm][gemv]") {
  if (!have_avx512()) {
    WARN("no AVX-512 on this CPU: the gemv kernels decline and are not tested here");
    return;
  }
  auto f32 = [](float x) { return x; };
  auto to_bf16 = [](float x) {  // truncation: any bf16 values will do
    uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    return static_cast<uint16_t>(b >> 16);
  };
  for (int64_t M : {1, 2, 4, 5, 9, 16})
    for (int64_t N : {1, 3, 4, 9, 17, 130})
      for (int64_t K : {16, 17, 31, 32, 33, 100, 515})
        for (bool acc : {false, true}) {
          check<float>(M, N, K, acc, f32, f32);
          check<uint16_t>(M, N, K, acc, bf16_value, to_bf16);
        }
}

TEST_CASE("gemv kernels: more than 16 rows in 16-row groups (AVX-512)", "[gemm][gemv]") {
  if (!have_avx512()) {
    WARN("no AVX-512 on this CPU: the wide gemv path is not tested here");
    return;
  }
  auto f32 = [](float x) { return x; };
  auto to_bf16 = [](float x) {
    uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    return static_cast<uint16_t>(b >> 16);
  };
  for (int64_t M : {17, 40, 128})
    for (int64_t N : {3, 9, 130})
      for (int64_t K : {16, 33, 100})
        for (bool acc : {false, true}) {
          check<float>(M, N, K, acc, f32, f32);
          if (tpu::cpu_features().avx512_bf16) check<uint16_t>(M, N, K, acc, bf16_value, to_bf16);
        }
}

TEST_CASE("gemv kernels, AVX2 paths: f32 and bf16 against a naive double loop", "[gemm][gemv]") {
  if (!tpu::kernels::gemm_avx2_available()) {
    WARN("no AVX2+FMA on this CPU: the AVX2 gemv paths are not tested here");
    return;
  }
  auto f32 = [](float x) { return x; };
  auto to_bf16 = [](float x) {
    uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    return static_cast<uint16_t>(b >> 16);
  };
  for (int64_t M : {1, 2, 3, 8, 9, 16})
    for (int64_t N : {1, 5, 6, 7, 130})
      for (int64_t K : {16, 17, 23, 100})
        for (bool acc : {false, true}) {
          check<float>(M, N, K, acc, f32, f32, true);
          check<uint16_t>(M, N, K, acc, bf16_value, to_bf16, true);
        }
}

// f16: path 0 gemv_f16 (the best kernel of the CPU), 1 gemv_f16_avx2, 2 gemm_f16 (its fallback
// when A's columns are strided or M is beyond the few-row kernel). A few subnormal and
// large-exponent weights check the conversion.
static void check_f16(int64_t M, int64_t N, int64_t K, bool accumulate, int path) {
  std::mt19937 rng(static_cast<uint32_t>(M * 7919 + N * 101 + K + path));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t a_cs = path == 2 ? 2 : 1, a_rs = K * a_cs + 3, w_rs = K + 5, ldc = N + 2;
  std::vector<uint16_t> a(static_cast<size_t>(M * a_rs)), w(static_cast<size_t>(N * w_rs));
  for (auto& x : a) x = tpu::f16(u(rng)).bits;
  for (auto& x : w) x = tpu::f16(u(rng)).bits;
  w[0] = 0x0001;                           // smallest subnormal
  w[static_cast<size_t>(K - 1)] = 0x83ff;  // largest negative subnormal
  w[w.size() - 6] = 0x5bd0;                // 250
  std::vector<float> c(static_cast<size_t>(M * ldc));
  for (auto& x : c) x = u(rng);
  const std::vector<float> c0 = c;
  using namespace tpu::kernels;
  if (path == 2) {
    gemm_f16(M, N, K, a.data(), a_rs, a_cs, w.data(), 1, w_rs, c.data(), ldc, accumulate);
  } else {
    const bool took = path == 0 ? gemv_f16(M, N, K, a.data(), a_rs, 1, w.data(), 1, w_rs, c.data(), ldc, accumulate)
                                : gemv_f16_avx2(M, N, K, a.data(), a_rs, 1, w.data(), 1, w_rs, c.data(), ldc, accumulate);
    REQUIRE(took);
  }
  auto val = [](uint16_t b) { return double(tpu::f16::from_bits(b).to_f32()); };
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double ref = accumulate ? c0[static_cast<size_t>(i * ldc + j)] : 0.0, mag = std::fabs(ref);
      for (int64_t k = 0; k < K; ++k) {
        const double p = val(a[static_cast<size_t>(i * a_rs + k * a_cs)]) * val(w[static_cast<size_t>(j * w_rs + k)]);
        ref += p;
        mag += std::fabs(p);
      }
      INFO("f16 path " << path << " M " << M << " N " << N << " K " << K << " acc " << accumulate << " at " << i
                       << "," << j);
      REQUIRE(std::fabs(c[static_cast<size_t>(i * ldc + j)] - ref) <= 1e-5 * mag + 1e-6);
    }
    for (int64_t j = N; j < ldc; ++j) REQUIRE(c[static_cast<size_t>(i * ldc + j)] == c0[static_cast<size_t>(i * ldc + j)]);
  }
}

TEST_CASE("gemv kernels: f16 weights converted in registers, against a naive double loop", "[gemm][gemv]") {
  const bool native = have_avx512() || tpu::kernels::gemm_avx2_available();
  for (int64_t M : {1, 2, 3, 4, 5, 7, 16})
    for (int64_t N : {1, 3, 4, 9, 130})
      for (int64_t K : {16, 17, 23, 33, 100})
        for (bool acc : {false, true}) {
          if (native) check_f16(M, N, K, acc, 0);
          if (tpu::kernels::gemm_avx2_available()) check_f16(M, N, K, acc, 1);
          if (M <= 5) check_f16(M, N, K, acc, 2);
        }
  for (int64_t M : {17, 40}) check_f16(M, 9, 33, true, 2);  // beyond the few-row kernel
  // One row: each weight row streamed alone, steps of 64 and their tails; N past the inline
  // grain, so that the blocks split over the pool threads.
  for (int64_t K : {64, 129, 200})
    for (bool acc : {false, true})
      if (native) check_f16(1, 9, K, acc, 0);
  if (native) check_f16(1, 4099, 64, true, 0);
  std::vector<uint16_t> h(64 * 64, 0x3c00);
  std::vector<float> c(64, 7.f);
  CHECK_FALSE(tpu::kernels::gemv_f16(tpu::kernels::kGemvMaxRows + 1, 4, 32, h.data(), 32, 1, h.data(), 1, 32, c.data(),
                                     4, false));
  CHECK_FALSE(tpu::kernels::gemv_f16(2, 4, 32, h.data(), 32, 1, h.data(), 4, 1, c.data(), 4, false));  // B rows
  CHECK_FALSE(tpu::kernels::gemv_f16(2, 4, 15, h.data(), 15, 1, h.data(), 1, 15, c.data(), 4, false));  // K < 16
  CHECK(c[0] == 7.f);
}

// The packed path of gemm_f16 (more rows than the few-row kernel): f32 A by an f16 B widened
// while it is packed. layout 0: B = W^T (b_rs 1, the vectorized packers), 1: B row-major [K, N]
// (b_cs 1, the portable packer). Row counts across the 14- and 6-row register tiles, N across
// the 32- and 16-wide panels, K across several K blocks.
static void check_f32a_f16b(int64_t M, int64_t N, int64_t K, bool accumulate, int layout, bool avx2_only) {
  std::mt19937 rng(static_cast<uint32_t>(M * 31 + N * 7 + K + layout * 3 + avx2_only));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t a_rs = K + 3, ldc = N + 1;
  const int64_t b_rs = layout == 0 ? 1 : N + 2, b_cs = layout == 0 ? K + 5 : 1;
  std::vector<float> a(static_cast<size_t>(M * a_rs));
  std::vector<uint16_t> w(static_cast<size_t>(layout == 0 ? N * b_cs : K * b_rs));
  for (auto& x : a) x = u(rng);
  for (auto& x : w) x = tpu::f16(u(rng)).bits;
  w[1] = 0x0001;   // smallest subnormal
  w[2] = 0xfbff;   // -65504, the largest f16
  std::vector<float> c(static_cast<size_t>(M * ldc));
  for (auto& x : c) x = u(rng);
  const std::vector<float> c0 = c;
  REQUIRE(tpu::kernels::gemm_f32a_f16b(M, N, K, a.data(), a_rs, 1, w.data(), b_rs, b_cs, c.data(), ldc, accumulate,
                                       avx2_only));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t o = static_cast<size_t>(i * ldc + j);
      if (j == N) {
        REQUIRE(c[o] == c0[o]);
        continue;
      }
      double ref = accumulate ? c0[o] : 0.0, mag = std::fabs(ref);
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(a[static_cast<size_t>(i * a_rs + k)]) *
                         double(tpu::f16::from_bits(w[static_cast<size_t>(k * b_rs + j * b_cs)]).to_f32());
        ref += p;
        mag += std::fabs(p);
      }
      INFO("f32a_f16b layout " << layout << " avx2 " << avx2_only << " M " << M << " N " << N << " K " << K << " acc "
                               << accumulate << " at " << i << "," << j);
      REQUIRE(std::fabs(c[o] - ref) <= 1e-5 * mag + 1e-6);
    }
}

TEST_CASE("gemm_f16 packed path: the weight widened while packed, against a naive double loop", "[gemm][gemv]") {
  if (!tpu::kernels::gemm_avx2_available()) return;  // the packers need AVX2 (gemm_f16 then widens whole panels)
  for (bool avx2_only : {false, true})
    for (int layout : {0, 1}) {
      for (int64_t M : {17, 40})
        for (int64_t N : {1, 45})
          check_f32a_f16b(M, N, 37, true, layout, avx2_only);
      check_f32a_f16b(3, 70, 9, false, layout, avx2_only);
      check_f32a_f16b(29, 33, 1100, false, layout, avx2_only);  // K past one K block
    }
  // Through gemm_f16 (A f16, strided columns): rows beyond the few-row kernel.
  for (int64_t M : {17, 40}) check_f16(M, 45, 300, false, 2);
  // The few-row kernels on a longer K (the broadcast kernel from kGemvDotRows + 1 rows).
  for (int64_t M : {1, 3, 6, 16}) check_f16(M, 45, 300, M % 2 == 0, 0);
}

TEST_CASE("gemv kernels decline what they do not handle", "[gemm][gemv]") {
  std::vector<float> a(64 * 64, 1.f), b(64 * 64, 1.f), c(64 * 64, 7.f);
  using tpu::kernels::gemv_f32;
  CHECK_FALSE(gemv_f32(tpu::kernels::kGemvMaxRowsWide + 1, 4, 32, a.data(), 32, 1, b.data(), 1, 32, c.data(), 4, false));
  CHECK_FALSE(tpu::kernels::gemv_f32_avx2(tpu::kernels::kGemvMaxRows + 1, 4, 32, a.data(), 32, 1, b.data(), 1, 32,
                                          c.data(), 4, false));
  CHECK_FALSE(gemv_f32(2, 4, 32, a.data(), 1, 2, b.data(), 1, 32, c.data(), 4, false));   // A columns strided
  CHECK_FALSE(gemv_f32(2, 4, 32, a.data(), 32, 1, b.data(), 4, 1, c.data(), 4, false));   // B rows contiguous
  CHECK_FALSE(gemv_f32(2, 4, 15, a.data(), 15, 1, b.data(), 1, 15, c.data(), 4, false));  // K below one step
  CHECK(c[0] == 7.f);  // nothing written when declined
}
