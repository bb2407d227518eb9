// One training step of a Qwen3-8B-shaped model (36 layers, hidden 4096, 32 query / 8 KV heads
// of 128, q/k RMSNorm, RoPE, SwiGLU 12288, vocabulary 151,936, sequence 4096, bf16 compute,
// f32 master weights and gradient reductions, AdamW) with FSDP over every chip of a simulated
// v5p-like slice of 8 (2x2x2), 64 (4x4x4) and 256 (4x8x8) chips, one sequence per chip (the
// global batch grows with the chips). Timing-only, on sim:0 with TPU_SIM_CHIP (default v5p,
// the calibrated model; v5p-ideal for the ideal one).
//
// How it is costed (the assumptions are the figures' limits):
//  - Symmetry: every chip runs the same program, so one chip is simulated in full and the
//    others by symmetry (tpu::dist::sim_symmetric_group): each collective costs what the pod's
//    ring algorithm costs on the whole slice, as a job on the chip's ICI that overlaps programs
//    on other streams.
//  - Layers: the 36 decoder layers are identical, so one layer's steady state is simulated and
//    counted 36 times. Its compiled graph (tpu::compile) does the layer's forward and backward
//    (autograd inside the graph, upstream gradient as an input) and, as FSDP does in steady
//    state, the all-gathers of the next layer's weights (for its forward and again for its
//    backward, FSDP2 frees gathered weights after use) and the reduce-scatter (f32) of the
//    previous layer's gradients; the compiler's schedule decides how much of that hides.
//  - Head: final RMSNorm, the lm_head matmul, loss = mean logsumexp over the vocabulary (the
//    cross-entropy's target pick, a gather, is left out), its backward, the reduce-scatter of
//    lm_head's gradient; lm_head's gather is taken as hidden behind the last layer (its cost is
//    shown). The embedding lookup is not costed.
//  - Pipeline ends (not hidden): the first layer's gather and the last layer's reduce-scatter.
//  - Optimizer: AdamW on this chip's f32 shards (1/N of every parameter), compiled.
// Counters: step_ms, MFU_pct (model FLOPs 6 N + causal attention, over step x chips x the
// device's peak: all TensorCores of a chip), one_chip_MFU_pct (the step less its exposed
// communication), weak_scaling_pct (against the 8-chip slice of the same run), the breakdown
// (MXU-busy, other compute, HBM, ICI, exposed communication, in ms per step) and the host
// seconds the costing took. TPU_BENCH_KERNELS=1 prints the cycles per kernel of the layer, the
// head and the optimizer; TPU_BENCH_GRAPH=1 the layer's optimized graph.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "device/sim_driver.h"
#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/devices.h"
#include "tpucore/dist.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

