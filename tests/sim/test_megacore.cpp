// Megacore programs (Program::cores): one part per TensorCore, each with its own units and
// VMEM, HBM and its bandwidth shared. Values against a naive loop, cycles against closed forms.
#include <algorithm>
#include <cmath>

#include <catch2/catch.hpp>

#include "sim/assembly.h"
#include "sim/builder.h"
#include "sim/error.h"
#include "sim/serialize.h"
#include "sim_test_util.h"

using namespace tpu::sim;
using B = ProgramBuilder;

namespace {

ChipConfig two_core_tiny(const std::string& model = "ideal") {
  ChipConfig c = preset_config("tiny");
  c.cores_per_chip = 2;
  c.timing.megacore = 2;
  c.timing.model = model;
  c.validate();
  return c;
}

// C[rows x 8] = A[rows x 8] W[8 x 8] (f32 mode) for A at HBM a, W at HBM w, C at HBM out; every
// core uses the same VMEM addresses (its own VMEM).
Program mm_part(int64_t rows, uint64_t a, uint64_t w, uint64_t out) {
  B b("mm_part");
  b.dma(B::vmem_at(B::at(0)), B::hbm_at(B::at(int64_t(a))), {.rows = rows, .row_bytes = 32}, 0, 0);
  b.dma(B::vmem_at(B::at(8192)), B::hbm_at(B::at(int64_t(w))), {.rows = 8, .row_bytes = 32}, 1, 0);
  b.wait(0, 2);
  b.mxu_load_weights(0, B::vmem(B::at(8192), DType::f32, 8), 8, 8, MxuMode::f32);
  b.mxu_matmul(0, B::vmem(B::at(16384), DType::f32, 8), B::vmem(B::at(0), DType::f32, 8), rows, 8, 8, false,
               MxuMode::f32);
  b.dma(B::hbm_at(B::at(int64_t(out))), B::vmem_at(B::at(16384)), {.rows = rows, .row_bytes = 32}, 0, 1);
  b.wait(1);
  return b.finish();
}

// VMEM only: `rows` rows through MXU 0 (no HBM traffic).
Program compute_part(int64_t rows) {
  B b("compute");
  b.fill(B::vmem(B::at(0), DType::f32), 1.f, rows, 8);
  b.fill(B::vmem(B::at(32768), DType::f32), 1.f, 8, 8);
  b.mxu_load_weights(0, B::vmem(B::at(32768), DType::f32, 8), 8, 8, MxuMode::bf16);
  b.mxu_matmul(0, B::vmem(B::at(65536), DType::f32, 8), B::vmem(B::at(0), DType::f32, 8), rows, 8, 8, false);
  return b.finish();
}

// Reads `bytes` of HBM at `src` into VMEM 0.
Program load_part(int64_t bytes, uint64_t src) {
  B b("load");
  b.dma(B::vmem_at(B::at(0)), B::hbm_at(B::at(int64_t(src))), {.row_bytes = bytes}, 0, 0);
  b.wait(0);
  return b.finish();
}

Program megacore(std::vector<Program> parts) {
  Program p;
  p.name = "split";
  p.cores = std::move(parts);
  return p;
}

}  // namespace

TEST_CASE("megacore: each core computes its rows in its own VMEM, values match a naive loop", "[sim][megacore]") {
  const int64_t m = 48, half = 24;
  Chip chip(two_core_tiny());
  auto a = simtest::random_floats(size_t(m * 8), 1), w = simtest::random_floats(64, 2);
  const uint64_t A = 0, W = 4096, C = 8192;
  simtest::put(chip, Space::hbm, A, a);
  simtest::put(chip, Space::hbm, W, w);
  auto prog = megacore({mm_part(half, A, W, C), mm_part(m - half, A + half * 32, W, C + half * 32)});
  auto r = chip.run(prog, {.race_check = true});
  auto c = simtest::get<float>(chip, Space::hbm, C, size_t(m * 8));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < 8; ++j) {
      double ref = 0;
      for (int64_t k = 0; k < 8; ++k) ref += double(a[size_t(i * 8 + k)]) * w[size_t(k * 8 + j)];
      CHECK(c[size_t(i * 8 + j)] == Approx(ref).margin(1e-5));
    }
  CHECK(r.stats.races == 0);
  CHECK(r.stats.mxu_flops == Approx(2.0 * m * 8 * 8));
  // Both cores' units are reported (core 1's prefixed) and both traced.
  CHECK(std::any_of(r.stats.units.begin(), r.stats.units.end(), [](const UnitStats& u) { return u.name == "c1.mxu0" && u.instructions == 1; }));
  CHECK(r.stats.static_instructions == prog.cores[0].code.size() + prog.cores[1].code.size());
}

