// The calibrated timing model (config.h, TimingConfig) against its closed form, its config
// validation, and the "<preset>-ideal" variants.
#include <algorithm>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sim/builder.h"
#include "sim/error.h"
#include "sim/programs.h"
#include "sim/timing_model.h"
#include "sim_test_util.h"

using namespace tpu::sim;
using B = ProgramBuilder;

namespace {

ChipConfig calibrated_tiny(double launch, int megacore, double mxu_eff, double hbm_eff, double overlap) {
  ChipConfig c = preset_config("tiny");
  c.cores_per_chip = 2;
  c.timing.model = "calibrated";
  c.timing.launch_cycles = launch;
  c.timing.megacore = megacore;
  c.timing.mxu_efficiency = mxu_eff;
  c.timing.hbm_efficiency = hbm_eff;
  c.timing.memory_overlap = overlap;
  c.validate();
  return c;
}

// Reads `bytes` of HBM at 0 into VMEM `times` times (the same bytes each time).
Program reread(int64_t bytes, int times) {
  B b;
  for (int i = 0; i < times; ++i) b.dma(B::vmem_at(B::at(0)), B::hbm_at(B::at(0)), {.row_bytes = bytes}, 0, 0);
  b.wait(0, times);
  return b.finish();
}

}  // namespace

TEST_CASE("calibrated model: a GEMM costs launch + fill + compute and memory, partly overlapped", "[sim][timing_model]") {
  const int64_t m = 32, n = 32, k = 32;
  for (double overlap : {0.0, 0.5, 1.0}) {
    INFO("overlap " << overlap);
    ChipConfig c = calibrated_tiny(300, 2, 0.5, 0.25, overlap);
    auto g = make_gemm(c, {.m = m, .n = n, .k = k, .block_m = 16});
    Chip chip(c);
    auto r = chip.run(g.program, {.timing_only = true});
    // Closed form: every (K tile, N tile) pair streams m rows through one MXU at one row per
    // cycle; the work is spread over all MXUs of the one core the (unsplit) program runs on, at
    // the sustained fraction; the device's two cores share their HBM bandwidth.
    const double stream = double(m) * (k / c.mxu.rows) * (n / c.mxu.cols) * c.mxu.bf16_cycles_per_row;
    const double compute = stream / (c.mxu.count * 0.5);
    // Compulsory traffic: A and B (bf16) read once, C (f32) written once.
    const double bytes = double(m * k * 2 + k * n * 2 + m * n * 4);
    const double memory = bytes / (c.hbm_bytes_per_cycle() * 2 * 0.25);
    const double priced = c.mxu.fill_cycles + std::max(compute, memory) + (1 - overlap) * std::min(compute, memory);
    const double floor = double(r.stats.hbm_bytes_read + r.stats.hbm_bytes_written) / (c.hbm_bytes_per_cycle() * 2);
    REQUIRE(priced > floor);  // the peak-bandwidth floor does not bind here
    CHECK(r.stats.cycles == Approx(300 + priced));
    CHECK(r.stats.timing_model == "calibrated");
    // The event timeline still runs: its figure equals an ideal-model run of the same program.
    ChipConfig ideal = c;
    ideal.timing.model = "ideal";
    Chip chip2(ideal);
    auto r2 = chip2.run(g.program, {.timing_only = true});
    CHECK(r.stats.ideal_cycles == Approx(r2.stats.cycles));
    CHECK(r2.stats.ideal_cycles == r2.stats.cycles);
    CHECK(r2.stats.timing_model == "ideal");
    // Megacore: the device's peak is both cores'; MFU against it.
    CHECK(r.stats.peak_flops == Approx(2 * c.peak_flops()));
    CHECK(r.stats.mfu == Approx(2.0 * m * n * k / (2 * c.peak_flops() / (c.clock_ghz * 1e9)) / r.stats.cycles));
  }
}

