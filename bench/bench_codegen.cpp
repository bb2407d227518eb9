// Codegen on the v5e-like simulated chip, timing-only (the programs' arithmetic is skipped, so
// model-sized shapes cost seconds of host time; cycle counts are the same as functional runs):
//  - BM_CompiledGemm:   4096^3 bf16 matmul through tpu::compile: MXU utilization
//  - BM_MlpEager / BM_MlpCompiled: x[2048, 4096] -> linear 16384 + gelu -> linear 4096 + residual:
//    simulated cycles, HBM bytes and their ratio to the minimum (inputs, weights, output once)
//  - BM_Qwen3DecoderLayer: one Qwen3-8B-shaped decoder layer forward (hidden 4096, 32 query and
//    8 KV heads of dim 128, q/k RMSNorm, RoPE, causal attention, SwiGLU MLP 12288), batch 1 x
//    seq 2048, bf16, compiled: simulated MFU (model FLOPs / (cycles x peak FLOP/cycle); causal
//    attention counted as half of the full QK^T + PV FLOPs), host wall time to cost it.
// Counters: sim_cycles, MXU_util_pct, HBM_bytes, HBM_vs_min, programs (runs per iteration).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ops/fallback.h"  // per-op host fallback counts (TPU_BENCH_KERNELS)
#include "tpucore/compile.h"
#include "tpucore/devices.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

