// The ops of a cpu decode step outside the weight products, at the shapes of bench_llama_cpp's
// model (hidden 768, MLP 2048, 12 query / 4 key-value heads of 64) for 1 and 16 rows: eager
// call cost of rms_norm, add, silu, mul, rotary_embedding on the projections' views, and decode
// attention over a cache of 40 positions under a keep mask (as generate() calls it).
//
//   bench_decode_ops --benchmark_filter=. [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <vector>

#include "ops/registry.h"
#include "tpucore/core/parallel.h"
#include "tpucore/ops.h"

namespace {
using namespace tpu;

void BM_rms_norm(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const Tensor x = randn({rows, 1, 768}), w = randn({768});
  for (auto _ : state) benchmark::DoNotOptimize(rms_norm(x, Shape{768}, w, 1e-6).raw_data());
}
BENCHMARK(BM_rms_norm)->Arg(1)->Arg(16);

void BM_add(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const Tensor x = randn({rows, 1, 768}), y = randn({rows, 1, 768});
  for (auto _ : state) benchmark::DoNotOptimize(add(x, y).raw_data());
}
BENCHMARK(BM_add)->Arg(1)->Arg(16);

void BM_silu_mul(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const Tensor g = randn({rows, 1, 2048}), u = randn({rows, 1, 2048});
  for (auto _ : state) benchmark::DoNotOptimize(mul(silu(g), u).raw_data());
}
BENCHMARK(BM_silu_mul)->Arg(1)->Arg(16);

void BM_silu(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const Tensor g = randn({rows, 1, 2048});
  for (auto _ : state) benchmark::DoNotOptimize(silu(g).raw_data());
}
BENCHMARK(BM_silu)->Arg(1)->Arg(16);

// q and k of the attention as its forward makes them: projections [B, 1, H * 64] seen as
// [B, H, 1, 64] (a transposed view), rotated by tables [B, 1, 1, 64].
void BM_rotary_qk(benchmark::State& state) {
  const int64_t b = state.range(0);
  const Tensor q = randn({b, 1, 768}), k = randn({b, 1, 256}), cos = randn({b, 1, 1, 64}), sin = randn({b, 1, 1, 64});
  for (auto _ : state) {
    const Tensor qh = transpose(reshape(q, Shape{b, 1, 12, 64}), 1, 2), kh = transpose(reshape(k, Shape{b, 1, 4, 64}), 1, 2);
    benchmark::DoNotOptimize(rotary_embedding(qh, cos, sin).raw_data());
    benchmark::DoNotOptimize(rotary_embedding(kh, cos, sin).raw_data());
  }
}
BENCHMARK(BM_rotary_qk)->Arg(1)->Arg(16);

void BM_decode_attention(benchmark::State& state) {
  const int64_t b = state.range(0), len = 40, cap = 40;
  const Tensor q = transpose(reshape(randn({b, 1, 768}), Shape{b, 1, 12, 64}), 1, 2);
  const Tensor k = narrow(randn({b, 4, cap, 64}), 2, 0, len), v = narrow(randn({b, 4, cap, 64}), 2, 0, len);
  const Tensor keep = full({b, 1, 1, len}, true, TensorOptions(DType::boolean));
  for (auto _ : state) benchmark::DoNotOptimize(scaled_dot_product_attention(q, k, v, keep, false, 0.125).raw_data());
}
BENCHMARK(BM_decode_attention)->Arg(1)->Arg(16);

// One call of the registry op `name` (skipped when the library has no such op).
void fused_call(benchmark::State& state, const char* name, std::vector<Tensor> in, ops::Attrs attrs = {}) {
  const ops::OpDef* op = ops::find_op(name);
  if (op == nullptr) {
    state.SkipWithError("op not in this library");
    return;
  }
  for (auto _ : state) {
    Tensor out[ops::kMaxOutputs];
    ops::call(*op, in, attrs, out);
    benchmark::DoNotOptimize(out[0].raw_data());
  }
}

void BM_fused_silu_mul(benchmark::State& state) {
  const int64_t rows = state.range(0);
  fused_call(state, "silu_mul", {randn({rows, 1, 2048}), randn({rows, 1, 2048})});
}
BENCHMARK(BM_fused_silu_mul)->Arg(1)->Arg(16);

void BM_add_then_rms_norm(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const Tensor x = randn({rows, 1, 768}), r = randn({rows, 1, 768}), w = randn({768});
  for (auto _ : state) {
    const Tensor h = add(x, r);
    benchmark::DoNotOptimize(rms_norm(h, Shape{768}, w, 1e-6).raw_data());
  }
}
BENCHMARK(BM_add_then_rms_norm)->Arg(1)->Arg(16);

void BM_fused_add_rms_norm(benchmark::State& state) {
  const int64_t rows = state.range(0);
  fused_call(state, "add_rms_norm", {randn({rows, 1, 768}), randn({rows, 1, 768}), randn({768})}, {{"eps", 1e-6}});
}
BENCHMARK(BM_fused_add_rms_norm)->Arg(1)->Arg(16);

void BM_fused_rotary_qk(benchmark::State& state) {
  const int64_t b = state.range(0);
  const Tensor q = randn({b, 1, 768}), k = randn({b, 1, 256});
  const Tensor qh = transpose(reshape(q, Shape{b, 1, 12, 64}), 1, 2), kh = transpose(reshape(k, Shape{b, 1, 4, 64}), 1, 2);
  fused_call(state, "rotary_embedding_qk", {qh, kh, randn({b, 1, 1, 64}), randn({b, 1, 1, 64})});
}
BENCHMARK(BM_fused_rotary_qk)->Arg(1)->Arg(16);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (const char* t = std::getenv("TPU_BENCH_THREADS")) tpu::set_num_threads(std::atoi(t));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
