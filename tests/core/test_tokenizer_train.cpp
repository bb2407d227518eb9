// BPE training (tpu::train_bpe_tokenizer) against a naive trainer written here (every round
// recounts all pairs over every piece occurrence, no deduplication, no incremental counts), a
// case worked out by hand, round trips through the written tokenizer.json, and bad options.
#include <catch2/catch.hpp>

#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/testing.h"
#include "tpucore/tokenizer.h"

using namespace tpu;
using tpu::testing::expect_error;
using json = nlohmann::json;

namespace {

// The merges a plain trainer learns: pieces from the pre-tokenizer of the tokenizer under test
// (its splitting is tested in test_tokenizer.cpp), byte ids 0..255, new ids by string.
std::vector<std::string> naive_merges(const Tokenizer& t, const std::vector<std::string>& texts, int64_t vocab,
                                      int64_t specials, int64_t min_frequency) {
  std::vector<std::vector<int64_t>> pieces;
  for (const auto& text : texts)
    for (const auto& p : t.pre_tokenize(text)) {
      std::vector<int64_t> ids;
      for (unsigned char c : p) ids.push_back(c);
      pieces.push_back(ids);
    }
  std::map<int64_t, std::string> name;  // raw bytes of each token
  std::map<std::string, int64_t> by_name;
  for (int b = 0; b < 256; ++b) {
    name[b] = std::string(1, static_cast<char>(b));
    by_name[name[b]] = b;
  }
  int64_t size = 256 + specials;
  std::vector<std::string> merges;
  std::map<std::pair<int64_t, int64_t>, bool> done;
  auto printable = [&](const std::string& raw) {
    std::string s;
    for (unsigned char c : raw) s += byte_to_unicode(c);
    return s;
  };
  while (size < vocab) {
    std::map<std::pair<int64_t, int64_t>, int64_t> count;
    for (const auto& p : pieces)
      for (size_t k = 0; k + 1 < p.size(); ++k) ++count[{p[k], p[k + 1]}];
    std::pair<int64_t, int64_t> best{-1, -1};
    int64_t best_n = 0;
    for (const auto& [pair, n] : count)  // ascending pairs: the first of the highest count wins
      if (n > best_n) best = pair, best_n = n;
    if (best_n < min_frequency) break;
    const std::string s = name[best.first] + name[best.second];
    int64_t id;
    if (by_name.count(s)) {
      id = by_name[s];
    } else {
      id = size++;
      name[id] = s;
      by_name[s] = id;
    }
    if (!done[best]) merges.push_back(printable(name[best.first]) + " " + printable(name[best.second]));
    done[best] = true;
    for (auto& p : pieces) {
      std::vector<int64_t> next;
      for (size_t k = 0; k < p.size(); ++k)
        if (k + 1 < p.size() && p[k] == best.first && p[k + 1] == best.second) next.push_back(id), ++k;
        else next.push_back(p[k]);
      p = next;
    }
  }
  return merges;
}

}  // namespace

TEST_CASE("bpe training: a case worked out by hand", "[tokenizer][bpe-train]") {
  // Pieces "ab", " ab", " ab", " cd": (a,b) is seen 3 times, then (' ', ab) twice.
  BpeTrainOptions o;
  o.vocab_size = 259;
  o.special_tokens = {"<|endoftext|>"};
  const std::string text = train_bpe_tokenizer({"ab ab ab cd"}, o);
  const json j = json::parse(text);
  CHECK(j["model"]["merges"] == json::array({"a b", byte_to_unicode(' ') + " ab"}));
  const Tokenizer t = Tokenizer::from_json(text);
  CHECK(t.vocab_size() == 259);
  CHECK(t.encode("ab ab") == std::vector<int64_t>{257, 258});
  CHECK(t.encode("<|endoftext|>ab cd") == std::vector<int64_t>{256, 257, 32, 99, 100});
  CHECK(t.is_special(256));
  CHECK(t.decode({256, 257, 258}, true) == "ab ab");
  // Past the two pairs seen twice or more, min_frequency 2 ends training early.
  o.vocab_size = 1000;
  CHECK(Tokenizer::from_json(train_bpe_tokenizer({"ab ab ab cd"}, o)).vocab_size() == 259);
  o.min_frequency = 1;  // then the pairs seen once: (' ', c) and (c, d) in the order of their ids
  const json all = json::parse(train_bpe_tokenizer({"ab ab ab cd"}, o));
  CHECK(all["model"]["merges"].size() == 4);
  CHECK(all["model"]["merges"][2] == byte_to_unicode(' ') + " c");
}

