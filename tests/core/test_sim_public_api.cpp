// The public entry points of the simulated chip (tpucore/devices.h): sim_stats() counts every
// chip program the ops issue, reset_sim_stats() zeroes it, and timing-only mode (SimTimingOnly)
// keeps the cycles of the functional programs, restoring the previous mode at scope exit.
#include "codegen_testing.h"

namespace tpu::testing {

TEST_CASE("sim_stats: counts each eager op's program and its cycles, reset zeroes them", "[codegen]") {
  TinySim tiny;
  Tensor a = ones({4, 16}).to(tiny.dev()), b = full({4, 16}, 2.0).to(tiny.dev());
  (void)(a + b);  // program built and cached
  ChipRunProbe::sync_all();
  reset_sim_stats();
  const SimStats zero = sim_stats();
  CHECK(zero.runs == 0);
  CHECK(zero.cycles == 0);
  CHECK(zero.runs_by_kernel.empty());
  for (int i = 0; i < 3; ++i) (void)(a + b);
  ChipRunProbe::sync_all();
  const SimStats s = sim_stats();
  CHECK(s.runs == 3);
  CHECK(s.runs_by_kernel.at("add") == 3);
  CHECK(s.cache_hits >= 3);
  CHECK(s.programs_built == 0);
  CHECK(s.cycles > 0);
  CHECK(s.cycles_by_kernel.at("add") == s.cycles);
}

TEST_CASE("sim timing-only mode: same cycles as the functional run, scoped", "[codegen]") {
  TinySim tiny;
  Tensor a = ones({8, 32}).to(tiny.dev()), b = full({8, 32}, 2.0).to(tiny.dev());
  auto cycles_of_add = [&] {
    ChipRunProbe::sync_all();
    reset_sim_stats();
    Tensor c = a + b;
    ChipRunProbe::sync_all();
    return sim_stats().cycles_by_kernel.at("add");
  };
  const double functional = cycles_of_add();
  CHECK(!sim_timing_only());
  double timed = 0;
  {
    SimTimingOnly timing;
    CHECK(sim_timing_only());
    timed = cycles_of_add();
    {
      SimTimingOnly nested;  // restores "on", not "off"
    }
    CHECK(sim_timing_only());
  }
  CHECK(!sim_timing_only());
  CHECK(timed == functional);
  CHECK(functional > 0);
  // Back to functional: values are computed again.
  CHECK((a + b).sum().item<double>() == 3.0 * 8 * 32);
}

}  // namespace tpu::testing
