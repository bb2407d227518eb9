// Defer-and-fuse eager mode (tpucore/defer.h) against plain eager, on the same eager code:
//   gelu(x * w + b), x as [rows, 4096] f32, w and b [4096]: plain eager runs three kernels and
//   materializes two temporaries; under tpu::DeferredEager the chain is recorded and flushed as
//   one fused graph (a compile-cache hit after the first round).
// Both modes are alternated call by call in one benchmark, so they see the same load on a
// shared machine; eager_over_defer is the ratio. Separate benchmarks give each mode alone.
// Arg: rows (4096 = 16M floats, the README's size; 16 = 64K floats, where recording and cache
// lookup overheads show).
#include <benchmark/benchmark.h>

#include <sys/resource.h>

#include <chrono>
#include <memory>
#include <string>

#include "tpucore/compile.h"
#include "tpucore/defer.h"
#include "tpucore/nn.h"
#include "tpucore/ops.h"

using namespace tpu;

namespace {

constexpr int64_t kCols = 4096;

// CPU time of the whole process (all threads), in seconds: fair on a machine shared with others.
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// Runs a then b in every iteration, timing each, and reports their mean wall times as
// "<a_name>_us" / "<b_name>_us", their mean process CPU times (all threads) as
// "<a_name>_cpu_us" / "<b_name>_cpu_us", and the ratios `ratio_name` (wall) and
// `ratio_name`_cpu (a over b, or b over a when b_over_a): the two sides share the machine's
// state call by call, and the CPU-time ratio is the steadier one when other jobs share the cores.
template <class A, class B>
void alternate(benchmark::State& st, const char* a_name, A&& a, const char* b_name, B&& b, const char* ratio_name,
               bool b_over_a = false) {
  using clock = std::chrono::steady_clock;
  double a_s = 0, b_s = 0, a_cpu = 0, b_cpu = 0;
  for (auto _ : st) {
    const double c0 = process_cpu_s();
    const auto t0 = clock::now();
    a();
    const auto t1 = clock::now();
    const double c1 = process_cpu_s();
    b();
    const auto t2 = clock::now();
    const double c2 = process_cpu_s();
    a_s += std::chrono::duration<double>(t1 - t0).count();
    b_s += std::chrono::duration<double>(t2 - t1).count();
    a_cpu += c1 - c0;
    b_cpu += c2 - c1;
  }
  const double n = static_cast<double>(st.iterations());
  st.counters[std::string(a_name) + "_us"] = a_s / n * 1e6;
  st.counters[std::string(b_name) + "_us"] = b_s / n * 1e6;
  st.counters[std::string(a_name) + "_cpu_us"] = a_cpu / n * 1e6;
  st.counters[std::string(b_name) + "_cpu_us"] = b_cpu / n * 1e6;
  st.counters[ratio_name] = b_over_a ? b_s / a_s : a_s / b_s;
  st.counters[std::string(ratio_name) + "_cpu"] = b_over_a ? b_cpu / a_cpu : a_cpu / b_cpu;
}

struct Inputs {
  Tensor x, w, b;
  explicit Inputs(int64_t rows) : x(randn({rows, kCols})), w(randn({kCols})), b(randn({kCols})) {}
};

Tensor chain(const Inputs& in) { return gelu(in.x * in.w + in.b); }

Tensor chain_deferred(const Inputs& in) {
  Tensor y;
  {
    DeferredEager guard;
    y = chain(in);
  }  // flushed here: one fused graph
  return y;
}

void BM_GeluChainPlainEager(benchmark::State& st) {
  Inputs in(st.range(0));
  for (auto _ : st) benchmark::DoNotOptimize(chain(in));
  st.SetBytesProcessed(st.iterations() * st.range(0) * kCols * 8);
}
BENCHMARK(BM_GeluChainPlainEager)->Arg(4096)->Arg(16)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_GeluChainDeferred(benchmark::State& st) {
  Inputs in(st.range(0));
  chain_deferred(in);  // first round compiles the segment
  for (auto _ : st) benchmark::DoNotOptimize(chain_deferred(in));
  st.SetBytesProcessed(st.iterations() * st.range(0) * kCols * 8);
}
BENCHMARK(BM_GeluChainDeferred)->Arg(4096)->Arg(16)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_GeluChainInterleaved(benchmark::State& st) {
  Inputs in(st.range(0));
  chain_deferred(in);
  alternate(
      st, "eager", [&] { benchmark::DoNotOptimize(chain(in)); }, "defer",
      [&] { benchmark::DoNotOptimize(chain_deferred(in)); }, "eager_over_defer");
}
BENCHMARK(BM_GeluChainInterleaved)->Arg(4096)->Arg(16)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Deferred eager against tpu::compile of the same chain (the bound: the same fused graph without
// recording, flush and proxy filling), alternated call by call.
void BM_GeluChainDeferVsCompiled(benchmark::State& st) {
  Inputs in(st.range(0));
  auto f = compile([](const Tensor& x, const Tensor& w, const Tensor& b) { return gelu(x * w + b); });
  f(in.x, in.w, in.b);
  chain_deferred(in);
  alternate(
      st, "compiled", [&] { benchmark::DoNotOptimize(f(in.x, in.w, in.b)); }, "defer",
      [&] { benchmark::DoNotOptimize(chain_deferred(in)); }, "defer_over_compiled", true);
}
BENCHMARK(BM_GeluChainDeferVsCompiled)->Arg(4096)->Arg(16)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The training step (bench_train.cpp's Fashion-MNIST MLP 784-256-10, ReLU, batch 128: zero_grad,
// forward, cross_entropy, backward, optimizer step), plain eager and inside a DeferredEager scope
// per step, alternated step by step on two copies of the model. Arg 0: SGD with momentum 0.9,
// 1: AdamW.
struct TrainRun {
  Generator g{1};
  nn::MLP model{{784, 256, 10}, "relu", 0.0, &g};
  std::unique_ptr<optim::Optimizer> opt;
  explicit TrainRun(bool adamw) {
    if (adamw) opt = std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions{});
    else opt = std::make_unique<optim::SGD>(model.parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  }
  Tensor step(const Tensor& x, const Tensor& y) {
    opt->zero_grad();
    Tensor loss = nn::cross_entropy(model.forward(x), y);
    loss.backward();
    opt->step();
    return loss.detach();
  }
  Tensor deferred_step(const Tensor& x, const Tensor& y) {
    Tensor l;
    {
      DeferredEager guard;
      l = step(x, y);
    }
    return l;
  }
};

struct TrainBatch {
  Generator g{2};
  Tensor x = rand({128, 784}, {}, &g);
  Tensor y = randint(0, 10, {128}, DType::i32, &g);
};

void BM_TrainStepInterleaved(benchmark::State& st) {
  const bool adamw = st.range(0) == 1;
  TrainRun eager(adamw), deferred(adamw);
  TrainBatch d;
  for (int i = 0; i < 3; ++i) eager.step(d.x, d.y), deferred.deferred_step(d.x, d.y);  // warm-up: buffers, cache
  alternate(
      st, "eager", [&] { benchmark::DoNotOptimize(eager.step(d.x, d.y).raw_data()); }, "defer",
      [&] { benchmark::DoNotOptimize(deferred.deferred_step(d.x, d.y).raw_data()); }, "eager_over_defer");
}
BENCHMARK(BM_TrainStepInterleaved)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

// One mode alone (for profiling one side): Args {optimizer (0 SGD, 1 AdamW), deferred (0/1)}.
void BM_TrainStep(benchmark::State& st) {
  TrainRun run(st.range(0) == 1);
  const bool deferred = st.range(1) == 1;
  TrainBatch d;
  for (int i = 0; i < 3; ++i) deferred ? run.deferred_step(d.x, d.y) : run.step(d.x, d.y);
  for (auto _ : st) benchmark::DoNotOptimize((deferred ? run.deferred_step(d.x, d.y) : run.step(d.x, d.y)).raw_data());
}
BENCHMARK(BM_TrainStep)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond)->UseRealTime();

// The fixed cost of one flush: a reduction of a small real tensor read at once (cross_entropy's
// target range check does this twice per step), plain eager against a deferred recording of it.
void BM_SmallReadInterleaved(benchmark::State& st) {
  TrainBatch d;
  alternate(
      st, "eager", [&] { benchmark::DoNotOptimize(amax(d.y).item<int32_t>()); }, "defer",
      [&] {
        DeferredEager guard;
        benchmark::DoNotOptimize(amax(d.y).item<int32_t>());
      },
      "eager_over_defer");
}
BENCHMARK(BM_SmallReadInterleaved)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
