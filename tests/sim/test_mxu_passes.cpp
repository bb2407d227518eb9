// MXU mode bf16x3 (three bf16 passes over hi/lo splits of f32 inputs): values against a double
// reference (between one pass and f32), streaming cycles three times the bf16 rate, text form.
#include <cmath>

#include <catch2/catch.hpp>

#include "sim/assembly.h"
#include "sim/builder.h"
#include "sim_test_util.h"

using namespace tpu::sim;
using B = ProgramBuilder;

namespace {

// C[16 x 8] = A[16 x 8] W[8 x 8] in `mode`, everything f32 in VMEM.
Program mm(MxuMode mode) {
  B b("passes");
  b.mxu_load_weights(0, B::vmem(B::at(1024), DType::f32, 8), 8, 8, mode);
  b.mxu_matmul(0, B::vmem(B::at(2048), DType::f32, 8), B::vmem(B::at(0), DType::f32, 8), 16, 8, 8, false, mode);
  return b.finish();
}

}  // namespace

TEST_CASE("mxu bf16x3: error between one bf16 pass and f32, three times the cycles", "[sim][mxu]") {
  Chip chip = simtest::tiny();
  auto a = simtest::random_floats(128, 3), w = simtest::random_floats(64, 4);
  simtest::put(chip, Space::vmem, 0, a);
  simtest::put(chip, Space::vmem, 1024, w);
  auto run = [&](MxuMode mode, double* busy) {
    auto r = chip.run(mm(mode));
    for (const auto& u : r.stats.units)
      if (u.name == "mxu0") *busy = u.busy_cycles;
    auto c = simtest::get<float>(chip, Space::vmem, 2048, 128);
    double worst = 0;
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        double ref = 0, scale = 0;
        for (int k = 0; k < 8; ++k) {
          ref += double(a[size_t(i * 8 + k)]) * w[size_t(k * 8 + j)];
          scale += std::abs(double(a[size_t(i * 8 + k)]) * w[size_t(k * 8 + j)]);
        }
        worst = std::max(worst, std::abs(c[size_t(i * 8 + j)] - ref) / scale);
      }
    return worst;
  };
  double b1 = 0, b3 = 0, bf = 0;
  const double e1 = run(MxuMode::bf16, &b1), e3 = run(MxuMode::bf16x3, &b3), ef = run(MxuMode::f32, &bf);
  INFO("errors " << e1 << " " << e3 << " " << ef);
  CHECK(e1 <= std::ldexp(1.0, -7));
  CHECK(e3 <= std::ldexp(1.0, -15));  // dropped lo*lo and lo rounding: ~2^-16
  CHECK(e3 * 30 < e1);
  CHECK(ef <= 8 * std::ldexp(1.0, -24));
  const ChipConfig& cfg = chip.config();
  CHECK(b1 == Approx(16 * cfg.mxu.bf16_cycles_per_row));
  CHECK(b3 == Approx(3 * 16 * cfg.mxu.bf16_cycles_per_row));
  CHECK(bf == Approx(16 * cfg.mxu.f32_cycles_per_row));
  // Text and parse keep the mode; an unknown mode names the choices.
  const Program p = mm(MxuMode::bf16x3);
  CHECK(parse_program(to_text(p)) == p);
  CHECK(to_text(p).find("mode=bf16x3") != std::string::npos);
  CHECK_THROWS_WITH(parse_program("mxu.lw mxu=0 w=vmem[0]:f32 k=8 n=8 mode=bf16x9"), Catch::Contains("bf16x3"));
}
