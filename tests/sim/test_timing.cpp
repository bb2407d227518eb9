// Closed-form expectations that pin the timing model (sim/README.md, "Timing model").
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sim/builder.h"
#include "sim/error.h"
#include "sim/programs.h"
#include "sim_test_util.h"

using namespace tpu::sim;
using namespace simtest;
using B = ProgramBuilder;

namespace {

// tiny: 1 GHz, HBM 16 B/cycle, DMA latency 20, engines 16 B/cycle, MXU 8x8, fill 8, drain 8.
const ChipConfig& tiny_cfg() {
  static ChipConfig c = preset_config("tiny");
  return c;
}

}  // namespace

TEST_CASE("one DMA costs latency + bytes / bandwidth", "[sim][timing]") {
  const auto& c = tiny_cfg();
  for (int64_t bytes : {16, 1024, 4096}) {
    B b;
    b.dma(B::vmem_at(B::at(0)), B::hbm_at(B::at(0)), {.row_bytes = bytes}, 0, 0);
    Chip chip(c);
    auto r = chip.run(b.finish());
    CHECK(r.stats.cycles == Approx(c.dma.latency_cycles + double(bytes) / c.hbm_bytes_per_cycle()));
    CHECK(r.stats.hbm_bytes_read == uint64_t(bytes));
  }
}

TEST_CASE("one matmul costs weight load + fill + rows + drain", "[sim][timing]") {
  const auto& c = tiny_cfg();
  for (int64_t m : {1, 32, 100}) {
    B b;
    b.mxu_load_weights(0, B::vmem(B::at(0), DType::bf16), 8, 8);
    b.mxu_matmul(0, B::vmem(B::at(4096), DType::f32), B::vmem(B::at(1024), DType::bf16), m, 8, 8, false);
    Chip chip(c);
    auto r = chip.run(b.finish(), {.timing_only = true});
    double expect = 8 * c.mxu.weight_load_cycles_per_row + c.mxu.fill_cycles + double(m) + c.mxu.drain_cycles;
    CHECK(r.stats.cycles == Approx(expect));
    CHECK(r.stats.mxu_flops == 2.0 * m * 64);
  }
}

TEST_CASE("two independent DMAs share the HBM bandwidth", "[sim][timing]") {
  const auto& c = tiny_cfg();
  const int64_t bytes = 2048;
  for (int q2 : {0, 1}) {  // same queue or separate queues: HBM is the bottleneck either way
    B b;
    b.dma(B::vmem_at(B::at(0)), B::hbm_at(B::at(0)), {.row_bytes = bytes}, 0, 0);
    b.dma(B::vmem_at(B::at(8192)), B::hbm_at(B::at(8192)), {.row_bytes = bytes}, q2, 1);
    Chip chip(c);
    auto r = chip.run(b.finish());
    CHECK(r.stats.cycles == Approx(c.dma.latency_cycles + 2.0 * bytes / c.hbm_bytes_per_cycle()));
  }
  // When one engine is slower than HBM, two engines run side by side at their own rate.
  ChipConfig half = c;
  half.dma.engine_bytes_per_cycle = c.hbm_bytes_per_cycle() / 2;
  B b;
  b.dma(B::vmem_at(B::at(0)), B::hbm_at(B::at(0)), {.row_bytes = bytes}, 0, 0);
  b.dma(B::vmem_at(B::at(8192)), B::hbm_at(B::at(8192)), {.row_bytes = bytes}, 1, 1);
  Chip chip(half);
  auto r = chip.run(b.finish());
  // The second DMA issues one cycle later.
  CHECK(r.stats.cycles == Approx(1 + half.dma.latency_cycles + double(bytes) / half.dma.engine_bytes_per_cycle));
  // An HBM->HBM copy moves every byte twice through HBM.
  B h;
  h.dma(B::hbm_at(B::at(65536)), B::hbm_at(B::at(0)), {.row_bytes = bytes}, 0, 0);
  Chip chip2(c);
  CHECK(chip2.run(h.finish()).stats.cycles == Approx(c.dma.latency_cycles + 2.0 * bytes / c.hbm_bytes_per_cycle()));
}

