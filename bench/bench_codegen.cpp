// Codegen on the v5e-like simulated chip, timing-only (the programs' arithmetic is skipped, so
// model-sized shapes cost seconds of host time; cycle counts are the same as functional runs):
//  - BM_CompiledGemm:   4096^3 bf16 matmul through tpu::compile: MXU utilization
//  - BM_MlpEager / BM_MlpCompiled: x[2048, 4096] -> linear 16384 + gelu -> linear 4096 + residual:
//    simulated cycles, HBM bytes and their ratio to the minimum (inputs, weights, output once)
// Counters: sim_cycles, MXU_util_pct, HBM_bytes, HBM_vs_min, programs (runs per iteration).
#include <benchmark/benchmark.h>

#include "codegen/launch.h"
#include "device/sim_driver.h"
#include "tpucore/compile.h"
#include "tpucore/devices.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

namespace {

const tpu::Device kDev("sim:0");

struct TimingOnly {
  TimingOnly() { tpu::codegen::set_timing_only(true); }
  ~TimingOnly() { tpu::codegen::set_timing_only(false); }
};

// Codegen counters over one call of fn (synchronized).
template <class F>
tpu::codegen::CodegenStats measure(F&& fn) {
  tpu::synchronize(kDev);
  tpu::codegen::reset_stats();
  fn();
  tpu::synchronize(kDev);
  return tpu::codegen::stats();
}

void report(benchmark::State& state, const tpu::codegen::CodegenStats& s, double min_hbm_bytes) {
  const auto& cfg = tpu::device::sim_device(0).config();
  const double peak_per_cycle = double(cfg.mxu.count) * cfg.mxu.rows * cfg.mxu.cols * 2;
  state.counters["sim_cycles"] = s.cycles;
  state.counters["sim_ms"] = s.cycles / (cfg.clock_ghz * 1e6);
  state.counters["MXU_util_pct"] = 100.0 * s.mxu_flops / (s.cycles * peak_per_cycle);
  state.counters["HBM_bytes"] = double(s.hbm_bytes);
  if (min_hbm_bytes > 0) state.counters["HBM_vs_min"] = double(s.hbm_bytes) / min_hbm_bytes;
  state.counters["programs"] = double(s.runs);
}

void BM_CompiledGemm(benchmark::State& state) {
  TimingOnly timing;
  const int64_t n = state.range(0);
  tpu::Tensor a = tpu::empty({n, n}, {tpu::DType::bf16, kDev}), b = tpu::empty({n, n}, {tpu::DType::bf16, kDev});
  auto f = tpu::compile([](const tpu::Tensor& x, const tpu::Tensor& y) { return tpu::matmul(x, y); }, {.name = "gemm"});
  (void)f(a, b);
  tpu::codegen::CodegenStats s;
  for (auto _ : state) s = measure([&] { (void)f(a, b); });
  report(state, s, 3.0 * double(n) * double(n) * 2);
}
BENCHMARK(BM_CompiledGemm)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();

struct Mlp {
  tpu::Tensor x, w1, b1, w2, b2;
  Mlp() {
    const tpu::DType bf = tpu::DType::bf16;
    x = tpu::empty({2048, 4096}, {bf, kDev});
    w1 = tpu::empty({16384, 4096}, {bf, kDev});
    b1 = tpu::empty({16384}, {bf, kDev});
    w2 = tpu::empty({4096, 16384}, {bf, kDev});
    b2 = tpu::empty({4096}, {bf, kDev});
  }
  tpu::Tensor operator()(const tpu::Tensor& in) const {
    return in + tpu::linear(tpu::gelu(tpu::linear(in, w1, b1)), w2, b2);
  }
  double min_bytes() const {
    return double(x.nbytes() + w1.nbytes() + b1.nbytes() + w2.nbytes() + b2.nbytes() + x.nbytes());
  }
};

void BM_MlpEager(benchmark::State& state) {
  TimingOnly timing;
  Mlp m;
  tpu::codegen::CodegenStats s;
  for (auto _ : state) s = measure([&] { (void)m(m.x); });
  report(state, s, m.min_bytes());
}
BENCHMARK(BM_MlpEager)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MlpCompiled(benchmark::State& state) {
  TimingOnly timing;
  Mlp m;
  auto f = tpu::compile([&](const tpu::Tensor& in) { return m(in); }, {.name = "mlp"});
  (void)f(m.x);
  tpu::codegen::CodegenStats s;
  for (auto _ : state) s = measure([&] { (void)f(m.x); });
  report(state, s, m.min_bytes());
}
BENCHMARK(BM_MlpCompiled)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
