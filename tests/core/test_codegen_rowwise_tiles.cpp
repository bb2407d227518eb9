// The rowwise kernel on inputs that take several row tiles on the v5e-like chip (tiles are
// capped at ~1M elements and pipelined: the next tile loads while this one computes and the
// previous one stores): norms and softmax, eager and as fused regions, against the cpu.
#include <cmath>

#include "codegen_testing.h"
#include "tpucore/compile.h"
#include "tpucore/ops.h"

namespace tpu::testing {
namespace {

// Counts the elements outside the tolerance (one assertion per tensor, not per element).
void check_all_near(const Tensor& got, const Tensor& want, double tol) {
  const auto g = dvals(got), w = dvals(want);
  REQUIRE(g.size() == w.size());
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) bad += !(std::fabs(g[i] - w[i]) <= tol * (1 + std::fabs(w[i])));
  CHECK(bad == 0);
}

TEST_CASE("codegen rowwise: multi-tile norms and softmax match the cpu", "[codegen][rowwise]") {
  const Device d("sim:0");
  Generator g(31);
  for (const Shape& s : {Shape{4096, 512}, Shape{3001, 1000}, Shape{70000, 16}}) {
    INFO("shape " << s.str());
    const int64_t c = s[1];
    const Tensor x = randn(s, {}, &g), w = randn({c}, {}, &g), b = randn({c}, {}, &g);
    const Tensor xd = x.to(d), wd = w.to(d), bd = b.to(d);
    ChipRunProbe probe;
    const Tensor r = rms_norm(xd, {c}, wd, 1e-6), l = layer_norm(xd, {c}, wd, bd), sm = softmax(xd, -1);
    auto f = compile([&](const Tensor& in) { return mul(add(rms_norm(mul(in, 2.0), {c}, wd, 1e-6), bd), 0.5); },
                     {.name = "rowwise_tiles"});
    const Tensor fr = f(xd);
    CHECK(probe.new_fallbacks() == 0);
    check_all_near(r, rms_norm(x, {c}, w, 1e-6), 1e-4);
    check_all_near(l, layer_norm(x, {c}, w, b), 1e-4);
    check_all_near(sm, softmax(x, -1), 1e-4);
    check_all_near(fr, mul(add(rms_norm(mul(x, 2.0), {c}, w, 1e-6), b), 0.5), 1e-4);
  }
}

}  // namespace
}  // namespace tpu::testing
