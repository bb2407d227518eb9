// Number arguments of a compiled function (a learning rate, a step size) are runtime inputs of
// the graph; on sim they must reach the fused region's program as data, not as an immediate
// baked into the program: a new value reuses the program instead of building one per value.
#include "codegen_testing.h"
#include "jit_testing.h"
#include "tpucore/compile.h"

namespace tpu::testing {
namespace {

TEST_CASE("codegen: a compiled region reads number arguments at run time (no program per value)",
          "[codegen][jit]") {
  TinySim tiny;
  const Device d = tiny.dev();
  const Tensor x = jit_testing::rnd({37, 19}, 11), y = jit_testing::rnd({37, 19}, 12);
  const Tensor xd = x.to(d), yd = y.to(d);
  auto f = compile([](const Tensor& a, const Tensor& b, double lr) { return a - (b * lr) * 2.0 + 1.0; },
                   {.name = "runtime_lr"});
  uint64_t built_after_first = 0;
  const std::vector<double> lrs{0.1, 0.25, -3.0, 0.1, 1e-3};
  for (size_t i = 0; i < lrs.size(); ++i) {
    const double lr = lrs[i];
    ChipRunProbe probe;
    const Tensor got = f(xd, yd, lr).to("cpu");
    // Reference on the host, element by element.
    const auto xv = x.to_vector<float>(), yv = y.to_vector<float>(), gv = got.to_vector<float>();
    REQUIRE(gv.size() == xv.size());
    for (size_t k = 0; k < xv.size(); ++k) {
      const double want = xv[k] - (yv[k] * lr) * 2.0 + 1.0;
      INFO("lr " << lr << " element " << k);
      CHECK(std::fabs(gv[k] - want) <= 1e-5 * (1 + std::fabs(want)));
    }
    CHECK(probe.new_fallbacks() == 0);
    CHECK(probe.new_runs() >= 1);
    if (i == 0) built_after_first = codegen::stats().programs_built;
  }
  // Every later value ran the program built for the first one.
  CHECK(codegen::stats().programs_built == built_after_first);
  const jit::Stats stats = jit::stats();
  const auto* st = stats.find("runtime_lr");
  REQUIRE(st != nullptr);
  CHECK(st->compiles == 1);
}

}  // namespace
}  // namespace tpu::testing

namespace tpu::testing {
namespace {

TEST_CASE("codegen: eager add/sub read alpha at run time (an optimizer's step size builds no program per value)",
          "[codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = jit_testing::rnd({29, 45}, 21, dt), y = jit_testing::rnd({29, 45}, 22, dt);
    const Tensor xd = x.to(d), yd = y.to(d);
    const auto xv = x.to(DType::f32).to_vector<float>(), yv = y.to(DType::f32).to_vector<float>();
    uint64_t built = 0;
    const std::vector<double> alphas{0.5, -2.0, 3e-3, 0.5, 7.0};
    for (size_t i = 0; i < alphas.size(); ++i) {
      for (bool is_sub : {false, true}) {
        const double al = alphas[i];
        ChipRunProbe probe;
        const Tensor got = (is_sub ? sub(xd, yd, al) : add(xd, yd, al)).to("cpu").to(DType::f32);
        CHECK(probe.new_fallbacks() == 0);
        const auto gv = got.to_vector<float>();
        REQUIRE(gv.size() == xv.size());
        const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
        for (size_t k = 0; k < xv.size(); ++k) {
          const double want = is_sub ? xv[k] - al * yv[k] : xv[k] + al * yv[k];
          INFO(dtype_name(dt) << (is_sub ? " sub" : " add") << " alpha " << al << " element " << k);
          CHECK(std::fabs(gv[k] - want) <= tol * (1 + std::fabs(want)));
        }
      }
      if (i == 0) built = codegen::stats().programs_built;
    }
    CHECK(codegen::stats().programs_built == built);
  }
}

}  // namespace
}  // namespace tpu::testing
