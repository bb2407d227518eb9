// Decode speed of the CausalLM family on the cpu: generate() of 32 greedy tokens after an
// 8-token prompt (one prefill, 31 decode steps through the KV cache), at batch 1 and 16, eager
// (cache narrowed to its filled part) and compiled (tpu::compile over the whole 64-position
// cache under a mask; the warm-up call compiles, the timed calls reuse it). Models (f32, random
// weights, tied head): 0 shaped like the fortunes example's earlier recipe (Llama layout, 3 layers, hidden 128,
// 4 query / 2 KV heads, vocab 257, 0.62M parameters), 1 a wider one (4 layers, hidden 512, 8 / 2
// heads, vocab 32000, 28.4M parameters), 2 a ~100M one (12 layers, hidden 768, MLP 2048, 12 / 4
// heads, vocab 32000, 100.2M parameters). bench/peer/bench_llm_torch runs the same models and
// loop in libtorch. Counters: tokens/s, generated tokens (all rows) per second of wall time;
// tokens/cpu_s, per second of process CPU time (all threads).
#include <benchmark/benchmark.h>
#include <time.h>

#include "tpucore/autograd.h"
#include "tpucore/models.h"

using namespace tpu;

namespace {

// CPU time of the whole process (every thread): on a host shared with other work, wall time
// also counts the waits for a core; tokens per CPU-second does not.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

models::ModelConfig shape(int which) {
  models::ModelConfig c;
  if (which == 0) {
    c.vocab_size = 257, c.hidden_size = 128, c.intermediate_size = 384, c.num_hidden_layers = 3;
    c.num_attention_heads = 4, c.num_key_value_heads = 2;
  } else if (which == 1) {
    c.vocab_size = 32000, c.hidden_size = 512, c.intermediate_size = 1536, c.num_hidden_layers = 4;
    c.num_attention_heads = 8, c.num_key_value_heads = 2;
  } else {
    c.vocab_size = 32000, c.hidden_size = 768, c.intermediate_size = 2048, c.num_hidden_layers = 12;
    c.num_attention_heads = 12, c.num_key_value_heads = 4;
  }
  c.tie_word_embeddings = true;
  return c;
}

void BM_decode(benchmark::State& st) {
  const int which = static_cast<int>(st.range(0));
  const int64_t batch = st.range(1);
  const bool compiled = st.range(2) != 0;
  Generator gen(1);
  models::CausalLM m(shape(which), &gen);
  m.eval();
  std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(batch), std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
  models::GenerationConfig g;
  g.max_new_tokens = 32;
  g.compile = compiled;
  models::generate(m, prompts, g);  // warm up (and compile)
  int64_t tokens = 0;
  const double cpu0 = process_cpu_seconds();
  for (auto _ : st) {
    auto out = models::generate(m, prompts, g);
    for (const auto& r : out) tokens += static_cast<int64_t>(r.size());
  }
  st.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  st.counters["tokens/cpu_s"] = static_cast<double>(tokens) / (process_cpu_seconds() - cpu0);
  st.SetLabel(fmt::format("{} params, batch {}, {}", m.num_parameters(), batch, compiled ? "compiled" : "eager"));
}

// The decode steps' products: linear of x [rows, K] with a weight [N, K] (f32). Up to 4 rows
// take the in-place dot-product kernel, up to 16 the in-place broadcast kernel
// (ops/cpu/kernels/gemv_avx512.cpp), 17 the packed GEMM. Counters: us_per_call_cpu, process CPU
// time per call (all threads); GB/s, weight bytes streamed per second of wall time. The second
// set is the ~100M model's shapes at batch 16 (MLP up/gate, down, attention, the tied head),
// then one 400 MB weight (the whole model's bytes in one product) at 1 and 16 rows, which shows
// the rate at which this host streams memory (1 row) against the broadcast kernel's (16 rows).
void BM_linear_rows(benchmark::State& st) {
  const int64_t rows = st.range(0), n = st.range(1), k = st.range(2);
  NoGradGuard ng;
  const Tensor x = randn({1, rows, k}), w = randn({n, k});
  Tensor y = linear(x, w);
  int64_t calls = 0;
  const double cpu0 = process_cpu_seconds();
  for (auto _ : st) {
    y = linear(x, w);
    ++calls;
  }
  st.counters["us_per_call_cpu"] = 1e6 * (process_cpu_seconds() - cpu0) / static_cast<double>(calls);
  st.counters["GB/s"] = benchmark::Counter(4e-9 * static_cast<double>(n * k), benchmark::Counter::kIsIterationInvariantRate);
}

// One decode step's attention of one layer of the ~100M model (12 query / 4 KV heads of 64): q
// [batch, 12, 1, 64] against the first `len` positions of a KV cache [batch, 4, len + 64, 64]
// (a narrowed view, as the eager cache hands it), under a keep mask [batch, 1, 1, len]; dtype
// 0 f32, 1 bf16. Counter: us_per_call_cpu, process CPU time per call (all threads).
void BM_decode_attention(benchmark::State& st) {
  const int64_t batch = st.range(0), len = st.range(1);
  const DType dt = st.range(2) == 1 ? DType::bf16 : DType::f32;
  NoGradGuard ng;
  const Tensor q = randn({batch, 12, 1, 64}).to(dt);
  const Tensor kc = randn({batch, 4, len + 64, 64}).to(dt), vc = randn({batch, 4, len + 64, 64}).to(dt);
  const Tensor k = narrow(kc, 2, 0, len), v = narrow(vc, 2, 0, len);
  const Tensor keep = gt(randn({batch, 1, 1, len}), -2.0);
  Tensor o = scaled_dot_product_attention(q, k, v, keep, false, 0.125);
  int64_t calls = 0;
  const double cpu0 = process_cpu_seconds();
  for (auto _ : st) {
    o = scaled_dot_product_attention(q, k, v, keep, false, 0.125);
    ++calls;
  }
  st.counters["us_per_call_cpu"] = 1e6 * (process_cpu_seconds() - cpu0) / static_cast<double>(calls);
  st.SetLabel(dt == DType::bf16 ? "bf16" : "f32");
}

}  // namespace

BENCHMARK(BM_decode_attention)->ArgsProduct({{1, 16}, {40, 1000}, {0, 1}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_linear_rows)->ArgsProduct({{1, 16, 17}, {512, 32000}, {512}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_linear_rows)
    ->Args({16, 2048, 768})
    ->Args({16, 768, 2048})
    ->Args({16, 768, 768})
    ->Args({16, 32000, 768})
    ->Args({1, 130000, 768})
    ->Args({16, 130000, 768})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

BENCHMARK(BM_decode)
    ->ArgsProduct({{0, 1, 2}, {1, 16}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(1.0);

BENCHMARK_MAIN();
