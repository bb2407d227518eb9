// Simulator benchmarks on the v5e-like preset (figures recorded in sim/README.md):
//  - BM_TimingGemm/N:     N^3 bf16 GEMM costed in timing-only mode: MFU, simulated instructions/s
//  - BM_TimingStreamCopy: HBM-bound streaming copy: achieved fraction of the HBM bandwidth
//  - BM_FunctionalGemm/N: functional-mode GEMM (the host does the arithmetic) ...
//  - BM_EigenGemm/N:      ... against an Eigen f32 GEMM of the same size
#include <benchmark/benchmark.h>

#include <Eigen/Core>

#include "sim/chip.h"
#include "sim/presets.h"
#include "sim/programs.h"

using namespace tpu::sim;

namespace {

const ChipConfig& v5e() {
  static ChipConfig c = preset_config("v5e");
  return c;
}

void BM_TimingGemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto g = make_gemm(v5e(), {.m = n, .n = n, .k = n});
  Chip chip(v5e());
  RunResult r;
  for (auto _ : state) r = chip.run(g.program, {.timing_only = true, .race_check = false});
  // MFU_pct and sim_cycles: the preset's calibrated timing model; *_ideal: the event timeline.
  state.counters["MFU_pct"] = 100 * r.stats.mfu;
  state.counters["MFU_ideal_pct"] = 100 * r.stats.mxu_peak_cycles / r.stats.ideal_cycles;
  state.counters["sim_cycles"] = r.stats.cycles;
  state.counters["sim_cycles_ideal"] = r.stats.ideal_cycles;
  state.counters["instructions"] = double(r.stats.instructions);
  state.counters["instr_per_s"] =
      benchmark::Counter(double(r.stats.instructions), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TimingGemm)->Arg(4096)->Arg(8192)->Unit(benchmark::kMillisecond);

void BM_TimingStreamCopy(benchmark::State& state) {
  const uint64_t bytes = uint64_t(state.range(0)) << 20;
  auto cp = make_stream_copy(v5e(), bytes, uint64_t(4) << 20, 4);
  Chip chip(v5e());
  RunResult r;
  for (auto _ : state) r = chip.run(cp.program, {.timing_only = true, .race_check = false});
  state.counters["HBM_BW_pct"] = 100 * r.stats.hbm_bandwidth_fraction;
  state.counters["HBM_BW_ideal_pct"] =
      100 * double(r.stats.hbm_bytes_read + r.stats.hbm_bytes_written) / (r.stats.ideal_cycles * r.stats.hbm_bytes_per_cycle);
  state.counters["sim_cycles"] = r.stats.cycles;
  state.counters["sim_cycles_ideal"] = r.stats.ideal_cycles;
}
BENCHMARK(BM_TimingStreamCopy)->Arg(1024)->Unit(benchmark::kMillisecond);

void BM_FunctionalGemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto g = make_gemm(v5e(), {.m = n, .n = n, .k = n});
  Chip chip(v5e());
  std::vector<uint16_t> a(size_t(n * n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = f32_to_bf16_bits(float(int(i % 17) - 8) / 8.f);
  chip.write_hbm(g.a_addr, a.data(), a.size() * 2);
  chip.write_hbm(g.b_addr, a.data(), a.size() * 2);
  for (auto _ : state) chip.run(g.program, {.race_check = false});
  state.counters["GFLOP_per_s"] =
      benchmark::Counter(2.0 * double(n) * double(n) * double(n) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_FunctionalGemm)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond);

void BM_EigenGemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP_per_s"] =
      benchmark::Counter(2.0 * double(n) * double(n) * double(n) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_EigenGemm)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
