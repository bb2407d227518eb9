// Peer benchmark: libtorch's indexing and joining ops on the same shapes as bench_index
// (embedding, index_select, gather, cat, stack, tril), two threads, InferenceMode. Run it
// next to bench_index and compare the bytes/s of the benchmarks with the same names.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <vector>

namespace {

constexpr int64_t kVocab = 50000, kDim = 512, kTokens = 16384;

struct Setup {
  Setup() { torch::set_num_threads(2); }
};
const Setup setup;

void BM_Embedding(benchmark::State& st) {
  torch::InferenceMode g;
  auto w = torch::randn({kVocab, kDim});
  auto ids = torch::randint(0, kVocab, {kTokens}, torch::kInt64);
  for (auto _ : st) benchmark::DoNotOptimize(torch::embedding(w, ids));
  st.SetBytesProcessed(st.iterations() * kTokens * kDim * 8);
}
BENCHMARK(BM_Embedding)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_IndexSelectRows(benchmark::State& st) {
  torch::InferenceMode g;
  auto w = torch::randn({kVocab, kDim});
  auto ids = torch::randint(0, kVocab, {kTokens}, torch::kInt32);
  for (auto _ : st) benchmark::DoNotOptimize(torch::index_select(w, 0, ids));
  st.SetBytesProcessed(st.iterations() * kTokens * kDim * 8);
}
BENCHMARK(BM_IndexSelectRows)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_IndexSelectCols(benchmark::State& st) {
  torch::InferenceMode g;
  auto x = torch::randn({4096, 2048});
  auto ids = torch::randint(0, 2048, {1024}, torch::kInt32);
  for (auto _ : st) benchmark::DoNotOptimize(torch::index_select(x, 1, ids));
  st.SetBytesProcessed(st.iterations() * 4096 * 1024 * 8);
}
BENCHMARK(BM_IndexSelectCols)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Gather(benchmark::State& st) {
  torch::InferenceMode g;
  auto x = torch::randn({4096, 4096});
  auto idx = torch::randint(0, 4096, {4096, 2048}, torch::kInt64);
  for (auto _ : st) benchmark::DoNotOptimize(torch::gather(x, 1, idx));
  st.SetBytesProcessed(st.iterations() * 4096 * 2048 * 12);
}
BENCHMARK(BM_Gather)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CatDim0(benchmark::State& st) {
  torch::InferenceMode g;
  auto a = torch::randn({2048, 2048}), b = torch::randn({2048, 2048});
  for (auto _ : st) benchmark::DoNotOptimize(torch::cat({a, b}, 0));
  st.SetBytesProcessed(st.iterations() * 2 * 4096 * 2048 * 4);
}
BENCHMARK(BM_CatDim0)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CatDim1(benchmark::State& st) {
  torch::InferenceMode g;
  auto a = torch::randn({4096, 1024}), b = torch::randn({4096, 1024});
  for (auto _ : st) benchmark::DoNotOptimize(torch::cat({a, b}, 1));
  st.SetBytesProcessed(st.iterations() * 2 * 4096 * 2048 * 4);
}
BENCHMARK(BM_CatDim1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CatManySmall(benchmark::State& st) {
  torch::InferenceMode g;
  std::vector<torch::Tensor> xs;
  for (int i = 0; i < 64; ++i) xs.push_back(torch::randn({128, 1024}));
  for (auto _ : st) benchmark::DoNotOptimize(torch::cat(xs, 0));
  st.SetBytesProcessed(st.iterations() * 2 * 64 * 128 * 1024 * 4);
}
BENCHMARK(BM_CatManySmall)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_StackDim1(benchmark::State& st) {
  torch::InferenceMode g;
  std::vector<torch::Tensor> xs;
  for (int i = 0; i < 8; ++i) xs.push_back(torch::randn({1024, 1024}));
  for (auto _ : st) benchmark::DoNotOptimize(torch::stack(xs, 1));
  st.SetBytesProcessed(st.iterations() * 2 * 8 * 1024 * 1024 * 4);
}
BENCHMARK(BM_StackDim1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Tril(benchmark::State& st) {
  torch::InferenceMode g;
  auto x = torch::randn({4096, 4096});
  for (auto _ : st) benchmark::DoNotOptimize(torch::tril(x));
  st.SetBytesProcessed(st.iterations() * 4096 * 4096 * 6);
}
BENCHMARK(BM_Tril)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CatTiny(benchmark::State& st) {
  torch::InferenceMode g;
  auto a = torch::randn({4}), b = torch::randn({4});
  for (auto _ : st) benchmark::DoNotOptimize(torch::cat({a, b}, 0));
}
BENCHMARK(BM_CatTiny);

void BM_EmbeddingTiny(benchmark::State& st) {
  torch::InferenceMode g;
  auto w = torch::randn({16, 8});
  auto ids = torch::randint(0, 16, {4}, torch::kInt64);
  for (auto _ : st) benchmark::DoNotOptimize(torch::embedding(w, ids));
}
BENCHMARK(BM_EmbeddingTiny);

}  // namespace

BENCHMARK_MAIN();
