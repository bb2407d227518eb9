// One training step of the Fashion-MNIST MLP (784-256-10, ReLU) at batch 128 on the cpu:
// forward, cross_entropy, backward, optimizer step. Same benchmark names as the libtorch peer
// (bench/peer/bench_train_torch.cpp: SGD lr 0.05, momentum 0.9) so the figures compare.
// The *_compiled variants run the same step as one graph through tpu::compile (lr an argument).
#include <benchmark/benchmark.h>

#include "tpucore/compile.h"
#include "tpucore/nn.h"

using namespace tpu;

namespace {

template <class MakeOpt>
void run_step(benchmark::State& state, MakeOpt make_opt, bool compiled = false) {
  const int64_t batch = state.range(0);
  Generator g(1);
  nn::MLP model({784, 256, 10}, "relu", 0.0, &g);
  auto opt = make_opt(model.parameters());
  Tensor x = rand({batch, 784}, {}, &g);
  Tensor y = randint(0, 10, {batch}, DType::i32, &g);
  auto body = [&](const Tensor& xb, const Tensor& yb, double lr) {
    opt->zero_grad();
    Tensor loss = nn::cross_entropy(model.forward(xb), yb);
    loss.backward();
    opt->set_lr(lr);
    opt->step();
    return loss.detach();
  };
  auto traced = compile(body, {.name = "bench_train_step"});
  const double lr = opt->lr();
  auto step = [&] { return compiled ? traced(x, y, lr) : body(x, y, lr); };
  for (int i = 0; i < 3; ++i) step();  // warm-up: allocator caches, optimizer buffers
  for (auto _ : state) {
    Tensor loss = step();
    benchmark::DoNotOptimize(loss.raw_data());
  }
  state.counters["samples/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_train_step(benchmark::State& state) {  // SGD with momentum
  run_step(state, [](std::vector<Tensor> p) {
    return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  });
}
void BM_train_step_adamw(benchmark::State& state) {
  run_step(state, [](std::vector<Tensor> p) { return std::make_unique<optim::AdamW>(std::move(p), optim::AdamWOptions{}); });
}
void BM_train_step_compiled(benchmark::State& state) {
  run_step(
      state,
      [](std::vector<Tensor> p) {
        return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
      },
      true);
}
void BM_train_step_adamw_compiled(benchmark::State& state) {
  run_step(
      state, [](std::vector<Tensor> p) { return std::make_unique<optim::AdamW>(std::move(p), optim::AdamWOptions{}); },
      true);
}
void BM_forward_backward(benchmark::State& state) {  // without the optimizer
  const int64_t batch = state.range(0);
  Generator g(1);
  nn::MLP model({784, 256, 10}, "relu", 0.0, &g);
  Tensor x = rand({batch, 784}, {}, &g);
  Tensor y = randint(0, 10, {batch}, DType::i32, &g);
  for (auto _ : state) {
    model.zero_grad();
    Tensor loss = nn::cross_entropy(model.forward(x), y);
    loss.backward();
    benchmark::DoNotOptimize(loss.raw_data());
  }
  state.counters["samples/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_train_step)->Arg(128)->Arg(256)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_train_step_adamw)->Arg(128)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_train_step_compiled)->Arg(128)->Arg(256)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_train_step_adamw_compiled)->Arg(128)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_forward_backward)->Arg(128)->Unit(benchmark::kMicrosecond)->UseRealTime();

BENCHMARK_MAIN();
