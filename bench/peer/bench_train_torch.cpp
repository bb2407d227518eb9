// Peer benchmark: one training step of the Fashion-MNIST MLP (784-256-10, ReLU) in libtorch:
// forward, cross_entropy, backward, SGD step (lr 0.05, momentum 0.9), two threads. Run it next
// to bench_train and compare the samples/s of the benchmarks with the same names.
// libtorch's set_num_threads sets its OpenMP pool only; Debian's libtorch runs its matmuls in
// whatever libblas.so.3 is (OpenBLAS after scripts/bench.sh), whose own pool is sized by
// OPENBLAS_NUM_THREADS (default: all cores). Measure it both ways and report the better.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

namespace {

void BM_train_step(benchmark::State& st) {
  torch::set_num_threads(2);
  torch::manual_seed(0);
  const int64_t batch = st.range(0);
  torch::nn::Sequential model(torch::nn::Linear(784, 256), torch::nn::ReLU(), torch::nn::Linear(256, 10));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  // Inputs as the DataLoader hands them over: f32 pixels in [0, 1], flattened; i64 class ids.
  const torch::Tensor x = torch::rand({batch, 784});
  const torch::Tensor y = torch::randint(0, 10, {batch}, torch::kLong);
  for (int i = 0; i < 3; ++i) {  // warm-up: allocator caches, momentum buffers
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    opt.step();
  }
  for (auto _ : st) {
    opt.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    opt.step();
    benchmark::DoNotOptimize(loss.data_ptr());
  }
  st.counters["samples/s"] = benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_train_step)->Arg(128)->Arg(256)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
