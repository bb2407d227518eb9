// f32 matmul precision on sim devices (codegen/precision.h): one, three or six bf16 passes.
// Accuracy against a double reference, the pass count against the MXU's streaming cycles, the
// default, and bad input.
#include <cmath>
#include <cstdlib>

#include "codegen/matmul_kernel.h"
#include "codegen/precision.h"
#include "codegen_testing.h"
#include "sim/chip.h"
#include "sim/presets.h"
#include "tpucore/core/error.h"

namespace tpu::testing {

extern const std::string kInitialF32MatmulPrecision;

TEST_CASE("f32 matmul precision: default one bf16 pass, user setting, bad input", "[codegen][precision]") {
  KeepPrecision keep;
  if (!std::getenv("TPU_F32_MATMUL_PRECISION"))
    CHECK(kInitialF32MatmulPrecision == "default");  // JAX and PyTorch/XLA on TPU
  set_float32_matmul_precision("medium");
  CHECK(float32_matmul_precision() == "default");
  CHECK(float32_matmul_passes() == 1);
  CHECK(codegen::f32_matmul_mode() == sim::MxuMode::bf16);
  set_float32_matmul_precision("high");
  CHECK(float32_matmul_passes() == 3);
  CHECK(codegen::f32_matmul_mode() == sim::MxuMode::bf16x3);
  set_float32_matmul_precision("highest");
  CHECK(float32_matmul_passes() == 6);
  CHECK(codegen::f32_matmul_mode() == sim::MxuMode::f32);
  CHECK_THROWS_AS(set_float32_matmul_precision("ultra"), Error);
  CHECK_THROWS_WITH(set_float32_matmul_precision("HIGH"), Catch::Contains("\"highest\""));
  CHECK(float32_matmul_precision() == "highest");  // unchanged by the bad calls
}

TEST_CASE("f32 matmul precision: error against a double reference falls with the passes", "[codegen][precision]") {
  KeepPrecision keep;
  TinySim tiny;
  Generator g(11);
  const int64_t m = 24, n = 16, k = 64;
  Tensor a = make_input(g, {m, k}, DType::f32, Layout::contiguous), b = make_input(g, {k, n}, DType::f32, Layout::contiguous);
  const auto av = a.to_vector<float>(), bv = b.to_vector<float>();
  // Largest error relative to sum_k |a_ik b_kj| (the scale of the rounding of each product).
  auto error = [&](const std::string& precision) {
    set_float32_matmul_precision(precision);
    const auto c = tpu::matmul(a.to(tiny.dev()), b.to(tiny.dev())).to(Device("cpu")).to_vector<float>();
    double worst = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0, scale = 0;
        for (int64_t q = 0; q < k; ++q) {
          ref += double(av[size_t(i * k + q)]) * bv[size_t(q * n + j)];
          scale += std::abs(double(av[size_t(i * k + q)]) * bv[size_t(q * n + j)]);
        }
        worst = std::max(worst, std::abs(c[size_t(i * n + j)] - ref) / scale);
      }
    return worst;
  };
  const double e1 = error("default"), e3 = error("high"), e6 = error("highest");
  INFO("1 pass " << e1 << ", 3 passes " << e3 << ", 6 passes " << e6);
  // One pass: each input rounded to bf16 (relative error <= 2^-9 each), so <= ~2^-8 per product;
  // and it does round.
  CHECK(e1 <= std::ldexp(1.0, -7));
  CHECK(e1 >= std::ldexp(1.0, -14));
  // Three passes: the dropped lo*lo term and the lo parts' rounding, ~2^-16, plus f32 sums.
  CHECK(e3 <= std::ldexp(1.0, -14));
  CHECK(e3 * 30 < e1);
  // Six passes: f32-accurate products; f32 accumulation over k terms.
  CHECK(e6 <= double(k) * std::ldexp(1.0, -24));
  CHECK(e6 <= e3);
}

TEST_CASE("f32 matmul precision: each pass costs the MXUs a bf16 pass", "[codegen][precision]") {
  const sim::ChipConfig cfg = sim::preset_config("v5e-ideal");
  REQUIRE(cfg.mxu.f32_cycles_per_row == 6 * cfg.mxu.bf16_cycles_per_row);  // highest = 6 passes
  const int64_t m = 512, n = 512, k = 1024;
  double busy1 = 0, prev_cycles = 0;
  for (int passes : {1, 3, 6}) {
    codegen::MatmulSpec s{.m = m, .n = n, .k = k};
    s.mode = passes == 1 ? sim::MxuMode::bf16 : passes == 3 ? sim::MxuMode::bf16x3 : sim::MxuMode::f32;
    sim::Chip chip(cfg);
    const auto r = chip.run(codegen::make_matmul_program(cfg, s), {.timing_only = true});
    double busy = 0;
    for (const auto& u : r.stats.units)
      if (u.name.rfind("mxu", 0) == 0 && u.name.find(".weights") == std::string::npos) busy += u.busy_cycles;
    // Streaming: every row of A once per (K tile, N tile), one bf16 pass per row per pass.
    CHECK(busy == Approx(double(m) * (k / 128) * (n / 128) * passes * cfg.mxu.bf16_cycles_per_row));
    if (passes == 1) busy1 = busy;
    CHECK(busy == Approx(busy1 * passes));
    CHECK(r.stats.cycles > prev_cycles);
    CHECK(r.stats.cycles >= busy / cfg.mxu.count);
    prev_cycles = r.stats.cycles;
    // MFU against the mode's own peak (the bf16 peak over the passes).
    CHECK(r.stats.peak_flops == Approx(cfg.peak_flops() / passes));
  }
}

}  // namespace tpu::testing
