// tpu::compile benchmarks:
//   gelu(x * w + b) on 16M floats, eager vs compiled (fused: one pass over memory), both
//   alternated in one benchmark (their ratio under the same load), and gelu alone (the bound
//   for the compiled figure);
//   cache-hit call overhead (a compiled function whose graph runs no kernel, and one tiny op);
//   trace + optimize time of a 12-layer (and a 96-layer) transformer-like forward graph.
#include <benchmark/benchmark.h>

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <string>

#include "graph/passes/passes.h"
#include "graph/tracer.h"
#include "tpucore/compile.h"
#include "tpucore/ops.h"

using namespace tpu;

namespace {

// x: 16M floats as [4096, 4096]; w, b: per-feature vectors (broadcast over the rows).
constexpr int64_t kRows = 4096, kCols = 4096, kBig = kRows * kCols;

struct GeluInputs {
  Tensor x = randn({kRows, kCols}), w = randn({kCols}), b = randn({kCols});
};
GeluInputs& gelu_inputs() {
  static GeluInputs in;
  return in;
}

// CPU time of the whole process (all threads), in ms: fair on a machine shared with others.
double process_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-3;
}

// The loop of the 16M benchmarks: call() per iteration, the CPU time of all threads per call
// as a counter, and (with `bytes`) one read of x and one write of the result as bytes moved.
template <class F>
void run_16m(benchmark::State& st, F&& call, bool bytes) {
  const double c0 = process_cpu_ms();
  for (auto _ : st) benchmark::DoNotOptimize(call());
  st.counters["cpu_ms_all_threads"] = (process_cpu_ms() - c0) / static_cast<double>(st.iterations());
  if (bytes) st.SetBytesProcessed(st.iterations() * kBig * 8);
}

void BM_GeluChainEager(benchmark::State& st) {
  auto& in = gelu_inputs();
  run_16m(st, [&] { return gelu(in.x * in.w + in.b); }, true);
}
BENCHMARK(BM_GeluChainEager)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_GeluChainCompiled(benchmark::State& st) {
  auto& in = gelu_inputs();
  auto f = compile([](const Tensor& x, const Tensor& w, const Tensor& b) { return gelu(x * w + b); });
  f(in.x, in.w, in.b);
  run_16m(st, [&] { return f(in.x, in.w, in.b); }, true);
}
BENCHMARK(BM_GeluChainCompiled)->Unit(benchmark::kMillisecond)->UseRealTime();

// The bound for any fusion of the chain: gelu alone over x (one pass over memory and the same
// gelu arithmetic, without the multiply and add). Compiled can only approach this figure, so
// eager / this is the best compiled-vs-eager ratio reachable with this gelu on this CPU.
void BM_GeluAloneBound(benchmark::State& st) {
  auto& in = gelu_inputs();
  run_16m(st, [&] { return gelu(in.x); }, true);
}
BENCHMARK(BM_GeluAloneBound)->Unit(benchmark::kMillisecond)->UseRealTime();

// Eager and compiled alternated call by call in one benchmark, so both see the same load on a
// shared machine: the ratio counter is the steadiest figure for the 2x target.
void BM_GeluChainInterleaved(benchmark::State& st) {
  auto& in = gelu_inputs();
  auto f = compile([](const Tensor& x, const Tensor& w, const Tensor& b) { return gelu(x * w + b); });
  f(in.x, in.w, in.b);
  benchmark::DoNotOptimize(gelu(in.x * in.w + in.b));  // warm: the allocator's cache holds the temporaries
  double eager_s = 0, compiled_s = 0, eager_cpu = 0, compiled_cpu = 0;
  using clock = std::chrono::steady_clock;
  for (auto _ : st) {
    const double c0 = process_cpu_ms();
    const auto t0 = clock::now();
    benchmark::DoNotOptimize(gelu(in.x * in.w + in.b));
    const auto t1 = clock::now();
    const double c1 = process_cpu_ms();
    benchmark::DoNotOptimize(f(in.x, in.w, in.b));
    const auto t2 = clock::now();
    const double c2 = process_cpu_ms();
    eager_s += std::chrono::duration<double>(t1 - t0).count();
    compiled_s += std::chrono::duration<double>(t2 - t1).count();
    eager_cpu += c1 - c0;
    compiled_cpu += c2 - c1;
  }
  const double n = static_cast<double>(st.iterations());
  st.counters["eager_ms"] = eager_s / n * 1e3;
  st.counters["compiled_ms"] = compiled_s / n * 1e3;
  st.counters["eager_over_compiled"] = eager_s / compiled_s;
  // Process CPU time (all threads) of each: the steadier ratio on a machine shared with others.
  st.counters["eager_cpu_ms"] = eager_cpu / n;
  st.counters["compiled_cpu_ms"] = compiled_cpu / n;
  st.counters["eager_over_compiled_cpu"] = eager_cpu / compiled_cpu;
}
BENCHMARK(BM_GeluChainInterleaved)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