TEST_CASE("megacore: cores compute in parallel and share the HBM bandwidth", "[sim][megacore]") {
  const ChipConfig cfg = two_core_tiny();
  Chip chip(cfg);
  // Compute only: two cores of m rows each finish when one core of m rows does; one core of
  // 2m rows takes m more rows of streaming and m more rows of vector fill (m / sublanes vregs).
  const int64_t m = 512;
  const double one = chip.run(compute_part(m), {.timing_only = true}).stats.cycles;
  const double both = chip.run(megacore({compute_part(m), compute_part(m)}), {.timing_only = true}).stats.cycles;
  const double serial = chip.run(compute_part(2 * m), {.timing_only = true}).stats.cycles;
  CHECK(both == Approx(one));
  CHECK(serial - one == Approx(double(m) * cfg.mxu.bf16_cycles_per_row + double(m) / cfg.vpu.sublanes * cfg.vpu.cycles_per_vreg));
  // Memory only: the device's bandwidth is both cores' (2 x 16 B/cycle), each DMA limited by its
  // engine (16 B/cycle): two cores loading X bytes each take latency + X / 16 cycles, as one core
  // loading X alone does with half the bandwidth.
  const int64_t x = 64 * 1024;
  auto r = chip.run(megacore({load_part(x, 0), load_part(x, uint64_t(x))}), {.timing_only = true});
  const double rate = std::min(cfg.dma.engine_bytes_per_cycle, 2 * cfg.hbm_bytes_per_cycle() / 2);
  CHECK(r.stats.cycles == Approx(cfg.dma.latency_cycles + double(x) / rate + 2 * cfg.scalar.issue_cycles).epsilon(0.01));
  CHECK(r.stats.hbm_bytes_per_cycle == Approx(2 * cfg.hbm_bytes_per_cycle()));
  // Ideal-model peak: the cores the program ran on.
  CHECK(r.stats.peak_flops == Approx(2 * cfg.peak_flops()));
}

TEST_CASE("megacore: the calibrated model prices the busiest core and the shared HBM", "[sim][megacore]") {
  ChipConfig cfg = two_core_tiny("calibrated");
  cfg.timing.launch_cycles = 100;
  cfg.timing.mxu_efficiency = 0.5;
  cfg.timing.hbm_efficiency = 1;
  cfg.timing.memory_overlap = 1;
  Chip chip(cfg);
  const int64_t m = 512;
  // Streaming m rows on one MXU of a core's 2: m / (2 x 0.5) cycles per core, on 1 core or 2.
  const double per_core = double(m) / (cfg.mxu.count * 0.5);
  auto split = chip.run(megacore({compute_part(m), compute_part(m)}), {.timing_only = true});
  CHECK(split.stats.cycles == Approx(100 + cfg.mxu.fill_cycles + per_core));
  auto serial = chip.run(compute_part(2 * m), {.timing_only = true});
  CHECK(serial.stats.cycles == Approx(100 + cfg.mxu.fill_cycles + 2 * per_core));
  // The device's peak either way (calibrated MFU is against the device).
  CHECK(split.stats.peak_flops == Approx(serial.stats.peak_flops));
  CHECK(split.stats.mfu == Approx(2 * serial.stats.mfu * serial.stats.cycles / split.stats.cycles / 2));
}

TEST_CASE("megacore: bad programs are errors", "[sim][megacore]") {
  Chip one(preset_config("tiny"));  // one core
  auto p = megacore({compute_part(8), compute_part(8)});
  try {
    one.run(p);
    FAIL("no error");
  } catch (const SimError& e) {
    CHECK(std::string(e.what()).find("timing.megacore") != std::string::npos);
  }
  Chip two(two_core_tiny());
  Program both = p;
  both.code = compute_part(8).code;
  CHECK_THROWS_WITH(two.run(both), Catch::Contains("megacore parts"));
  // An error inside a part names the core.
  Program bad = megacore({compute_part(8), load_part(64, uint64_t(1) << 40)});
  CHECK_THROWS_WITH(two.run(bad), Catch::Contains("core 1"));
  CHECK_THROWS_WITH(to_text(p), Catch::Contains("megacore"));
  CHECK_THROWS_WITH(program_to_json_text(p), Catch::Contains("megacore"));
  CHECK_THROWS_AS(two.vmem(2), SimError);
  // The chip stays usable.
  CHECK(two.run(p, {.timing_only = true}).stats.cycles > 0);
}
