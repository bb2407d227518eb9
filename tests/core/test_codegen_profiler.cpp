// How codegen kernels show in the profiler: a compiled function's fused regions run outside any
// host op, so their rows are named after the kernel ("region:mlp") with one call per run; eager
// ops keep the op's name; a program still running from before the profile started is not
// counted in it.
#include <string>

#include "codegen_testing.h"
#include "jit_testing.h"
#include "tpucore/compile.h"
#include "tpucore/profiler.h"

namespace tpu::testing {
namespace {

const profiler::OpSummary* find_row(const std::vector<profiler::OpSummary>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}

TEST_CASE("codegen profiler: compiled regions show under their kernel's name, one call per run", "[codegen][profiler]") {
  TinySim tiny;
  const Device d = tiny.dev();
  // Big enough for the tiny chip's simulation to take a while on the host: the warm-up call's
  // program is usually still running when the profile starts.
  const Tensor x = jit_testing::rnd({256, 64}, 1).to(d), w1 = jit_testing::rnd({256, 64}, 2).to(d),
               b1 = jit_testing::rnd({256}, 3).to(d), w2 = jit_testing::rnd({64, 256}, 4).to(d),
               b2 = jit_testing::rnd({64}, 5).to(d);
  auto f = compile([&](const Tensor& in) { return add(in, linear(gelu(linear(in, w1, b1)), w2, b2)); },
                   {.name = "profiled_mlp"});
  (void)f(x);  // not synchronized
  profiler::Profile prof;
  const Tensor y = f(x);
  const Tensor z = gelu(y);
  prof.stop();
  const auto rows = prof.key_averages();
  const profiler::OpSummary* mlp = find_row(rows, "region:mlp");
  REQUIRE(mlp != nullptr);
  CHECK(mlp->calls == 1);
  CHECK(mlp->programs == 1);
  CHECK(mlp->chip_cycles > 0);
  CHECK(mlp->flops == 2.0 * 2 * 256 * 64 * 256);
  const profiler::OpSummary* g = find_row(rows, "gelu");
  REQUIRE(g != nullptr);
  CHECK(g->calls == 1);
  CHECK(g->programs == 1);
  for (const auto& r : rows) {
    INFO(r.name);
    CHECK(r.name.rfind("(program", 0) == std::string::npos);
  }
  CHECK(prof.table().find("region:mlp") != std::string::npos);
}

}  // namespace
}  // namespace tpu::testing