TEST_CASE("calibrated model: compulsory traffic at the sustained rate, re-reads at no more than the peak", "[sim][timing_model]") {
  const int64_t bytes = 4096;
  // Low sustained rate: reading the same bytes three times costs what reading them once does.
  ChipConfig slow = calibrated_tiny(100, 1, 1, 0.25, 0);
  Chip a(slow);
  const double once = bytes / (slow.hbm_bytes_per_cycle() * 0.25);
  CHECK(a.run(reread(bytes, 1), {.timing_only = true}).stats.cycles == Approx(100 + once));
  CHECK(a.run(reread(bytes, 3), {.timing_only = true}).stats.cycles == Approx(100 + once));
  // Full sustained rate: three reads cannot beat three reads at the peak bandwidth.
  ChipConfig fast = calibrated_tiny(100, 1, 1, 1, 0);
  Chip b(fast);
  CHECK(b.run(reread(bytes, 3), {.timing_only = true}).stats.cycles == Approx(100 + 3.0 * bytes / fast.hbm_bytes_per_cycle()));
  // A stream copy: read once and written once (VMEM traffic is not HBM traffic).
  auto cp = make_stream_copy(slow, 64 * 1024, 4096, 3);
  CHECK(a.run(cp.program, {.timing_only = true}).stats.cycles == Approx(100 + 2.0 * 64 * 1024 / (slow.hbm_bytes_per_cycle() * 0.25)));
}

TEST_CASE("calibrated model: vector-unit kernels cost launch + max(vector work, memory)", "[sim][timing_model]") {
  ChipConfig c = calibrated_tiny(50, 2, 1, 1, 1);
  B b;
  b.fill(B::vmem(B::at(0), DType::f32), 1.f, 64, 64);  // ceil(64/2) * ceil(64/8) = 256 vregs, no HBM
  Chip chip(c);
  auto r = chip.run(b.finish());
  CHECK(r.stats.cycles == Approx(50 + 256 * c.vpu.cycles_per_vreg));  // one core of two: not split
}

