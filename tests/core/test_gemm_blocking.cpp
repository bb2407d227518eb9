// Cache blocking of the host GEMM derived from the detected caches (ops/cpu/kernels/gemm.h,
// tpucore/core/cpu_features.h): the derivation for several cache configurations against the
// rules it states (values worked out by hand for one of them), the parsing of the kernel's
// cache descriptions, and GEMM results against a naive double loop for shapes that straddle
// the blocks this CPU derives (one past mc, kc and nc, and ragged register tiles).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "tpucore/core/cpu_features.h"

using tpu::kernels::detail::derive_blocking;
using tpu::kernels::detail::GemmBlocking;

TEST_CASE("gemm blocking: Zen 4 caches give the hand-computed blocks", "[gemm][blocking]") {
  // 32 KiB L1d, 1 MiB L2, 16 MiB L3 share; 14 x 32 tile of f32, B micro-panel in one L1d:
  // kc: 32768 / (32 * 4) = 256; mc: 524288 / (256 * 4) = 512 -> 504 (36 x 14);
  // nc: 8 MiB / 1024 = 8192 -> capped at 4096.
  const GemmBlocking b = derive_blocking(14, 32, 4, 32 << 10, 1 << 20, 16 << 20);
  CHECK(b.mr == 14);
  CHECK(b.nr == 32);
  CHECK(b.kc == 256);
  CHECK(b.mc == 504);
  CHECK(b.nc == 4096);
  // The same with the B micro-panel over two L1d sizes (what the AVX-512 tiles use):
  // kc: 65536 / 128 = 512; mc: 524288 / 2048 = 256 -> 252 (18 x 14); nc: 8 MiB / 2048 = 4096.
  const GemmBlocking b2 = derive_blocking(14, 32, 4, 32 << 10, 1 << 20, 16 << 20, 2);
  CHECK(b2.kc == 512);
  CHECK(b2.mc == 252);
  CHECK(b2.nc == 4096);
  CHECK(tpu::kernels::detail::kAvx512L1dPanel == 2);
  // A 6 x 16 AVX2 tile on a Zen 2 core (32 KiB, 512 KiB, 4 MiB share): kc = 32768 / 64 = 512;
  // mc = 262144 / 2048 = 128 -> 126; nc = 2 MiB / 2048 = 1024.
  const GemmBlocking z2 = derive_blocking(6, 16, 4, 32 << 10, 512 << 10, 4 << 20);
  CHECK(z2.kc == 512);
  CHECK(z2.mc == 126);
  CHECK(z2.nc == 1024);
  // Sapphire Rapids (48 KiB L1d, 2 MiB L2): kc = 49152 / 128 = 384; mc = 1 MiB / 1536 = 682.7 -> 672.
  const GemmBlocking spr = derive_blocking(14, 32, 4, 48 << 10, 2 << 20, 1920 << 10);
  CHECK(spr.kc == 384);
  CHECK(spr.mc == 672);
  CHECK(spr.nc == 640);  // 983040 / 1536 = 640
  // With two L1d sizes: kc = 98304 / 128 = 768; mc = 1 MiB / 3072 = 341.3 -> 336;
  // nc = 983040 / 3072 = 320.
  const GemmBlocking spr2 = derive_blocking(14, 32, 4, 48 << 10, 2 << 20, 1920 << 10, 2);
  CHECK(spr2.kc == 768);
  CHECK(spr2.mc == 336);
  CHECK(spr2.nc == 320);
  // The AVX2 6 x 16 tile with its B micro-panel in half the L1d and its A block in a quarter
  // of the L2 (kAvx2L1dPanel): on Zen 2 kc = 16384 / 64 = 256, mc = 131072 / 1024 = 128 -> 126,
  // nc = 2 MiB / 1024 = 2048; on Sapphire Rapids kc = 24576 / 64 = 384,
  // mc = 512 KiB / 1536 = 341.3 -> 336, nc = 983040 / 1536 = 640.
  CHECK(tpu::kernels::detail::kAvx2L1dPanel == 0.5);
  const GemmBlocking z2h = derive_blocking(6, 16, 4, 32 << 10, 512 << 10, 4 << 20, 0.5);
  CHECK(z2h.kc == 256);
  CHECK(z2h.mc == 126);
  CHECK(z2h.nc == 2048);
  const GemmBlocking sprh = derive_blocking(6, 16, 4, 48 << 10, 2 << 20, 1920 << 10, 0.5);
  CHECK(sprh.kc == 384);
  CHECK(sprh.mc == 336);
  CHECK(sprh.nc == 640);
  // A share of 0 or less counts as 1.
  CHECK(derive_blocking(14, 32, 4, 32 << 10, 1 << 20, 16 << 20, 0).kc == 256);
  CHECK(derive_blocking(14, 32, 4, 32 << 10, 1 << 20, 16 << 20, -2).kc == 256);
}