namespace {

// N tiles of m x 8 bf16 LHS streamed from HBM through one MXU. Double-buffered: the DMA of
// tile i+1 is issued before the matmul of tile i. Sequential: load, wait, compute.
Program tile_pipeline(int64_t n_tiles, int64_t m, bool double_buffer) {
  const int64_t tile = m * 8 * 2;
  B b;
  b.mxu_load_weights(0, B::vmem(B::at(0), DType::bf16), 8, 8);
  auto buf = [&](int reg) { return B::at(1024, {{int16_t(reg), tile}}); };
  if (double_buffer) {
    b.dma(B::vmem_at(buf(1)), B::hbm_at(B::at(0)), {.row_bytes = tile}, 0, 0);  // r1 = 0 initially
    b.loop(0, n_tiles);
    b.smod(1, 0, 2);
    b.sadd(2, 0, 1);
    b.smod(3, 2, 2);
    b.wait(0);
    b.dma(B::vmem_at(buf(3)), B::hbm_at(B::at(0, {{2, tile}})), {.row_bytes = tile}, 0, 0);
    b.mxu_matmul(0, B::vmem(B::at(65536), DType::f32), B::vmem(buf(1), DType::bf16), m, 8, 8, true);
    b.end_loop();
  } else {
    b.loop(0, n_tiles);
    b.dma(B::vmem_at(B::at(1024)), B::hbm_at(B::at(0, {{0, tile}})), {.row_bytes = tile}, 0, 0);
    b.wait(0);
    b.mxu_matmul(0, B::vmem(B::at(65536), DType::f32), B::vmem(B::at(1024), DType::bf16), m, 8, 8, true);
    b.end_loop();
  }
  return b.finish();
}

}  // namespace

TEST_CASE("a double-buffered DMA + matmul pipeline approaches max(DMA, compute)", "[sim][timing]") {
  const auto& c = tiny_cfg();
  const int64_t n = 32;
  for (int64_t m : {16, 64, 128}) {
    INFO("m " << m);
    const double dma = c.dma.latency_cycles + double(m * 16) / c.hbm_bytes_per_cycle();  // per tile
    const double mm = double(m);                                                        // per tile
    Chip chip(c);
    auto seq = chip.run(tile_pipeline(n, m, false), {.timing_only = true});
    auto dbl = chip.run(tile_pipeline(n, m, true), {.timing_only = true});
    const double bound = n * std::max(dma, mm);
    CHECK(seq.stats.cycles >= n * (dma + mm));
    CHECK(dbl.stats.cycles >= bound);
    CHECK(dbl.stats.cycles <= bound * 1.05 + dma + mm + 100);
    CHECK(dbl.stats.cycles < 0.8 * seq.stats.cycles);
  }
}

TEST_CASE("the race checker catches a forgotten semaphore wait", "[sim][race]") {
  B b;
  b.dma(B::vmem_at(B::at(1024)), B::hbm_at(B::at(0)), {.row_bytes = 256}, 0, 0);  // #0
  b.mxu_load_weights(0, B::vmem(B::at(0), DType::bf16), 8, 8);                    // #1
  b.mxu_matmul(0, B::vmem(B::at(8192), DType::f32), B::vmem(B::at(1024), DType::bf16), 16, 8, 8, false);  // #2: reads 1024..1280 too early
  b.wait(0);
  b.dma(B::hbm_at(B::at(4096)), B::vmem_at(B::at(8192)), {.row_bytes = 512}, 1, 1);  // #4
  b.fill(B::vmem(B::at(8192), DType::f32), 0.f, 2, 8);                             // #5: overwrites what #4 reads
  b.wait(1);
  Program p = b.finish();
  Chip chip = tiny();
  auto r = chip.run(p, {.race_check = true});
  REQUIRE(r.races.size() == 2);
  CHECK(r.races[0].first == 0);
  CHECK(r.races[0].second == 2);
  CHECK(r.races[0].kind == "read-after-write");
  CHECK_THAT(r.races[0].message, Catch::Contains("instruction #0 (dma") && Catch::Contains("instruction #2 (mxu.mm"));
  CHECK(r.races[1].first == 4);
  CHECK(r.races[1].second == 5);
  CHECK(r.races[1].kind == "write-after-read");
  CHECK(r.stats.races == 2);
  CHECK_THROWS_WITH(chip.run(p, {.race_check = true, .fail_on_race = true}), Catch::Contains("race"));
  // Off: no reports.
  CHECK(chip.run(p, {.race_check = false}).races.empty());
  // With the waits in place there is no race (and strided, interleaved regions do not alias).
  B ok;
  ok.dma(B::vmem_at(B::at(1024)), B::hbm_at(B::at(0)), {.row_bytes = 256}, 0, 0);
  ok.dma(B::vmem_at(B::at(2048)), B::hbm_at(B::at(0)), {.rows = 4, .row_bytes = 16, .dst_row_stride = 32}, 1, 1);
  ok.fill(B::vmem(B::at(2064), DType::f32, 8, 1), 1.f, 4, 4);  // the gaps between the rows of DMA #1
  ok.wait(0);
  ok.mxu_load_weights(0, B::vmem(B::at(0), DType::bf16), 8, 8);
  ok.mxu_matmul(0, B::vmem(B::at(8192), DType::f32), B::vmem(B::at(1024), DType::bf16), 16, 8, 8, false);
  ok.wait(1);
  CHECK(chip.run(ok.finish(), {.race_check = true}).races.empty());
}