// The floors, in one run alternated call by call with the same load: a plain copy of x into a
// fresh tensor (the memory-bound floor: one read and one write of 64 MiB on the same threads,
// from the same allocator), gelu alone over x, the eager chain and the compiled chain. Counters:
// process CPU ms (all threads) and wall ms of each, gelu / copy (target <= 1.1) and eager /
// compiled (target >= 2).
void BM_GeluFloorsInterleaved(benchmark::State& st) {
  auto& in = gelu_inputs();
  auto f = compile([](const Tensor& x, const Tensor& w, const Tensor& b) { return gelu(x * w + b); });
  auto copy = [&] { return in.x.clone(); };
  auto alone = [&] { return gelu(in.x); };
  auto eager = [&] { return gelu(in.x * in.w + in.b); };
  auto compiled = [&] { return f(in.x, in.w, in.b); };
  double cpu[4] = {}, wall[4] = {};
  using clock = std::chrono::steady_clock;
  auto side = [&](int k, auto&& call) {
    const double c0 = process_cpu_ms();
    const auto t0 = clock::now();
    benchmark::DoNotOptimize(call());
    wall[k] += std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    cpu[k] += process_cpu_ms() - c0;
  };
  copy(), alone(), eager(), compiled();  // warm the allocator's cache and the compile cache
  for (auto _ : st) side(0, copy), side(1, alone), side(2, eager), side(3, compiled);
  const double n = static_cast<double>(st.iterations());
  const char* names[4] = {"copy", "gelu", "eager", "compiled"};
  for (int k = 0; k < 4; ++k) {
    st.counters[std::string(names[k]) + "_cpu_ms"] = cpu[k] / n;
    st.counters[std::string(names[k]) + "_ms"] = wall[k] / n;
  }
  st.counters["gelu_over_copy_cpu"] = cpu[1] / cpu[0];
  st.counters["gelu_over_copy"] = wall[1] / wall[0];
  st.counters["eager_over_compiled_cpu"] = cpu[2] / cpu[3];
  st.counters["eager_over_compiled"] = wall[2] / wall[3];
}
BENCHMARK(BM_GeluFloorsInterleaved)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

// The same chain with a cheap activation: memory-bound, where fusion pays the most.
void BM_ReluChainEager(benchmark::State& st) {
  auto& in = gelu_inputs();
  run_16m(st, [&] { return relu(in.x * in.w + in.b); }, false);
}
BENCHMARK(BM_ReluChainEager)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ReluChainCompiled(benchmark::State& st) {
  auto& in = gelu_inputs();
  auto f = compile([](const Tensor& x, const Tensor& w, const Tensor& b) { return relu(x * w + b); });
  f(in.x, in.w, in.b);
  run_16m(st, [&] { return f(in.x, in.w, in.b); }, false);
}
BENCHMARK(BM_ReluChainCompiled)->Unit(benchmark::kMillisecond)->UseRealTime();

