// Regression tests for bugs in the cycle model: a bandwidth profile that ran past its end with
// a very high HBM rate, MFU and peak that ignored the MXU mode, and configs claiming more than
// an array can do. Expectations are closed forms from the config, not earlier outputs.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sim/builder.h"
#include "sim/dma.h"
#include "sim/error.h"
#include "sim/programs.h"
#include "sim_test_util.h"

using namespace tpu::sim;
using B = ProgramBuilder;

TEST_CASE("bandwidth profile: transfers too small to take time leave the bandwidth free", "[sim][dma]") {
  const double cap = 1e15;
  detail::BandwidthProfile p(cap);
  // 64 bytes at 1e15 B/cycle take 6.4e-14 cycles: below the resolution of t = 1e6 (an ulp
  // there is 1.2e-10), so the end time equals the start time.
  const double t0 = 1e6;
  for (int i = 0; i < 50; ++i) {
    double end = p.allocate(t0, 64, cap);
    REQUIRE(std::isfinite(end));
    CHECK(end >= t0);
    CHECK(end <= t0 + 1e-6);
  }
  // The full bandwidth must still be there: 1e16 bytes take 10 cycles.
  CHECK(p.allocate(t0, 1e16, cap) == Approx(t0 + 10.0));
  CHECK(p.segments() < 8);
}

TEST_CASE("a chip with 1e15 bytes/cycle of HBM and DMA runs small DMAs", "[sim][dma]") {
  ChipConfig c = preset_config("tiny");
  c.memory.hbm_bandwidth_gbps = 1e15 * c.clock_ghz;
  c.dma.engine_bytes_per_cycle = 1e15;
  c.dma.latency_cycles = 1e6;  // transfers start at t ~ 1e6, where 64 B take less than an ulp
  c.validate();
  B b;
  const int n = 40;
  for (int i = 0; i < n; ++i)
    b.dma(B::vmem_at(B::at(int64_t(i) * 64)), B::hbm_at(B::at(int64_t(i) * 64)), {.row_bytes = 64}, i % 2, 0);
  b.wait(0, n);
  Chip chip(c);
  auto r = chip.run(b.finish());
  // The bytes take ~0 cycles: the run is the last DMA's issue (one per cycle) plus latency.
  CHECK(r.stats.cycles >= c.dma.latency_cycles);
  CHECK(r.stats.cycles <= c.dma.latency_cycles + double(n + 2) * c.scalar.issue_cycles);
  CHECK(r.stats.hbm_bytes_read == uint64_t(n) * 64);
}

namespace {

Stats run_gemm(const ChipConfig& c, int64_t m, int64_t n, int64_t k, MxuMode mode) {
  GemmSpec s;
  s.m = m, s.n = n, s.k = k, s.mode = mode;
  Chip chip(c);
  return chip.run(make_gemm(c, s).program, {.timing_only = true}).stats;
}

}  // namespace

TEST_CASE("peak FLOP/s and MFU follow the MXU mode", "[sim][stats]") {
  // v5e: int8 streams two rows per cycle, so its peak is twice bf16 (394 vs 197 TOP/s).
  const ChipConfig c = preset_config("v5e");
  const double bf16_peak = 4.0 * 128 * 128 * 2 * 1.5e9;
  const int64_t m = 1024, n = 1024, k = 2048;
  const Stats i8 = run_gemm(c, m, n, k, MxuMode::i8);
  CHECK(i8.mxu_modes == "i8");
  CHECK(i8.peak_flops == Approx(2 * bf16_peak));
  CHECK(i8.mfu <= 1.0);
  CHECK(i8.mfu == Approx(i8.flops_per_second / (2 * bf16_peak)));
  const Stats bf = run_gemm(c, m, n, k, MxuMode::bf16);
  CHECK(bf.mxu_modes == "bf16");
  CHECK(bf.peak_flops == Approx(bf16_peak));
  CHECK(bf.mfu == Approx(bf.flops_per_second / bf16_peak));
  const Stats f = run_gemm(c, m, n, k, MxuMode::f32);
  CHECK(f.peak_flops == Approx(bf16_peak / c.mxu.f32_cycles_per_row));
  CHECK(f.mfu <= 1.0);
  CHECK(f.mfu == Approx(f.flops_per_second / f.peak_flops));
}

TEST_CASE("MFU of a run mixing MXU modes weighs each mode by its own peak", "[sim][stats]") {
  ChipConfig c = preset_config("tiny");  // 2 MXUs 8x8; int8 0.5 cycles/row, bf16 1
  B b;
  b.mxu_load_weights(0, B::vmem(B::at(0), DType::bf16), 8, 8);
  b.mxu_matmul(0, B::vmem(B::at(8192), DType::f32), B::vmem(B::at(1024), DType::bf16), 64, 8, 8, false);
  b.mxu_load_weights(1, B::vmem(B::at(0), DType::i8), 8, 8, MxuMode::i8);
  b.mxu_matmul(1, B::vmem(B::at(16384), DType::i32), B::vmem(B::at(4096), DType::i8), 64, 8, 8, false, MxuMode::i8);
  Chip chip(c);
  auto s = chip.run(b.finish(), {.timing_only = true}).stats;
  const double per_cycle = 2.0 * 8 * 8 * 2;  // both MXUs, bf16
  const double flops = 2.0 * 64 * 8 * 8;      // per matmul
  CHECK(s.mxu_modes == "bf16+i8");
  CHECK(s.mxu_peak_cycles == Approx(flops / per_cycle + flops / (2 * per_cycle)));
  CHECK(s.mfu == Approx(s.mxu_peak_cycles / s.cycles));
  CHECK(s.peak_flops == Approx(2 * flops / s.mxu_peak_cycles * 1e9));
}

TEST_CASE("configs faster than an array physically allows are rejected", "[sim][config]") {
  auto expect_err = [](auto edit, const std::string& needle) {
    ChipConfig c = preset_config("v5e");
    edit(c);
    try {
      c.validate();
      FAIL("no error for " << needle);
    } catch (const SimError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  expect_err([](ChipConfig& c) { c.mxu.bf16_cycles_per_row = 0.65; }, "mxu.bf16_cycles_per_row");
  expect_err([](ChipConfig& c) { c.mxu.f32_cycles_per_row = 0.9; }, "mxu.f32_cycles_per_row");
  expect_err([](ChipConfig& c) { c.mxu.int8_cycles_per_row = 0.25; }, "mxu.int8_cycles_per_row");
  // The same through JSON, as a user's config file would give it.
  auto j = config_to_json(preset_config("tiny"));
  j["mxu"]["bf16_cycles_per_row"] = 0.5;
  CHECK_THROWS_AS(config_from_json(j), SimError);
  // The limits themselves are valid.
  ChipConfig ok = preset_config("v5e");
  ok.mxu.bf16_cycles_per_row = 1;
  ok.mxu.int8_cycles_per_row = 0.5;
  ok.mxu.f32_cycles_per_row = 1;
  CHECK_NOTHROW(ok.validate());
}
