// Indexing and joining throughput: embedding, index_select, gather, cat, stack, tril, with a
// memcpy of the same output size as the machine's baseline. Bytes counted are output bytes
// written plus the bytes read to make them.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "tpucore/ops.h"

using namespace tpu;

namespace {

constexpr int64_t kVocab = 50000, kDim = 512, kTokens = 16384;

void BM_Memcpy32MB(benchmark::State& st) {
  const size_t n = static_cast<size_t>(kTokens * kDim) * sizeof(float);
  std::vector<char> a(n, 1), b(n, 0);
  for (auto _ : st) {
    std::memcpy(b.data(), a.data(), n);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * static_cast<int64_t>(2 * n));
}
BENCHMARK(BM_Memcpy32MB)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Embedding(benchmark::State& st) {
  Tensor w = randn({kVocab, kDim});
  Tensor ids = randint(0, kVocab, {kTokens});
  for (auto _ : st) benchmark::DoNotOptimize(embedding(w, ids));
  st.SetBytesProcessed(st.iterations() * kTokens * kDim * 8);
}
BENCHMARK(BM_Embedding)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_IndexSelectRows(benchmark::State& st) {
  Tensor w = randn({kVocab, kDim});
  Tensor ids = randint(0, kVocab, {kTokens});
  for (auto _ : st) benchmark::DoNotOptimize(index_select(w, 0, ids));
  st.SetBytesProcessed(st.iterations() * kTokens * kDim * 8);
}
BENCHMARK(BM_IndexSelectRows)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_IndexSelectCols(benchmark::State& st) {
  Tensor x = randn({4096, 2048});
  Tensor ids = randint(0, 2048, {1024});
  for (auto _ : st) benchmark::DoNotOptimize(index_select(x, 1, ids));
  st.SetBytesProcessed(st.iterations() * 4096 * 1024 * 8);
}
BENCHMARK(BM_IndexSelectCols)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Gather(benchmark::State& st) {
  Tensor x = randn({4096, 4096});
  Tensor idx = randint(0, 4096, {4096, 2048});
  for (auto _ : st) benchmark::DoNotOptimize(gather(x, 1, idx));
  st.SetBytesProcessed(st.iterations() * 4096 * 2048 * 12);  // index + value read, value written
}
BENCHMARK(BM_Gather)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CatDim0(benchmark::State& st) {
  Tensor a = randn({2048, 2048}), b = randn({2048, 2048});
  for (auto _ : st) benchmark::DoNotOptimize(cat({a, b}, 0));
  st.SetBytesProcessed(st.iterations() * 2 * 4096 * 2048 * 4);
}
BENCHMARK(BM_CatDim0)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CatDim1(benchmark::State& st) {
  Tensor a = randn({4096, 1024}), b = randn({4096, 1024});
  for (auto _ : st) benchmark::DoNotOptimize(cat({a, b}, 1));
  st.SetBytesProcessed(st.iterations() * 2 * 4096 * 2048 * 4);
}
BENCHMARK(BM_CatDim1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CatManySmall(benchmark::State& st) {
  std::vector<Tensor> xs;
  for (int i = 0; i < 64; ++i) xs.push_back(randn({128, 1024}));
  for (auto _ : st) benchmark::DoNotOptimize(cat(xs, 0));
  st.SetBytesProcessed(st.iterations() * 2 * 64 * 128 * 1024 * 4);
}
BENCHMARK(BM_CatManySmall)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_StackDim1(benchmark::State& st) {
  std::vector<Tensor> xs;
  for (int i = 0; i < 8; ++i) xs.push_back(randn({1024, 1024}));
  for (auto _ : st) benchmark::DoNotOptimize(stack(xs, 1));
  st.SetBytesProcessed(st.iterations() * 2 * 8 * 1024 * 1024 * 4);
}
BENCHMARK(BM_StackDim1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Tril(benchmark::State& st) {
  Tensor x = randn({4096, 4096});
  for (auto _ : st) benchmark::DoNotOptimize(tril(x));
  st.SetBytesProcessed(st.iterations() * 4096 * 4096 * 6);  // half read, all written
}
BENCHMARK(BM_Tril)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CatTiny(benchmark::State& st) {
  Tensor a = randn({4}), b = randn({4});
  for (auto _ : st) benchmark::DoNotOptimize(cat({a, b}, 0));
}
BENCHMARK(BM_CatTiny);

void BM_EmbeddingTiny(benchmark::State& st) {
  Tensor w = randn({16, 8});
  Tensor ids = randint(0, 16, {4});
  for (auto _ : st) benchmark::DoNotOptimize(embedding(w, ids));
}
BENCHMARK(BM_EmbeddingTiny);

}  // namespace

BENCHMARK_MAIN();
