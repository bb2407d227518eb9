// Decode speed of the CausalLM family on the cpu: generate() of 32 greedy tokens after an
// 8-token prompt (one prefill, 31 decode steps through the KV cache), at batch 1 and 16, eager
// (cache narrowed to its filled part) and compiled (tpu::compile over the whole 64-position
// cache under a mask; the warm-up call compiles, the timed calls reuse it). Model: random weights shaped like the
// fortunes example (Llama layout, 3 layers, hidden 128, 4 query / 2 KV heads, vocab 257) and a
// wider one (4 layers, hidden 512, 8 / 2 heads, vocab 32000, ~21M parameters with the head).
// Counter tokens/s: generated tokens (all rows) per second of wall time.
#include <benchmark/benchmark.h>

#include "tpucore/models.h"

using namespace tpu;

namespace {

models::ModelConfig shape(int which) {
  models::ModelConfig c;
  if (which == 0) {
    c.vocab_size = 257, c.hidden_size = 128, c.intermediate_size = 384, c.num_hidden_layers = 3;
    c.num_attention_heads = 4, c.num_key_value_heads = 2;
  } else {
    c.vocab_size = 32000, c.hidden_size = 512, c.intermediate_size = 1536, c.num_hidden_layers = 4;
    c.num_attention_heads = 8, c.num_key_value_heads = 2;
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
  for (auto _ : st) {
    auto out = models::generate(m, prompts, g);
    for (const auto& r : out) tokens += static_cast<int64_t>(r.size());
  }
  st.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  st.SetLabel(fmt::format("{} params, batch {}, {}", m.num_parameters(), batch, compiled ? "compiled" : "eager"));
}

}  // namespace

BENCHMARK(BM_decode)
    ->ArgsProduct({{0, 1}, {1, 16}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(1.0);

BENCHMARK_MAIN();
