// Elementwise benchmarks: eager overhead of a tiny `a + b` (1 and 64 floats, new output each
// call), bandwidth of `add` on 16M floats against std::memcpy of 64 MiB in the same binary,
// and the eager chain relu(x * w + b) on 16M floats (three ops, three fresh outputs).
//
// Bytes counters count memory traffic (bytes read + bytes written): add moves 3 x 64 MiB per
// call, memcpy 2 x 64 MiB, so their GB/s figures are directly comparable. cpu_ms_all_threads
// is the process CPU time per call (all threads): the fair figure on a shared machine.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <cstring>
#include <vector>

#include "tpucore/core/allocator.h"
#include "tpucore/ops.h"

namespace {

constexpr int64_t k16M = int64_t{1} << 24;

double process_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-3;
}
void set_cpu_ms(benchmark::State& state, double c0) {
  state.counters["cpu_ms_all_threads"] = (process_cpu_ms() - c0) / static_cast<double>(state.iterations());
}

void BM_tiny_add(benchmark::State& state) {
  const int64_t n = state.range(0);
  const tpu::Tensor a = tpu::ones({n}), b = tpu::ones({n});
  for (auto _ : state) {
    tpu::Tensor c = a + b;
    benchmark::DoNotOptimize(c.raw_data());
  }
}
BENCHMARK(BM_tiny_add)->Arg(1)->Arg(64);

void BM_add_16M(benchmark::State& state) {
  const tpu::Tensor a = tpu::rand({k16M}), b = tpu::rand({k16M});
  for (auto _ : state) {
    tpu::Tensor c = a + b;
    benchmark::DoNotOptimize(c.raw_data());
  }
  state.SetBytesProcessed(state.iterations() * k16M * 4 * 3);
}
BENCHMARK(BM_add_16M)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_memcpy_64MiB(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(k16M) * 4;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes) * 2);
}
BENCHMARK(BM_memcpy_64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_relu_mul_add_16M(benchmark::State& state) {
  const tpu::Tensor x = tpu::randn({k16M}), w = tpu::randn({k16M}), b = tpu::randn({k16M});
  const double c0 = process_cpu_ms();
  for (auto _ : state) {
    tpu::Tensor y = tpu::relu(x * w + b);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_cpu_ms(state, c0);
  // x, w read + t1 write; t1, b read + t2 write; t2 read + y write.
  state.SetBytesProcessed(state.iterations() * k16M * 4 * 8);
}
BENCHMARK(BM_relu_mul_add_16M)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_unary_16M(benchmark::State& state) {
  const tpu::Tensor x = tpu::randn({k16M});
  const int which = static_cast<int>(state.range(0));
  const double c0 = process_cpu_ms();
  for (auto _ : state) {
    tpu::Tensor y = which == 0 ? tpu::exp(x) : which == 1 ? tpu::tanh(x) : which == 2 ? tpu::gelu(x) : tpu::sigmoid(x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_cpu_ms(state, c0);
  state.SetLabel(which == 0 ? "exp" : which == 1 ? "tanh" : which == 2 ? "gelu" : "sigmoid");
  state.SetBytesProcessed(state.iterations() * k16M * 4 * 2);
}
BENCHMARK(BM_unary_16M)->DenseRange(0, 3)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