TEST_CASE("gemm blocking: sane for many cache configurations", "[gemm][blocking]") {
  struct Caches {
    int64_t l1, l2, l3;
  };
  const std::vector<Caches> configs = {
      {32 << 10, 1 << 20, 16 << 20},           // Zen 4
      {48 << 10, 2 << 20, 1920 << 10},         // Sapphire Rapids (L3 share 1.875 MiB)
      {32 << 10, 256 << 10, 2 << 20},          // Haswell client
      {32 << 10, 1 << 20, 1408 << 10},         // Skylake-SP
      {0, 0, 0},                               // nothing detected
      {4 << 10, 64 << 10, 0},                  // tiny, no L3
      {int64_t{1} << 20, 64 << 20, int64_t{1} << 30},  // huge
  };
  for (const Caches& c : configs)
    for (const auto& [mr, nr] : {std::pair{14, 32}, std::pair{6, 16}, std::pair{6, 8}})
      for (const double panels : {0.5, 1.0, 2.0}) {
        const GemmBlocking b = derive_blocking(mr, nr, 4, c.l1, c.l2, c.l3, panels);
        INFO("l1 " << c.l1 << " l2 " << c.l2 << " l3 " << c.l3 << " tile " << mr << "x" << nr
                   << " L1d sizes per B micro-panel " << panels);
        const int64_t l1 = static_cast<int64_t>(static_cast<double>(c.l1 > 0 ? c.l1 : 32 << 10) * panels),
                      l2 = c.l2 > 0 ? c.l2 : 512 << 10;
        const int64_t outer = c.l3 > 0 ? c.l3 : l2;
        CHECK(b.kc % 16 == 0);
        CHECK(b.kc >= 64);
        CHECK(b.kc <= 1024);
        CHECK(b.mc % mr == 0);
        CHECK(b.mc >= mr);
        CHECK(b.mc <= 128 * mr);
        CHECK(b.nc % nr == 0);
        CHECK(b.nc >= 4 * nr);
        CHECK(b.nc <= 4096);
        // Each level's working set fits where the rule puts it, unless clamped at the minimum.
        if (b.kc > 64) CHECK(b.kc * nr * 4 <= l1);
        if (b.kc < 1024) CHECK((b.kc + 16) * nr * 4 > l1);  // and is the largest that does
        if (b.mc > mr) CHECK(b.mc * b.kc * 4 <= static_cast<int64_t>(static_cast<double>(l2 / 2) * std::min(1.0, panels)));
        if (b.nc > 4 * nr) CHECK(b.nc * b.kc * 4 <= outer / 2);
        // A larger L2 never gives a smaller A block.
        const GemmBlocking big = derive_blocking(mr, nr, 4, c.l1, 2 * l2, c.l3, panels);
        CHECK(big.mc >= b.mc);
        // More L1d per B micro-panel never gives a shorter one.
        if (panels > 0.5) CHECK(b.kc >= derive_blocking(mr, nr, 4, c.l1, c.l2, c.l3, panels / 2).kc);
      }
}

