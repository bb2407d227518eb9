// Peer benchmark: the elementwise cases of bench_elementwise.cpp, ours and libtorch's in one
// run (libtorch under InferenceMode on two threads, the fair eager peer):
//   tiny `a + b` (1 and 64 floats, new output per call), add on 16M floats (GB/s of memory
//   traffic, against std::memcpy of 64 MiB in the same binary), eager relu(x * w + b) on 16M.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstring>
#include <vector>

#include "tpucore/ops.h"
#include "tpucore/core/parallel.h"

namespace {

constexpr int64_t k16M = int64_t{1} << 24;
constexpr int kThreads = 2;

void BM_ours_tiny_add(benchmark::State& state) {
  tpu::set_num_threads(kThreads);
  const int64_t n = state.range(0);
  const tpu::Tensor a = tpu::ones({n}), b = tpu::ones({n});
  for (auto _ : state) {
    tpu::Tensor c = a + b;
    benchmark::DoNotOptimize(c.raw_data());
  }
}
BENCHMARK(BM_ours_tiny_add)->Arg(1)->Arg(64);

void BM_torch_tiny_add(benchmark::State& state) {
  torch::set_num_threads(kThreads);
  c10::InferenceMode guard;
  const int64_t n = state.range(0);
  const torch::Tensor a = torch::ones({n}), b = torch::ones({n});
  for (auto _ : state) {
    torch::Tensor c = a + b;
    benchmark::DoNotOptimize(c.data_ptr<float>());
  }
}
BENCHMARK(BM_torch_tiny_add)->Arg(1)->Arg(64);

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

void BM_ours_add_16M(benchmark::State& state) {
  tpu::set_num_threads(kThreads);
  const tpu::Tensor a = tpu::rand({k16M}), b = tpu::rand({k16M});
  for (auto _ : state) {
    tpu::Tensor c = a + b;
    benchmark::DoNotOptimize(c.raw_data());
  }
  state.SetBytesProcessed(state.iterations() * k16M * 4 * 3);
}
BENCHMARK(BM_ours_add_16M)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_torch_add_16M(benchmark::State& state) {
  torch::set_num_threads(kThreads);
  c10::InferenceMode guard;
  const torch::Tensor a = torch::rand({k16M}), b = torch::rand({k16M});
  for (auto _ : state) {
    torch::Tensor c = a + b;
    benchmark::DoNotOptimize(c.data_ptr<float>());
  }
  state.SetBytesProcessed(state.iterations() * k16M * 4 * 3);
}
BENCHMARK(BM_torch_add_16M)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ours_relu_mul_add_16M(benchmark::State& state) {
  tpu::set_num_threads(kThreads);
  const tpu::Tensor x = tpu::randn({k16M}), w = tpu::randn({k16M}), b = tpu::randn({k16M});
  for (auto _ : state) {
    tpu::Tensor y = tpu::relu(x * w + b);
    benchmark::DoNotOptimize(y.raw_data());
  }
  state.SetBytesProcessed(state.iterations() * k16M * 4 * 8);
}
BENCHMARK(BM_ours_relu_mul_add_16M)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_torch_relu_mul_add_16M(benchmark::State& state) {
  torch::set_num_threads(kThreads);
  c10::InferenceMode guard;
  const torch::Tensor x = torch::randn({k16M}), w = torch::randn({k16M}), b = torch::randn({k16M});
  for (auto _ : state) {
    torch::Tensor y = torch::relu(x * w + b);
    benchmark::DoNotOptimize(y.data_ptr<float>());
  }
  state.SetBytesProcessed(state.iterations() * k16M * 4 * 8);
}
BENCHMARK(BM_torch_relu_mul_add_16M)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
