// How codegen kernels show in the profiler: a call of a compiled function is a scope named
// "compiled:<name>" that owns its fused regions' programs; kernels run outside any op or scope
// are named after the kernel; eager ops keep the op's name; a program still running from before
// the profile started is not counted in it. RecordScope gives user code its own rows.
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

TEST_CASE("codegen profiler: a compiled function's programs show under its name, one call per call", "[codegen][profiler]") {
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
  CHECK(find_row(rows, "region:mlp") == nullptr);
  const profiler::OpSummary* mlp = find_row(rows, "compiled:profiled_mlp");
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
  CHECK(prof.table().find("compiled:profiled_mlp") != std::string::npos);
}

TEST_CASE("profiler: RecordScope rows own their nested ops and chip programs", "[codegen][profiler]") {
  TinySim tiny;
  const Device d = tiny.dev();
  const Tensor a = jit_testing::rnd({64, 32}, 7).to(d), b = jit_testing::rnd({64, 32}, 8).to(d);
  { profiler::RecordScope outside("not recorded"); }  // no profile: nothing happens
  ChipRunProbe::sync_all();
  profiler::Profile prof;
  for (int i = 0; i < 2; ++i) {
    profiler::RecordScope outer("my block");
    Tensor c = add(a, b);
    {
      profiler::RecordScope inner("inner part");
      c = mul(c, b);
    }
    ChipRunProbe::sync_all();
  }
  Tensor e = exp(a);  // outside the scopes
  prof.stop();
  const auto rows = prof.key_averages();
  CHECK(find_row(rows, "not recorded") == nullptr);
  const profiler::OpSummary* outer = find_row(rows, "my block");
  const profiler::OpSummary* inner = find_row(rows, "inner part");
  const profiler::OpSummary* add_row = find_row(rows, "add");
  const profiler::OpSummary* mul_row = find_row(rows, "mul");
  REQUIRE(outer != nullptr);
  REQUIRE(inner != nullptr);
  REQUIRE(add_row != nullptr);
  REQUIRE(mul_row != nullptr);
  CHECK(outer->calls == 2);
  CHECK(inner->calls == 2);
  // Nested spans are children: the outer scope's total covers its ops and the inner scope.
  CHECK(outer->host_total_us >= inner->host_total_us + add_row->host_total_us);
  CHECK(outer->host_self_us <= outer->host_total_us - inner->host_total_us - add_row->host_total_us + 1e-3);
  // Chip programs go to the innermost op that enqueued them, not to the scopes.
  CHECK(add_row->programs == 2);
  CHECK(mul_row->programs == 2);
  CHECK(find_row(rows, "exp") != nullptr);
}

}  // namespace
}  // namespace tpu::testing
