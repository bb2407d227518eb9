// A compiled MLP block (one MlpKernel program) against the same block run eagerly on the chip
// (a program per op): small shapes on the tiny chip must take no more simulated cycles compiled
// than eager (cycles are deterministic), and both must match the block on the cpu.
#include <cmath>

#include "codegen_testing.h"
#include "jit_testing.h"
#include "tpucore/compile.h"

namespace tpu::testing {
namespace {

struct MlpShape {
  int64_t tokens, hidden;
};

TEST_CASE("codegen: a small compiled MLP block takes no more chip cycles than eager", "[codegen][mlp]") {
  TinySim tiny;
  const Device d = tiny.dev();
  for (DType dt : {DType::f32, DType::bf16})
    // {256, 64}: the hidden chunk is one column tile (VMEM), so its rows are split over the MXUs.
    for (const MlpShape& sh : {MlpShape{32, 64}, MlpShape{8, 16}, MlpShape{1, 64}, MlpShape{128, 32}, MlpShape{24, 40},
                               MlpShape{256, 64}}) {
      const int64_t T = sh.tokens, E = sh.hidden, F = 4 * E;
      INFO(dtype_name(dt) << " tokens " << T << " hidden " << E);
      const double s1 = 1.0 / std::sqrt(double(E)), s2 = 1.0 / std::sqrt(double(F));
      const Tensor x = jit_testing::rnd({T, E}, 1).to(dt), w1 = mul(jit_testing::rnd({F, E}, 2), s1).to(dt),
                   b1 = mul(jit_testing::rnd({F}, 3), 0.1).to(dt), w2 = mul(jit_testing::rnd({E, F}, 4), s2).to(dt),
                   b2 = mul(jit_testing::rnd({E}, 5), 0.1).to(dt);
      // The cpu reference in f32 from the same (rounded) values.
      auto block = [](const Tensor& in, const Tensor& a1, const Tensor& c1, const Tensor& a2, const Tensor& c2) {
        return add(in, linear(gelu(linear(in, a1, c1)), a2, c2));
      };
      const Tensor want = block(x.to(DType::f32), w1.to(DType::f32), b1.to(DType::f32), w2.to(DType::f32),
                                b2.to(DType::f32));
      const Tensor xd = x.to(d), w1d = w1.to(d), b1d = b1.to(d), w2d = w2.to(d), b2d = b2.to(d);
      auto on_chip = [&](const Tensor& in) { return block(in, w1d, b1d, w2d, b2d); };

      ChipRunProbe eager_probe;
      const Tensor eager = on_chip(xd);
      const double eager_cycles = eager_probe.new_cycles();
      CHECK(eager_probe.new_runs() == 4);  // linear, gelu, linear, add

      auto f = compile(on_chip, {.name = "mlp_cycles"});
      (void)f(xd);  // traces and builds the kernels
      ChipRunProbe compiled_probe;
      const uint64_t mlp_runs = codegen::stats().runs_by_kernel["region:mlp"];
      const Tensor got = f(xd);
      const double compiled_cycles = compiled_probe.new_cycles();
      CHECK(compiled_probe.new_runs() == 1);
      CHECK(codegen::stats().runs_by_kernel["region:mlp"] == mlp_runs + 1);
      CHECK(compiled_probe.new_fallbacks() == 0);
      INFO("cycles: eager " << eager_cycles << ", compiled " << compiled_cycles);
      CHECK(compiled_cycles > 0);
      CHECK(compiled_cycles <= eager_cycles);
      const double tol = dt == DType::f32 ? 1e-4 : 3e-2;
      jit_testing::expect_close(got.to("cpu").to(DType::f32), want, tol, tol, "compiled MLP on sim vs cpu");
      jit_testing::expect_close(eager.to("cpu").to(DType::f32), want, tol, tol, "eager MLP on sim vs cpu");
    }
}

}  // namespace
}  // namespace tpu::testing