TEST_CASE("timing-only mode gives the same cycles as functional mode", "[sim][timing]") {
  ChipConfig c = tiny_cfg();
  auto g = make_gemm(c, {.m = 32, .n = 32, .k = 32, .block_m = 16});
  auto cp = make_stream_copy(c, 64 * 1024, 4096, 3);
  for (const Program* p : {&g.program, &cp.program}) {
    Chip a(c), b(c);
    auto f = a.run(*p);
    auto t = b.run(*p, {.timing_only = true});
    CHECK(f.stats.cycles == t.stats.cycles);
    CHECK(f.stats.instructions == t.stats.instructions);
    CHECK(f.stats.hbm_bytes_read == t.stats.hbm_bytes_read);
  }
}

TEST_CASE("vector op cost: vregs x cycles per vreg, with latency", "[sim][timing]") {
  const auto& c = tiny_cfg();  // 2 x 8 vregs
  B b;
  b.fill(B::vmem(B::at(0), DType::f32), 1.f, 5, 20);  // ceil(5/2) * ceil(20/8) = 9 vregs
  Chip chip(c);
  auto r = chip.run(b.finish());
  CHECK(r.stats.cycles == Approx(9 * c.vpu.cycles_per_vreg + c.vpu.latency));
  B e;
  e.unary(Op::vexp, B::vmem(B::at(0), DType::f32), B::vmem(B::at(1024), DType::f32), 2, 8);
  CHECK(chip.run(e.finish()).stats.cycles == Approx(c.eup.cycles_per_vreg + c.eup.latency));
  // A consumer on another unit waits for the producer's result (VMEM dependency).
  B d;
  d.fill(B::vmem(B::at(0), DType::f32), 1.f, 2, 8);
  d.unary(Op::vexp, B::vmem(B::at(1024), DType::f32), B::vmem(B::at(0), DType::f32), 2, 8);
  CHECK(chip.run(d.finish()).stats.cycles ==
        Approx(c.vpu.cycles_per_vreg + c.vpu.latency + c.eup.cycles_per_vreg + c.eup.latency));
}

TEST_CASE("stats and Chrome trace", "[sim][stats][trace]") {
  ChipConfig c = tiny_cfg();
  auto g = make_gemm(c, {.m = 16, .n = 16, .k = 16});
  Chip chip(c);
  auto r = chip.run(g.program, {.trace = true});
  const Stats& s = r.stats;
  CHECK(s.cycles > 0);
  CHECK(s.seconds == Approx(s.cycles / 1e9));
  CHECK(s.mfu > 0);
  CHECK(s.mfu <= 1.0);
  CHECK(s.mxu_busy_fraction <= 1.0);
  CHECK(s.arithmetic_intensity == Approx(s.mxu_flops / double(s.hbm_bytes_read + s.hbm_bytes_written)));
  CHECK(s.flops_per_second == Approx(s.mxu_flops / s.seconds));
  CHECK(!format_report(s).empty());
  auto j = stats_to_json(s);
  CHECK(j["cycles"].get<double>() == s.cycles);
  REQUIRE(!r.trace.events.empty());
  auto tj = nlohmann::json::parse(trace_to_chrome_json(r.trace, &g.program));
  REQUIRE(tj["traceEvents"].is_array());
  size_t complete = 0;
  for (const auto& e : tj["traceEvents"])
    if (e["ph"] == "X") {
      ++complete;
      CHECK(e["dur"].get<double>() >= 0);
    }
  CHECK(complete == r.trace.events.size());
}