namespace {

const tpu::Device kDev("sim:0");

// Codegen counters over one call of fn (synchronized).
template <class F>
tpu::SimStats measure(F&& fn) {
  tpu::synchronize(kDev);
  tpu::reset_sim_stats();
  fn();
  tpu::synchronize(kDev);
  return tpu::sim_stats();
}

// MXU FLOPs per cycle of the chip behind kDev (its bf16 peak over its clock).
double peak_flops_per_cycle() {
  const tpu::DeviceProperties p = tpu::device_properties(kDev);
  return p.peak_flops / (p.clock_ghz * 1e9);
}

void report(benchmark::State& state, const tpu::SimStats& s, double min_hbm_bytes) {
  const double peak_per_cycle = peak_flops_per_cycle();
  state.counters["sim_cycles"] = s.cycles;
  state.counters["sim_ms"] = s.cycles / (tpu::device_properties(kDev).clock_ghz * 1e6);
  state.counters["MXU_util_pct"] = 100.0 * s.mxu_flops / (s.cycles * peak_per_cycle);
  state.counters["HBM_bytes"] = double(s.hbm_bytes);
  if (min_hbm_bytes > 0) state.counters["HBM_vs_min"] = double(s.hbm_bytes) / min_hbm_bytes;
  state.counters["programs"] = double(s.runs);
}

void BM_CompiledGemm(benchmark::State& state) {
  tpu::SimTimingOnly timing;
  const int64_t n = state.range(0);
  tpu::Tensor a = tpu::empty({n, n}, {tpu::DType::bf16, kDev}), b = tpu::empty({n, n}, {tpu::DType::bf16, kDev});
  auto f = tpu::compile([](const tpu::Tensor& x, const tpu::Tensor& y) { return tpu::matmul(x, y); }, {.name = "gemm"});
  (void)f(a, b);
  tpu::SimStats s;
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
  tpu::SimTimingOnly timing;
  Mlp m;
  tpu::SimStats s;
  for (auto _ : state) s = measure([&] { (void)m(m.x); });
  report(state, s, m.min_bytes());
}
BENCHMARK(BM_MlpEager)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MlpCompiled(benchmark::State& state) {
  tpu::SimTimingOnly timing;
  Mlp m;
  auto f = tpu::compile([&](const tpu::Tensor& in) { return m(in); }, {.name = "mlp"});
  (void)f(m.x);
  tpu::SimStats s;
  for (auto _ : state) s = measure([&] { (void)f(m.x); });
  report(state, s, m.min_bytes());
}
BENCHMARK(BM_MlpCompiled)->Unit(benchmark::kMillisecond)->UseRealTime();

// One Qwen3-8B-shaped decoder layer, x [2048, 4096] (batch 1 folded into the rows). RoPE is the
// rotary_embedding op on the [1, heads, T, 128] views with [T, 128] cos/sin tables.
struct Qwen3Layer {
  static constexpr int64_t T = 2048, E = 4096, H = 32, HK = 8, D = 128, F = 12288;
  tpu::Tensor x, attn_norm, wq, wk, wv, q_norm, k_norm, wo, mlp_norm, wg, wu, wd, cos, sin;
  Qwen3Layer() {
    const tpu::TensorOptions o(tpu::DType::bf16, kDev);
    x = tpu::empty({T, E}, o);
    attn_norm = tpu::empty({E}, o);
    mlp_norm = tpu::empty({E}, o);
    q_norm = tpu::empty({D}, o);
    k_norm = tpu::empty({D}, o);
    wq = tpu::empty({H * D, E}, o);
    wk = tpu::empty({HK * D, E}, o);
    wv = tpu::empty({HK * D, E}, o);
    wo = tpu::empty({E, H * D}, o);
    wg = tpu::empty({F, E}, o);
    wu = tpu::empty({F, E}, o);
    wd = tpu::empty({E, F}, o);
    cos = tpu::empty({T, D}, o);
    sin = tpu::empty({T, D}, o);
  }
  // y [T, n * D] -> per-head RMSNorm -> [1, n, T, D] heads (a strided view) -> RoPE.
  tpu::Tensor heads(const tpu::Tensor& y, int64_t n, const tpu::Tensor& w) const {
    tpu::Tensor normed = tpu::rms_norm(tpu::reshape(y, {T * n, D}), {D}, w, 1e-6);
    return tpu::rotary_embedding(tpu::transpose(tpu::reshape(normed, {1, T, n, D}), 1, 2), cos, sin);
  }
  tpu::Tensor operator()(const tpu::Tensor& in) const {
    tpu::Tensor h = tpu::rms_norm(in, {E}, attn_norm, 1e-6);
    tpu::Tensor q = heads(tpu::linear(h, wq), H, q_norm);
    tpu::Tensor k = heads(tpu::linear(h, wk), HK, k_norm);
    tpu::Tensor v = tpu::transpose(tpu::reshape(tpu::linear(h, wv), {1, T, HK, D}), 1, 2);
    tpu::Tensor a = tpu::scaled_dot_product_attention(q, k, v, {}, true);
    tpu::Tensor x1 = in + tpu::linear(tpu::reshape(tpu::transpose(a, 1, 2), {T, H * D}), wo);
    tpu::Tensor h2 = tpu::rms_norm(x1, {E}, mlp_norm, 1e-6);
    tpu::Tensor m = tpu::silu(tpu::linear(h2, wg)) * tpu::linear(h2, wu);
    return x1 + tpu::linear(m, wd);
  }
  // Model FLOPs: the seven projections, and causal attention as half of QK^T + PV.
  static double model_flops() {
    const double t = double(T), e = double(E);
    const double proj = 2 * t * e * (H * D + 2.0 * HK * D) + 2 * t * (H * D) * e + 3 * 2 * t * e * F;
    const double attn_full = 2 * (2 * t * t * D * H);
    return proj + attn_full / 2;
  }
  double min_bytes() const {
    double w = 0;
    for (const tpu::Tensor* p : {&wq, &wk, &wv, &wo, &wg, &wu, &wd}) w += double(p->nbytes());
    return w + 2 * double(x.nbytes());
  }
};

void BM_Qwen3DecoderLayer(benchmark::State& state) {
  tpu::SimTimingOnly timing;
  Qwen3Layer layer;
  auto f = tpu::compile([&](const tpu::Tensor& in) { return layer(in); }, {.name = "qwen3_layer"});
  (void)f(layer.x);
  const uint64_t fallbacks_before = tpu::ops::total_fallbacks();
  tpu::SimStats s;
  for (auto _ : state) s = measure([&] { (void)f(layer.x); });
  report(state, s, layer.min_bytes());
  const double peak_per_cycle = peak_flops_per_cycle();
  state.counters["MFU_pct"] = 100.0 * Qwen3Layer::model_flops() / (s.cycles * peak_per_cycle);
  state.counters["model_GFLOP"] = Qwen3Layer::model_flops() / 1e9;
  state.counters["host_fallbacks"] = double(tpu::ops::total_fallbacks() - fallbacks_before);
  if (std::getenv("TPU_BENCH_KERNELS")) {  // per-kernel cycles, for profiling
    for (const auto& [k, c] : s.cycles_by_kernel)
      std::fprintf(stderr, "  %-40s runs %4llu  cycles %12.0f (%5.1f%%)\n", k.c_str(),
                   static_cast<unsigned long long>(s.runs_by_kernel[k]), c, 100.0 * c / s.cycles);
    for (const auto& fc : tpu::ops::fallback_counts())
      std::fprintf(stderr, "  host fallback: %s on %s: %llu\n", fc.op.c_str(), fc.device.str().c_str(),
                   static_cast<unsigned long long>(fc.calls));
  }
}
BENCHMARK(BM_Qwen3DecoderLayer)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