// The relu chain on narrow rows, x [N, C] with N * C = 4M and w, b [C]: the fused region's
// per-row overhead (w and b repeat per row; several rows run per program call).
void BM_NarrowReluChain(benchmark::State& st) {
  const int64_t c = st.range(0), n = (int64_t{4} << 20) / c;
  const bool compiled = st.range(1) != 0;
  Tensor x = randn({n, c}), w = randn({c}), b = randn({c});
  auto f = compile([](const Tensor& a, const Tensor& ww, const Tensor& bb) { return relu(a * ww + bb); });
  f(x, w, b);
  for (auto _ : st) benchmark::DoNotOptimize(compiled ? f(x, w, b) : relu(x * w + b));
  st.SetLabel(compiled ? "compiled" : "eager");
}
BENCHMARK(BM_NarrowReluChain)->ArgsProduct({{16, 64, 512}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();

// Overhead of a cache hit: signature, lookup, binding and executor setup, no kernel at all.
void BM_CacheHitNoKernel(benchmark::State& st) {
  Tensor x = randn({8, 128}), y = randn({8, 128});
  auto f = compile([](const Tensor& a, const Tensor& b) { return std::make_tuple(a, b.t()); });
  f(x, y);
  for (auto _ : st) benchmark::DoNotOptimize(f(x, y));
}
BENCHMARK(BM_CacheHitNoKernel);

void BM_TinyOpEager(benchmark::State& st) {
  Tensor x = randn({16});
  for (auto _ : st) benchmark::DoNotOptimize(x + 1.0);
}
BENCHMARK(BM_TinyOpEager);

void BM_TinyOpCompiled(benchmark::State& st) {
  Tensor x = randn({16});
  auto f = compile([](const Tensor& a) { return a + 1.0; });
  f(x);
  for (auto _ : st) benchmark::DoNotOptimize(f(x));
}
BENCHMARK(BM_TinyOpCompiled);

// A 12-layer pre-norm transformer forward (d=64, 4 heads, seq 32), traced and optimized.
struct Layer {
  Tensor ln1w, ln1b, wqkv, wo, ln2w, ln2b, w1, b1, w2, b2;
};
std::vector<Layer> make_layers(int n, int64_t d) {
  std::vector<Layer> v;
  for (int i = 0; i < n; ++i)
    v.push_back({ones({d}), zeros({d}), randn({3 * d, d}), randn({d, d}), ones({d}), zeros({d}), randn({4 * d, d}),
                 zeros({4 * d}), randn({d, 4 * d}), zeros({d})});
  return v;
}
Tensor transformer(const std::vector<Layer>& layers, const Tensor& x0) {
  const int64_t T = x0.size(0), D = x0.size(1), H = 4, hd = D / H;
  Tensor x = x0;
  Tensor mask = triu(full({T, T}, -1e9), 1);
  for (const Layer& l : layers) {
    Tensor h = layer_norm(x, Shape{D}, l.ln1w, l.ln1b);
    Tensor qkv = linear(h, l.wqkv);
    auto heads = [&](int64_t i) { return qkv.narrow(1, i * D, D).reshape({T, H, hd}).transpose(0, 1); };
    Tensor s = matmul(heads(0), heads(1).transpose(1, 2)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    Tensor o = matmul(softmax(s + mask, -1), heads(2)).transpose(0, 1).reshape({T, D});
    x = x + linear(o, l.wo);
    Tensor m = gelu(linear(layer_norm(x, Shape{D}, l.ln2w, l.ln2b), l.w1, l.b1));
    x = x + linear(m, l.w2, l.b2);
  }
  return x;
}

void trace_optimize_layers(benchmark::State& st, int n) {
  auto layers = make_layers(n, 64);
  Tensor x = randn({32, 64});
  size_t nodes = 0;
  for (auto _ : st) {
    graph::Tracer tr;
    Tensor px = tr.add_arg(x, 0);
    {
      graph::TraceScope scope(&tr);
      Tensor y = transformer(layers, px);
      Tensor outs[1] = {y};
      tr.set_outputs(outs);
    }
    graph::Graph g = tr.graph();
    nodes = g.nodes.size();
    graph::optimize(g, graph::PassOptions{});
    benchmark::DoNotOptimize(g.regions.size());
  }
  st.counters["nodes"] = static_cast<double>(nodes);
}
void BM_TraceOptimize12Layers(benchmark::State& st) { trace_optimize_layers(st, 12); }
BENCHMARK(BM_TraceOptimize12Layers)->Unit(benchmark::kMillisecond);
// The same with 96 layers: how the passes scale with the graph's size.
void BM_TraceOptimize96Layers(benchmark::State& st) { trace_optimize_layers(st, 96); }
BENCHMARK(BM_TraceOptimize96Layers)->Unit(benchmark::kMillisecond);

void BM_Transformer12Compiled(benchmark::State& st) {
  auto layers = make_layers(12, 64);
  Tensor x = randn({32, 64});
  auto f = compile([&](const Tensor& in) { return transformer(layers, in); });
  f(x);
  for (auto _ : st) benchmark::DoNotOptimize(f(x));
}
BENCHMARK(BM_Transformer12Compiled)->Unit(benchmark::kMillisecond);

void BM_Transformer12Eager(benchmark::State& st) {
  auto layers = make_layers(12, 64);
  Tensor x = randn({32, 64});
  for (auto _ : st) benchmark::DoNotOptimize(transformer(layers, x));
}
BENCHMARK(BM_Transformer12Eager)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