TEST_CASE("cpu caches: parsing the kernel's cache descriptions", "[gemm][blocking]") {
  tpu::CpuCaches c;
  CHECK(tpu::add_cache_level(c, 1, "Data", "32K", 2));
  CHECK(c.l1d == 32 * 1024);  // the L1d is per core, whatever shares it
  CHECK_FALSE(tpu::add_cache_level(c, 1, "Instruction", "64K", 1));
  CHECK(c.l1d == 32 * 1024);
  CHECK(tpu::add_cache_level(c, 2, "Unified", "2048K", 2));
  CHECK(c.l2 == 1024 * 1024);
  CHECK(tpu::add_cache_level(c, 3, "Unified", "32M", 8));
  CHECK(c.l3 == 4 * 1024 * 1024);
  CHECK(tpu::add_cache_level(c, 3, "Unified", "1048576", 1));  // plain bytes (from cpuid)
  CHECK(c.l3 == 1024 * 1024);
  CHECK_FALSE(tpu::add_cache_level(c, 2, "Unified", "big", 1));
  CHECK_FALSE(tpu::add_cache_level(c, 2, "Unified", "12Q", 1));
  CHECK_FALSE(tpu::add_cache_level(c, 4, "Unified", "64M", 1));
  CHECK(c.l2 == 1024 * 1024);
  // This machine: whatever was found is in a plausible range.
  const tpu::CpuCaches& here = tpu::cpu_caches();
  if (here.l1d) CHECK((here.l1d >= 4096 && here.l1d <= (4 << 20)));
  if (here.l2) CHECK((here.l2 >= 32768 && here.l2 <= (int64_t{1} << 30)));
  if (here.l1d == 0) WARN("no L1d size found on this machine (defaults used)");
}

namespace {

// C = A B (+ C) with A [M, K] row-major, B [K, N] row-major (so the few-row gemv path declines
// and the packed path runs), against a double loop.
void check_f32(int64_t M, int64_t N, int64_t K, bool accumulate, int64_t ldc = 0) {
  std::mt19937 rng(static_cast<uint32_t>(M * 7919 + N * 31 + K));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N));
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  if (ldc < N) ldc = N + 3;
  std::vector<float> c(static_cast<size_t>(M * ldc));
  for (auto& x : c) x = u(rng);
  const std::vector<float> c0 = c;
  tpu::kernels::gemm_f32(M, N, K, a.data(), K, 1, b.data(), N, 1, c.data(), ldc, accumulate);
  int64_t bad = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double ref = accumulate ? c0[static_cast<size_t>(i * ldc + j)] : 0.0, mag = std::fabs(ref);
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(a[static_cast<size_t>(i * K + k)]) * b[static_cast<size_t>(k * N + j)];
        ref += p;
        mag += std::fabs(p);
      }
      if (std::fabs(c[static_cast<size_t>(i * ldc + j)] - ref) > 1e-5 * mag + 1e-6) ++bad;
    }
  INFO("M " << M << " N " << N << " K " << K << " accumulate " << accumulate);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("gemm_f32 across the derived cache blocks matches a naive loop", "[gemm][blocking]") {
  const GemmBlocking& b = tpu::kernels::detail::gemm_blocking_f32();
  INFO("blocking mr " << b.mr << " nr " << b.nr << " mc " << b.mc << " kc " << b.kc << " nc " << b.nc);
  REQUIRE(b.kc >= 64);
  check_f32(b.mc + 3, b.nr + 5, b.kc + 1, false);       // one past an A block and a K block
  check_f32(2 * b.mr + 1, b.nr * 2 - 1, 2 * b.kc + 7, true);
  check_f32(5, b.nc + 7, 19, false);                    // one past a B block (wide, short)
  check_f32(b.mr - 1, b.nc + b.nr + 1, b.kc - 3, true);
  // C rows 4 KiB apart (every row of a tile in one L1d set; the kernel prefetches them into
  // the L2 first, the L1d in its last k-steps), over two K blocks; and K shorter than that
  // lead, where the L1d prefetch comes at the start.
  check_f32(2 * b.mr + 3, b.nr + 5, b.kc + 30, true, 1024);
  check_f32(b.mr, 2 * b.nr, 23, false, 1024);
  const GemmBlocking& h = tpu::kernels::detail::gemm_blocking_bf16();
  CHECK(h.kc >= 64);
  CHECK(h.mc % h.mr == 0);
}