TEST_CASE("timing config: bad values are errors naming the field", "[sim][timing_model]") {
  auto j = config_to_json(preset_config("v4"));
  auto expect_err = [](nlohmann::json bad, const std::string& needle) {
    try {
      config_from_json(bad);
      FAIL("no error for " << needle);
    } catch (const SimError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  auto with = [&](const char* k, nlohmann::json v) {
    auto b = j;
    b["timing"][k] = v;
    return b;
  };
  expect_err(with("model", "fast"), "timing.model");
  expect_err(with("megacore", 3), "timing.megacore");  // v4 has 2 cores per chip
  expect_err(with("megacore", 0), "timing.megacore");
  expect_err(with("mxu_efficiency", 0), "timing.mxu_efficiency");
  expect_err(with("mxu_efficiency", 1.5), "timing.mxu_efficiency");
  expect_err(with("hbm_efficiency", -1), "timing.hbm_efficiency");
  expect_err(with("memory_overlap", 2), "timing.memory_overlap");
  expect_err(with("launch_cycles", -5), "timing.launch_cycles");
  expect_err(with("wide_hbm_efficiency", 1.5), "timing.wide_hbm_efficiency");
  expect_err(with("reduce_cycles", -1), "timing.reduce_cycles");
  expect_err(with("dma_cycles", -1), "timing.dma_cycles");
  expect_err(with("weight_load_exposed", 2), "timing.weight_load_exposed");
  expect_err(with("convert_elems_per_cycle", -1), "timing.convert_elems_per_cycle");
  expect_err(with("restream_elems_per_cycle", -2), "timing.restream_elems_per_cycle");
  auto fp8 = j;
  fp8["mxu"]["fp8_cycles_per_row"] = 0.25;  // faster than two rows per cycle
  expect_err(fp8, "mxu.fp8_cycles_per_row");
  expect_err(with("warp", 1), "timing.warp");
}

TEST_CASE("presets: calibrated by default, '<name>-ideal' selects the ideal model", "[sim][timing_model]") {
  CHECK(preset_config("v4").timing.model == "calibrated");
  CHECK(preset_config("v4").timing.megacore == 2);
  CHECK(preset_config("tiny").timing.model == "ideal");
  for (const auto& n : preset_names()) {
    INFO(n);
    ChipConfig ideal = load_config(n + "-ideal");
    CHECK(ideal.name == n + "-ideal");
    CHECK(ideal.timing.model == "ideal");
    ChipConfig base = preset_config(n);
    base.name = ideal.name;
    base.timing.model = "ideal";
    CHECK(config_to_json(base) == config_to_json(ideal));
    CHECK(config_from_json_text(preset_json(n + "-ideal")).name == n + "-ideal");
  }
  CHECK_THROWS_AS(preset_config("nope-ideal"), SimError);
  CHECK_THROWS_AS(load_config("-ideal"), SimError);
}

TEST_CASE("calibrated model: the touched-bytes union against a byte map", "[sim][timing_model]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint64_t> pos(0, 1999), len(0, 64);
  for (int trial = 0; trial < 20; ++trial) {
    detail::IntervalUnion u;
    std::vector<bool> touched(2100, false);
    for (int i = 0; i < 200; ++i) {
      const uint64_t lo = pos(rng), n = len(rng);
      u.add(lo, n);
      for (uint64_t b = lo; b < lo + n; ++b) touched[b] = true;
      REQUIRE(u.bytes() == uint64_t(std::count(touched.begin(), touched.end(), true)));
    }
  }
}

namespace {

// Loads a rows x cols f32 tile from HBM, writes op(tile) to VMEM as `out` (bf16: a 16-bit packed
// store; f32: a wide one) and stores it to HBM; optionally reduces its rows on the XLU as well.
Program load_op_store(int64_t rows, int64_t cols, DType out, bool reduce) {
  B b;
  const int64_t in_bytes = rows * cols * 4, out_bytes = rows * cols * dtype_size(out);
  b.dma(B::vmem_at(B::at(0)), B::hbm_at(B::at(0)), {.rows = rows, .row_bytes = cols * 4}, 0, 0);
  b.wait(0);
  b.unary(Op::vneg, B::vmem(B::at(in_bytes), out), B::vmem(B::at(0), DType::f32), rows, cols);
  if (reduce) b.reduce(Op::xsum, B::vmem(B::at(in_bytes + out_bytes), DType::f32), B::vmem(B::at(0), DType::f32), rows, cols);
  b.dma(B::hbm_at(B::at(1 << 20)), B::vmem_at(B::at(in_bytes)), {.rows = rows, .row_bytes = cols * dtype_size(out)}, 1, 1);
  b.wait(1);
  return b.finish();
}

}  // namespace

TEST_CASE("calibrated model: 16-bit stores at hbm_efficiency, wide kernels at wide_hbm_efficiency, reduce and DMA costs",
          "[sim][timing_model]") {
  const int64_t rows = 64, cols = 64;
  ChipConfig c = calibrated_tiny(100, 1, 1, 0.25, 0);
  c.timing.wide_hbm_efficiency = 0.5;
  const double bw = c.hbm_bytes_per_cycle();
  Chip chip(c);
  // bf16 result: every written byte is a 16-bit vector store, so the whole kernel runs at 0.25.
  const double narrow_bytes = rows * cols * (4 + 2);
  const double vec = std::ceil(rows / double(c.vpu.sublanes)) * std::ceil(cols / double(c.vpu.lanes)) * c.vpu.cycles_per_vreg;
  auto r16 = chip.run(load_op_store(rows, cols, DType::bf16, false), {.timing_only = true});
  CHECK(r16.stats.cycles == Approx(100 + narrow_bytes / (bw * 0.25) + vec));
  CHECK(r16.stats.work.cores.at(0).narrow_store_bytes == rows * cols * 2);
  CHECK(r16.stats.work.cores.at(0).dmas == 2);
  // f32 result: no 16-bit store, the whole kernel at the wide fraction.
  const double wide_bytes = rows * cols * (4 + 4);
  auto r32 = chip.run(load_op_store(rows, cols, DType::f32, false), {.timing_only = true});
  CHECK(r32.stats.cycles == Approx(100 + wide_bytes / (bw * 0.5) + vec));
  // wide_hbm_efficiency 0 falls back to hbm_efficiency.
  ChipConfig same = c;
  same.timing.wide_hbm_efficiency = 0;
  Chip chip_same(same);
  CHECK(chip_same.run(load_op_store(rows, cols, DType::f32, false), {.timing_only = true}).stats.cycles ==
        Approx(100 + wide_bytes / (bw * 0.25) + vec));
  // A row reduction adds reduce_cycles once; every DMA adds dma_cycles.
  ChipConfig rc = c;
  rc.timing.reduce_cycles = 70;
  rc.timing.dma_cycles = 3;
  Chip chip_rc(rc);
  auto rr = chip_rc.run(load_op_store(rows, cols, DType::f32, true), {.timing_only = true});
  const double xlu = std::ceil(rows / double(c.vpu.sublanes)) * std::ceil(cols / double(c.vpu.lanes)) * c.xlu.reduce_cycles_per_vreg;
  CHECK(rr.stats.work.cores.at(0).xlu_cycles == Approx(xlu));
  CHECK(rr.stats.cycles == Approx(100 + 70 + 2 * 3 + wide_bytes / (bw * 0.5) + std::max(vec, xlu)));
  // The re-priced work equals the run's own figure (what tpu-calib's cross-validation relies on).
  CHECK(calibrated_cycles(rc, rr.stats.work) == Approx(rr.stats.cycles));
}

TEST_CASE("XLA matmul feed: one-time conversion of the prefetched operand, per-pass conversion of a streamed A, per-panel re-feed",
          "[sim][timing_model]") {
  ChipConfig c = calibrated_tiny(100, 1, 1, 1, 0);
  c.mxu.cols = 128;
  c.timing.convert_elems_per_cycle = 200;
  c.timing.restream_elems_per_cycle = 50;
  const double kernel = 1e6;
  XlaMatmulFeed f{.m = 300, .n = 1000, .k = 400, .a_transposed = true, .b_transposed = false, .out_transposed = true,
                  .prefetched = 'A'};
  // A prefetched: its 300 x 400 elements converted once; B streamed in its own layout: no re-feed.
  // C stored {0,1} against the MXU's row order: its 300 x 1000 elements transposed and converted
  // at the same rate.
  CHECK(xla_matmul_transposes_out(f));
  CHECK(xla_matmul_cycles(c, f, kernel) == Approx(kernel + 300.0 * 400 / 200 + 300.0 * 1000 / 200));
  f.out_transposed = false;  // C {1,0}: written as the MXUs produce it
  CHECK_FALSE(xla_matmul_transposes_out(f));
  CHECK(xla_matmul_cycles(c, f, kernel) == Approx(kernel + 300.0 * 400 / 200));
  f.out_transposed = true;
  // B prefetched: 400 x 1000 converted once; A ({0,1}) re-fed once per 128-column panel of N
  // (ceil(1000 / 128) = 8 panels): the kernel takes at least that long.
  f.prefetched = 'B';
  CHECK(xla_matmul_cycles(c, f, 1000.0) == Approx(300.0 * 400 * 8 / 50));
  CHECK(xla_matmul_cycles(c, f, kernel) == Approx(kernel + 400.0 * 1000 / 200));  // a slower kernel still rules
  // B prefetched: C {0,1} adds no transpose of C (the per-pass conversion of A sets the pace).
  CHECK_FALSE(xla_matmul_transposes_out(f));
  // A, B and C all {0,1} with B prefetched: A still streams against the MXU's orientation.
  f.b_transposed = true;
  CHECK(xla_matmul_cycles(c, f, 1000.0) == Approx(300.0 * 400 * 8 / 50));
  // The same with A prefetched is C^T = B^T A^T in the canonical layouts: no re-feed, and C^T is
  // written in the MXU's row order.
  f.prefetched = 'A';
  CHECK_FALSE(xla_matmul_transposes_out(f));
  CHECK(xla_matmul_cycles(c, f, kernel) == Approx(kernel + 300.0 * 400 / 200));
  // A wide streamed operand (M >= 2048) whose second-minor dimension K spans an even number of
  // 8-row tiles (400: 50) is not re-fed; it is still converted on each of its ceil(3000 / 128) = 24
  // passes at the conversion rate. An odd number of tiles (401: 51) is re-fed.
  f = {.m = 2100, .n = 3000, .k = 400, .a_transposed = true, .b_transposed = false, .out_transposed = true,
       .prefetched = 'B'};
  CHECK(xla_matmul_cycles(c, f, 1000.0) == Approx(2100.0 * 400 * 24 / 200));
  CHECK(xla_matmul_cycles(c, f, kernel) == Approx(kernel + 400.0 * 3000 / 200));
  f.k = 401;
  CHECK(xla_matmul_cycles(c, f, 1000.0) == Approx(2100.0 * 401 * 24 / 50));
  // A prefetched: converted once, B streamed in its own layout is not converted per pass.
  f = {.m = 3000, .n = 2100, .k = 400, .a_transposed = false, .b_transposed = false, .out_transposed = false,
       .prefetched = 'A'};
  CHECK(xla_matmul_cycles(c, f, 1000.0) == Approx(1000.0 + 3000.0 * 400 / 200));
  // A prefetched, B {0,1} streamed: B re-fed once per panel of M (ceil(300 / 128) = 3).
  f = {.m = 300, .n = 1000, .k = 400, .a_transposed = false, .b_transposed = true, .out_transposed = true, .prefetched = 'A'};
  CHECK(xla_matmul_cycles(c, f, 10.0) == Approx(400.0 * 1000 * 3 / 50));
  // Off on the ideal model and with the constants at 0.
  ChipConfig ideal = c;
  ideal.timing.model = "ideal";
  CHECK(xla_matmul_cycles(ideal, f, kernel) == kernel);
  c.timing.convert_elems_per_cycle = c.timing.restream_elems_per_cycle = 0;
  CHECK(xla_matmul_cycles(c, f, kernel) == kernel);
  f.prefetched = 'C';
  CHECK_THROWS_AS(xla_matmul_cycles(c, f, kernel), SimError);
  f.prefetched = 'A', f.k = 0;
  CHECK_THROWS_AS(xla_matmul_cycles(c, f, kernel), SimError);
}

TEST_CASE("XLA matmul feed: the re-feed rule against the mode of measured TPU v4 kernels", "[sim][timing_model]") {
  // Reference: rows of sim/calibration/tpu_v4/matmul_large.csv, slow = under 60 TFLOP/s measured
  // (2 M N K / fusion_avg). The rule sees only the shapes (through xla_matmul_feed). Rows 1 and 31
  // are slow without a transposed streamed operand and stay outside the rule (sim/README.md).
  struct Measured {
    int64_t m, n, k;
    double us;
  };
  const Measured rows[] = {
      {1024, 2001, 1675, 141.79},  // _7: narrow streamed A (M < 2048)
      {1024, 2978, 1024, 76.67},   // _11: A {1,0}, not transposed
      {1024, 2978, 3628, 407.25},  // _15: A, B, C {0,1} with B prefetched, narrow A
      {1789, 2978, 3628, 710.80},  // _35: the same
      {2554, 2978, 2326, 709.08},  // _53: K spans 291 8-row tiles (odd)
      {2554, 2978, 3628, 580.62},  // _55: K 454 tiles (even), M >= 2048
      {2554, 3955, 1675, 420.46},  // _57: K 210 tiles (even), M >= 2048
      {3319, 3955, 1675, 593.00},  // _77: the same
      {3319, 3955, 2977, 1415.12}, // _79: K 373 tiles (odd)
      {3319, 2978, 1024, 394.27},  // _71: A prefetched, B {0,1}: N spans 373 tiles (odd)
      {4084, 2978, 3628, 695.64},  // _95: A prefetched, A, B, C {0,1}: canonical C^T = B^T A^T
  };
  for (const Measured& r : rows) {
    INFO(r.m << " x " << r.n << " x " << r.k);
    const bool slow = 2.0 * double(r.m) * double(r.n) * double(r.k) / r.us / 1e6 < 60;
    CHECK(xla_matmul_refeeds(xla_matmul_feed(r.m, r.n, r.k)) == slow);
  }
  XlaMatmulFeed bad{.m = 8, .n = 8, .k = 8, .prefetched = 'C'};
  CHECK_THROWS_AS(xla_matmul_refeeds(bad), SimError);
  bad.prefetched = 'A', bad.n = 0;
  CHECK_THROWS_AS(xla_matmul_refeeds(bad), SimError);
}

TEST_CASE("XLA matmul feed from the shapes: the layouts and prefetched operand of measured TPU v4 kernels",
          "[sim][timing_model]") {
  // Reference: rows of sim/calibration/tpu_v4/matmul_large.csv (layouts and the prefetched operand
  // read from XLA's HLO on a TPU v4), including the case where only the 8-row rounding of the
  // second-minor dimension separates the layouts (C of 3319 x 3955 x 1675 stays {1,0} where C of
  // 4084 x 3955 x 1675 is {0,1}) and the ties (multiples of 128: {1,0}; M == N: A prefetched).
  struct Measured {
    int64_t m, n, k;
    bool a, b, c;
    char p;
  };
  const Measured rows[] = {
      {1024, 1024, 1024, false, false, false, 'A'},  // matmul_linear_1
      {1024, 2001, 1675, true, false, true, 'B'},    // _7
      {1024, 2978, 1024, false, true, true, 'B'},    // _11
      {1024, 2978, 3628, true, true, true, 'B'},     // _15
      {1789, 1024, 2326, true, false, false, 'A'},   // _23
      {2554, 2978, 2326, true, false, true, 'B'},    // _53
      {3319, 3955, 1675, true, false, false, 'B'},   // _77
      {4084, 2978, 1024, false, true, true, 'A'},    // _91
      {4084, 3955, 1675, true, false, true, 'A'},    // _97
  };
  for (const Measured& r : rows) {
    INFO(r.m << " x " << r.n << " x " << r.k);
    const XlaMatmulFeed f = xla_matmul_feed(r.m, r.n, r.k);
    CHECK(f.m == r.m);
    CHECK(f.n == r.n);
    CHECK(f.k == r.k);
    CHECK(f.a_transposed == r.a);
    CHECK(f.b_transposed == r.b);
    CHECK(f.out_transposed == r.c);
    CHECK(f.prefetched == r.p);
  }
  CHECK_THROWS_AS(xla_matmul_feed(0, 8, 8), SimError);
}

TEST_CASE("XLA matmul feed: which measured TPU v4 kernels write C transposed", "[sim][timing_model]") {
  // Reference: rows of sim/calibration/tpu_v4/matmul_large.csv, whose HLO layouts and prefetched
  // operand say it directly: A prefetched, C {0,1}, and not A and B both {0,1}. The rule sees only
  // the shapes (through xla_matmul_feed).
  struct Measured {
    int64_t m, n, k;
    bool pays;
  };
  const Measured rows[] = {
      {4084, 3955, 1675, true},   // _97: A {0,1}, B {1,0}, C {0,1}, A prefetched
      {2554, 2001, 1675, true},   // _47: the same layouts
      {3319, 2978, 1024, true},   // _71: A {1,0}, B {0,1}, C {0,1}, A prefetched
      {4084, 2978, 3628, false},  // _95: A, B, C all {0,1}: C^T = B^T A^T
      {4084, 1024, 3628, false},  // _85: C {1,0}
      {3319, 3955, 1675, false},  // _77: B prefetched, C {1,0}
      {2554, 3955, 1675, false},  // _57: B prefetched, C {0,1}
      {1024, 1024, 1024, false},  // _1: all {1,0}
  };
  for (const Measured& r : rows) {
    INFO(r.m << " x " << r.n << " x " << r.k);
    CHECK(xla_matmul_transposes_out(xla_matmul_feed(r.m, r.n, r.k)) == r.pays);
  }
}