TEST_CASE("bpe training: merges equal a naive trainer's", "[tokenizer][bpe-train]") {
  std::mt19937 rng(11);
  const std::vector<std::string> syllables{"th", "e", "an", "d ", "qu", "ick", " ", "\n", "é", "日本", "42", "'s", "!", "ll", "o"};
  std::vector<std::string> texts;
  for (int t = 0; t < 40; ++t) {
    std::string s;
    const int n = 5 + static_cast<int>(rng() % 60);
    for (int k = 0; k < n; ++k) s += syllables[rng() % syllables.size()];
    texts.push_back(s);
  }
  texts.push_back("The quick brown fox jumps over the lazy dog. The dog sleeps; the fox doesn't.\n");
  for (const std::string pattern : {"gpt2", "llama3", "qwen2"}) {
    for (const int64_t vocab : {300, 420}) {
      BpeTrainOptions o;
      o.vocab_size = vocab;
      o.special_tokens = {"<|endoftext|>", "<|pad|>"};
      o.pattern = pattern;
      const std::string text = train_bpe_tokenizer(texts, o);
      const Tokenizer t = Tokenizer::from_json(text);
      const json j = json::parse(text);
      std::vector<std::string> got = j["model"]["merges"].get<std::vector<std::string>>();
      INFO(pattern << " vocab " << vocab);
      CHECK(got == naive_merges(t, texts, vocab, 2, 2));
      CHECK(t.vocab_size() <= vocab);
      CHECK(got.size() > 20);
      // The written tokenizer gives back every text byte for byte, in fewer tokens than bytes.
      size_t bytes = 0, tokens = 0;
      for (const auto& s : texts) {
        const auto ids = t.encode(s);
        CHECK(t.decode(ids) == s);
        bytes += s.size();
        tokens += ids.size();
      }
      CHECK(tokens * 2 < bytes);
    }
  }
}

TEST_CASE("bpe training: invalid UTF-8 and control bytes are trained and given back byte for byte",
          "[tokenizer][bpe-train]") {
  using namespace std::string_literals;  // ""s keeps the NUL bytes
  const std::vector<std::string> texts{"ab\xff\xfe ab\xff\xfe \x01\x02\x01\x02"s,
                                       "\xc3\x28\xc3\x28 \xe2\x82 \xe2\x82 \x00\x00\x00"s};
  CHECK(texts[0].size() == 14);
  CHECK(texts[1].size() == 14);
  BpeTrainOptions o;
  o.vocab_size = 300;
  o.min_frequency = 1;
  const std::string text = train_bpe_tokenizer(texts, o);
  const Tokenizer t = Tokenizer::from_json(text);
  CHECK(json::parse(text)["model"]["merges"].get<std::vector<std::string>>() == naive_merges(t, texts, 300, 0, 1));
  for (const auto& s : texts) CHECK(t.decode(t.encode(s)) == s);
}

TEST_CASE("bpe training: the llama3 pattern is written as a Split the loader reads back", "[tokenizer][bpe-train]") {
  BpeTrainOptions o;
  o.vocab_size = 260;
  o.pattern = "llama3";
  const Tokenizer t = Tokenizer::from_json(train_bpe_tokenizer({"Hello world12345 Hello"}, o));
  CHECK(t.pre_tokenize("Hello world12345") == std::vector<std::string>{"Hello", " world", "123", "45"});
}

TEST_CASE("bpe training: bad options are named errors", "[tokenizer][bpe-train][errors]") {
  BpeTrainOptions o;
  o.vocab_size = 200;
  expect_error([&] { train_bpe_tokenizer({"abc"}, o); }, {"vocab_size 200"});
  o.vocab_size = 257;
  o.special_tokens = {"<a>", "<b>"};
  expect_error([&] { train_bpe_tokenizer({"abc"}, o); }, {"258 at least"});
  o.vocab_size = 300;
  o.special_tokens = {"<a>", "<a>"};
  expect_error([&] { train_bpe_tokenizer({"abc"}, o); }, {"given twice"});
  o.special_tokens = {""};
  expect_error([&] { train_bpe_tokenizer({"abc"}, o); }, {"empty"});
  o.special_tokens = {};
  o.pattern = "bert";
  expect_error([&] { train_bpe_tokenizer({"abc"}, o); }, {"unknown pre-tokenizer pattern 'bert'"});
  o.pattern = "gpt2";
  o.min_frequency = 0;
  expect_error([&] { train_bpe_tokenizer({"abc"}, o); }, {"min_frequency"});
  o.min_frequency = 2;
  // No text at all: only bytes and specials.
  CHECK(Tokenizer::from_json(train_bpe_tokenizer({}, o)).vocab_size() == 256);
}