namespace {

using tpu::DType;
using tpu::Shape;
using tpu::Tensor;

const tpu::Device kDev("sim:0");
constexpr int64_t T = 4096, E = 4096, H = 32, HK = 8, D = 128, F = 12288, V = 151936, L = 36;

tpu::TensorOptions bf16() { return {DType::bf16, kDev}; }
tpu::TensorOptions f32() { return {DType::f32, kDev}; }

struct Timed {
  double ms = 0;
  tpu::SimStats stats;
};
template <class Fn>
Timed timed(Fn&& fn) {
  tpu::synchronize(kDev);
  tpu::reset_sim_stats();
  tpu::Event a, b;
  a.record(kDev);
  fn();
  b.record(kDev);
  tpu::synchronize(kDev);
  return {a.elapsed_ms(b), tpu::sim_stats()};
}

const std::vector<Shape>& layer_shapes() {
  static const std::vector<Shape> s = {{E},         {H * D, E}, {HK * D, E}, {HK * D, E}, {D},        {D},
                                       {E, H * D},  {E},        {F, E},      {F, E},      {E, F}};
  return s;
}
double layer_params() {
  double n = 0;
  for (const Shape& s : layer_shapes()) n += double(s.numel());
  return n;
}

// One decoder layer, steady state of FSDP (see the header).
Timed layer_step(const tpu::dist::ProcessGroupPtr& pg, bool comm = true) {
  const int64_t N = pg->size();
  std::vector<Tensor> full, next_shard, prev_grad;
  for (const Shape& s : layer_shapes()) {  // flat shards, padded to a multiple of N (as FSDP2)
    const int64_t shard = (s.numel() + N - 1) / N;
    full.push_back(tpu::empty(s, bf16()));
    next_shard.push_back(tpu::empty(Shape{shard}, bf16()));
    prev_grad.push_back(tpu::empty(Shape{shard * N}, f32()));
  }
  Tensor cs = tpu::empty({T, D}, bf16()), sn = tpu::empty({T, D}, bf16());
  auto step = [&](const Tensor& x, const Tensor& dy) {
    std::vector<Tensor> out;
    // Communication of the neighbours: two gathers of the next layer, one reduce-scatter.
    for (size_t i = 0; comm && i < full.size(); ++i)
      for (int k = 0; k < 2; ++k) {
        Tensor g = tpu::empty(Shape{next_shard[i].numel() * N}, bf16());
        pg->all_gather_into_tensor(g, next_shard[i]);
        out.push_back(g);
      }
    for (size_t i = 0; comm && i < full.size(); ++i) {
      Tensor r = tpu::empty(Shape{prev_grad[i].numel() / N}, f32());
      pg->reduce_scatter_tensor(r, prev_grad[i]);
      out.push_back(r);
    }
    // This layer: forward and backward on its gathered weights.
    std::vector<Tensor> w;
    for (const Tensor& f : full) w.push_back(f.detach().requires_grad_(true));
    Tensor xin = x.detach().requires_grad_(true);
    auto heads = [&](const Tensor& y, int64_t n, const Tensor& nw) {
      Tensor normed = tpu::rms_norm(tpu::reshape(y, {T * n, D}), {D}, nw, 1e-6);
      return tpu::rotary_embedding(tpu::transpose(tpu::reshape(normed, {1, T, n, D}), 1, 2), cs, sn);
    };
    Tensor h = tpu::rms_norm(xin, {E}, w[0], 1e-6);
    Tensor q = heads(tpu::linear(h, w[1]), H, w[4]);
    Tensor k = heads(tpu::linear(h, w[2]), HK, w[5]);
    Tensor v = tpu::transpose(tpu::reshape(tpu::linear(h, w[3]), {1, T, HK, D}), 1, 2);
    Tensor a = tpu::scaled_dot_product_attention(q, k, v, {}, true);
    Tensor x1 = xin + tpu::linear(tpu::reshape(tpu::transpose(a, 1, 2), {T, H * D}), w[6]);
    Tensor h2 = tpu::rms_norm(x1, {E}, w[7], 1e-6);
    Tensor y = x1 + tpu::linear(tpu::silu(tpu::linear(h2, w[8])) * tpu::linear(h2, w[9]), w[10]);
    std::vector<Tensor> inputs = w;
    inputs.push_back(xin);
    std::vector<Tensor> grads = tpu::autograd::grad({y}, inputs, {dy});
    for (size_t i = 0; i + 1 < grads.size(); ++i) out.push_back(grads[i].to(DType::f32));  // for the next reduce-scatter
    out.push_back(grads.back());
    return out;
  };
  auto f = tpu::compile(step, {.name = comm ? "fsdp_layer" : "fsdp_layer_no_comm"});
  Tensor x = tpu::empty({T, E}, bf16()), dy = tpu::empty({T, E}, bf16());
  Timed t = timed([&] { (void)f(x, dy); });
  if (comm && std::getenv("TPU_BENCH_GRAPH"))  // the layer's optimized graph, for profiling
    for (const std::string& g : f.graphs()) std::fprintf(stderr, "%s\n", g.c_str());
  return t;
}

// Final norm, lm_head, loss, backward, reduce-scatter of lm_head's gradient.
Timed head_step(const tpu::dist::ProcessGroupPtr& pg) {
  const int64_t N = pg->size();
  Tensor wn = tpu::empty({E}, bf16()), wh = tpu::empty({V, E}, bf16());
  auto step = [&](const Tensor& x) {
    Tensor xin = x.detach().requires_grad_(true);
    Tensor whr = wh.detach().requires_grad_(true);
    Tensor logits = tpu::linear(tpu::rms_norm(xin, {E}, wn, 1e-6), whr);
    Tensor loss = tpu::logsumexp(logits.to(DType::f32), {-1}).mean();
    std::vector<Tensor> g = tpu::autograd::grad({loss}, {whr, xin});
    Tensor gw = tpu::reshape(g[0].to(DType::f32), {V * E});
    Tensor r = tpu::empty(Shape{V * E / N}, f32());
    pg->reduce_scatter_tensor(r, gw);
    return std::vector<Tensor>{loss, r, g[1]};
  };
  auto f = tpu::compile(step, {.name = "fsdp_head"});
  Tensor x = tpu::empty({T, E}, bf16());
  return timed([&] { (void)f(x); });
}

// AdamW on this chip's f32 master shards (1/N of every parameter; one flat buffer).
Timed optimizer_step(int64_t N) {
  const int64_t n = int64_t((L * layer_params() + 2.0 * V * E + E) / double(N));
  Tensor p = tpu::empty({n}, f32()), m = tpu::empty({n}, f32()), v = tpu::empty({n}, f32()), g = tpu::empty({n}, f32());
  Tensor p16 = tpu::empty({n}, bf16());
  auto step = [&](const Tensor& grad) {
    const double b1 = 0.9, b2 = 0.95, lr = 3e-4, eps = 1e-8, wd = 0.1;
    tpu::Tensor mm = m, vv = v, pp = p, pb = p16;
    mm.copy_(mm * b1 + grad * (1 - b1));
    vv.copy_(vv * b2 + grad * grad * (1 - b2));
    pp.copy_(pp - (mm / (tpu::sqrt(vv) + eps) + pp * wd) * lr);
    pb.copy_(pp);  // the bf16 copy the next step gathers
    return pp;
  };
  auto f = tpu::compile(step, {.name = "fsdp_adamw"});
  return timed([&] { (void)f(g); });
}

// The cost of one collective alone (for the pipeline ends and lm_head's gather).
double collective_ms(const tpu::dist::ProcessGroupPtr& pg, bool gather, int64_t elems, DType dt) {
  const int64_t N = pg->size();
  Tensor in = tpu::empty({gather ? elems / N : elems}, {dt, kDev}), out = tpu::empty({gather ? elems : elems / N}, {dt, kDev});
  return timed([&] {
           if (gather) pg->all_gather_into_tensor(out, in);
           else pg->reduce_scatter_tensor(out, in);
         }).ms;
}

// TPU_BENCH_KERNELS=1: the cycles of each kernel of a part of the step (for profiling).
void print_kernels(const char* part, const tpu::SimStats& s) {
  if (!std::getenv("TPU_BENCH_KERNELS")) return;
  std::fprintf(stderr, "%s: %.0f cycles, %llu runs, %.4g MXU FLOPs, %.4g HBM bytes\n", part, s.cycles,
               static_cast<unsigned long long>(s.runs), s.mxu_flops, double(s.hbm_bytes));
  for (const auto& [k, c] : s.cycles_by_kernel)
    std::fprintf(stderr, "  %-40s runs %5llu  cycles %13.0f (%5.1f%%)\n", k.c_str(),
                 static_cast<unsigned long long>(s.runs_by_kernel.count(k) ? s.runs_by_kernel.at(k) : 0), c,
                 100.0 * c / s.cycles);
}

double mxu_kernel_cycles(const tpu::SimStats& s) {
  double c = 0;
  for (const auto& [k, v] : s.cycles_by_kernel)
    if (k == "matmul" || k == "linear" || k == "region:matmul" || k == "scaled_dot_product_attention") c += v;
  return c;
}

void BM_Qwen3FsdpStep(benchmark::State& state) {
  static const std::map<int64_t, std::string> slices = {{8, "2x2x2"}, {64, "4x4x4"}, {256, "4x8x8"}};
  const int64_t N = state.range(0);
  tpu::SimTimingOnly timing;
  const auto host0 = std::chrono::steady_clock::now();
  auto pg = tpu::dist::sim_symmetric_group({.slice = slices.at(N)});
  Timed layer, layer_alone, head, opt;
  double fill = 0, head_gather = 0, layer_comm = 0;
  for (auto _ : state) {
    layer = layer_step(pg);
    layer_alone = layer_step(pg, false);
    head = head_step(pg);
    opt = optimizer_step(N);
    const int64_t lp = (int64_t(layer_params()) + N - 1) / N * N;
    fill = collective_ms(pg, true, lp, DType::bf16) + collective_ms(pg, false, lp, DType::f32);
    head_gather = collective_ms(pg, true, V * E, DType::bf16);
    layer_comm = 2 * collective_ms(pg, true, lp, DType::bf16) + collective_ms(pg, false, lp, DType::f32);
  }
  print_kernels("layer", layer.stats);
  print_kernels("head", head.stats);
  print_kernels("optimizer", opt.stats);
  // The device's peak: both timing models drive a chip's TensorCores as one device (megacore:
  // the calibrated model prices it, the ideal one runs a split kernel's parts on both cores),
  // so the peak and the HBM bandwidth are those of all its TensorCores.
  const tpu::sim::ChipConfig& cfg = tpu::device::sim_device(0).config();
  const double cores = cfg.timing.megacore;
  const double peak = cfg.peak_flops() * cores, hbm_bw = cfg.memory.hbm_bandwidth_gbps * 1e9 * cores;
  const double hz = cfg.clock_ghz * 1e9;
  const double step_ms = L * layer.ms + head.ms + opt.ms + fill;
  const double compute_ms = (L * layer.stats.cycles + head.stats.cycles + opt.stats.cycles) / hz * 1e3;
  const double mxu_busy_ms = (L * layer.stats.mxu_flops + head.stats.mxu_flops) / peak * 1e3;
  const double mxu_kernels_ms = (L * mxu_kernel_cycles(layer.stats) + mxu_kernel_cycles(head.stats)) / hz * 1e3;
  const double hbm_ms = double(L * layer.stats.hbm_bytes + head.stats.hbm_bytes + opt.stats.hbm_bytes) /
                        hbm_bw * 1e3;
  const double params = L * layer_params() + V * E;  // lm_head's matmul counts; the lookup does not
  const double attn = 12.0 * L * H * D * double(T) / 2;  // causal: half of 12 L H D T
  const double model_flops = (6 * params + attn) * double(T);
  state.counters["chips"] = double(N);
  state.counters["step_ms"] = step_ms;
  state.counters["MFU_pct"] = 100 * model_flops / (step_ms * 1e-3 * peak);
  // Weak scaling against the 8-chip slice of this run (same work per chip: 100% is perfect).
  static double step8_ms = 0;
  if (N == 8) step8_ms = step_ms;
  if (step8_ms > 0) state.counters["weak_scaling_pct"] = 100 * step8_ms / step_ms;
  state.counters["peak_TFLOPs"] = peak / 1e12;
  state.counters["layer_ms"] = layer.ms;
  state.counters["compute_ms"] = compute_ms;
  state.counters["mxu_busy_ms"] = mxu_busy_ms;
  state.counters["other_compute_ms"] = compute_ms - mxu_kernels_ms;
  state.counters["hbm_ms"] = hbm_ms;
  state.counters["ici_ms"] = L * layer_comm + fill + head_gather;
  // Exposed communication: the layer with its collectives against the same layer without
  // them, plus the pipeline ends; the rest of the step outside programs is copies and host
  // fallbacks (ops without a chip kernel: their data crosses the host link).
  const double exposed = L * (layer.ms - layer_alone.ms) + fill;
  state.counters["exposed_comm_ms"] = exposed;
  state.counters["exposed_comm_pct"] = 100 * exposed / step_ms;
  // The same step on one chip (no collectives: the step less its exposed communication).
  state.counters["one_chip_MFU_pct"] = 100 * model_flops / ((step_ms - exposed) * 1e-3 * peak);
  state.counters["copies_fallbacks_ms"] = step_ms - exposed - compute_ms;
  state.counters["layer_no_comm_ms"] = layer_alone.ms;
  state.counters["host_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - host0).count();
  state.SetLabel(cfg.name);
}
BENCHMARK(BM_Qwen3FsdpStep)->Arg(8)->Arg(64)->Arg(256)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
