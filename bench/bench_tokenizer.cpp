// tpu::Tokenizer encoding speed on synthetic byte-level vocabularies (trained here by
// tpu::train_bpe_tokenizer): one long CJK piece (the BPE merge loop's cost in the piece length),
// English-like text with 0 or 256 added tokens (the added-token matcher's cost in their number),
// and plain text. Each iteration builds a fresh tokenizer (untimed) so the piece cache is cold.
#include <benchmark/benchmark.h>

#include <random>
#include <string>

#include "tpucore/tokenizer.h"

namespace {

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x800) {
    s += static_cast<char>(0xc0 | (c >> 6));
  } else {
    s += static_cast<char>(0xe0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
  }
  s += static_cast<char>(0x80 | (c & 0x3f));
  return s;
}

// n CJK characters from a 600-character range, Zipf-like (common ones repeat, so merges form).
std::string cjk_text(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s;
  for (size_t k = 0; k < n; ++k) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    s += utf8(static_cast<char32_t>(0x4e00 + static_cast<int>(600 * u * u * u)));
  }
  return s;
}

// English-like words from a few syllables, separated by spaces and punctuation.
std::string word_text(size_t bytes, uint32_t seed) {
  static const char* syl[] = {"the", "an", "ing", "er", "ti", "on", "re", "at", "ly", "co", "de", "st", "pro", "ex"};
  std::mt19937 rng(seed);
  std::string s;
  while (s.size() < bytes) {
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) s += syl[rng() % 14];
    s += rng() % 9 == 0 ? ", " : " ";
  }
  return s;
}

const std::string& cjk_tokenizer() {
  static const std::string j = [] {
    tpu::BpeTrainOptions o;
    o.vocab_size = 3000;
    o.pattern = "qwen2";
    std::vector<std::string> texts;
    for (uint32_t k = 0; k < 40; ++k) texts.push_back(cjk_text(500, k));
    return tpu::train_bpe_tokenizer(texts, o);
  }();
  return j;
}

std::string word_tokenizer(int added) {
  tpu::BpeTrainOptions o;
  o.vocab_size = 2000;
  o.pattern = "llama3";
  for (int k = 0; k < added; ++k) o.special_tokens.push_back("<|reserved_special_token_" + std::to_string(k) + "|>");
  return tpu::train_bpe_tokenizer({word_text(60000, 1)}, o);
}

void run(benchmark::State& state, const std::string& json, const std::string& text) {
  for (auto _ : state) {
    state.PauseTiming();
    const tpu::Tokenizer t = tpu::Tokenizer::from_json(json);
    state.ResumeTiming();
    benchmark::DoNotOptimize(t.encode(text));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

// One piece of state.range(0) CJK characters (the Qwen2 pattern keeps a letter run whole).
void BM_tokenizer_cjk_piece(benchmark::State& state) {
  run(state, cjk_tokenizer(), cjk_text(static_cast<size_t>(state.range(0)), 99));
}
BENCHMARK(BM_tokenizer_cjk_piece)->Arg(4096)->Arg(65536)->Unit(benchmark::kMillisecond);

// 64 KB of text with state.range(0) added tokens (Llama 3 has 256), none of them in the text.
void BM_tokenizer_added_tokens(benchmark::State& state) {
  static const std::string j0 = word_tokenizer(0), j256 = word_tokenizer(256);
  run(state, state.range(0) == 0 ? j0 : j256, word_text(65536, 7));
}
BENCHMARK(BM_tokenizer_added_tokens)->Arg(0)->Arg(256)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
