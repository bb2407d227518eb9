// Generation: greedy decoding through the KV cache equals argmax over full forwards recomputed
// from scratch each step (no cache) and over the naive reference model; batched left-padded
// prompts equal one prompt at a time; stop tokens, max_length, streaming; the sampling rules
// (repetition penalty, temperature, top-k, top-p) against probabilities computed by hand.
#include <catch2/catch.hpp>

#include <map>

#include "core/llm_reference.h"
#include "core/testing.h"
#include "tpucore/compile.h"
#include "tpucore/models.h"

using namespace tpu;
using namespace tpu::testing::llm;
using tpu::testing::expect_error;
using V = std::vector<int64_t>;

namespace {

struct Loaded {
  TinyCfg cfg;
  Weights w;
  std::shared_ptr<models::CausalLM> m;
};
Loaded tiny(uint32_t seed) {
  Loaded l;
  l.cfg.model_type = "qwen3";
  l.cfg.qk_norm = true;
  auto dir = temp_dir("gen");
  l.w = write_tiny_model(dir, l.cfg, DType::f32, 1, seed);
  l.m = models::load_causal_lm(dir.string());
  std::filesystem::remove_all(dir);
  return l;
}

int64_t argmax_of(const std::vector<double>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); }

}  // namespace

TEST_CASE("generate: greedy with the cache equals argmax of full recomputation and of the reference", "[llm][generate]") {
  Loaded l = tiny(11);
  const V prompt{3, 14, 15, 9, 2};
  models::GenerationConfig g;
  g.max_new_tokens = 8;
  V got = models::generate(*l.m, {prompt}, g)[0];
  REQUIRE(got.size() == 8);
  V seq = prompt, seq_ref = prompt;
  for (int i = 0; i < 8; ++i) {
    Tensor logits = l.m->forward(from_vector(seq, Shape{1, static_cast<int64_t>(seq.size())}, DType::i64));
    Tensor last = select(select(logits, 0, 0), 0, logits.size(1) - 1);
    seq.push_back(argmax(last).item<int64_t>());
    std::vector<int64_t> pos(seq_ref.size());
    for (size_t k = 0; k < pos.size(); ++k) pos[k] = static_cast<int64_t>(k);
    seq_ref.push_back(argmax_of(ref_forward(l.cfg, l.w, seq_ref, pos).back()));
  }
  CHECK(got == V(seq.begin() + 5, seq.end()));
  CHECK(got == V(seq_ref.begin() + 5, seq_ref.end()));
}

TEST_CASE("generate: batched left-padded prompts equal one prompt at a time", "[llm][generate]") {
  Loaded l = tiny(12);
  const std::vector<V> prompts{{5}, {1, 2, 3, 4, 5, 6}, {30, 31, 7}};
  models::GenerationConfig g;
  g.max_new_tokens = 6;
  auto batched = models::generate(*l.m, prompts, g);
  for (size_t r = 0; r < prompts.size(); ++r) CHECK(batched[r] == models::generate(*l.m, {prompts[r]}, g)[0]);
  // Sampled with a seed: the same seed repeats, batched or not the draws are per step.
  g.do_sample = true;
  g.temperature = 0.8;
  g.seed = 42;
  CHECK(models::generate(*l.m, prompts, g) == models::generate(*l.m, prompts, g));
}

TEST_CASE("generate: stop tokens, max_length and the streaming callback", "[llm][generate]") {
  Loaded l = tiny(13);
  models::GenerationConfig g;
  g.max_new_tokens = 10;
  const V prompt{7, 8, 9};
  V full = models::generate(*l.m, {prompt}, g)[0];
  REQUIRE(full.size() == 10);
  g.stop_tokens = {full[3]};
  V stopped = models::generate(*l.m, {prompt}, g)[0];
  const auto first = std::find(full.begin(), full.end(), full[3]) - full.begin();
  CHECK(stopped == V(full.begin(), full.begin() + first + 1));  // the stop token is kept
  g.stop_tokens.clear();
  g.max_length = 5;  // 3 prompt tokens + 2
  CHECK(models::generate(*l.m, {prompt}, g)[0] == V(full.begin(), full.begin() + 2));
  g.max_length = 0;
  std::vector<std::pair<size_t, int64_t>> streamed;
  auto res = models::generate(*l.m, {prompt, {1, 2}}, g, [&](size_t r, int64_t t) {
    streamed.emplace_back(r, t);
    return !(r == 1 && streamed.size() >= 6);  // stop row 1 after a few tokens
  });
  V row0, row1;
  for (auto [r, t] : streamed) (r == 0 ? row0 : row1).push_back(t);
  CHECK(row0 == res[0]);
  CHECK(row1 == res[1]);
  CHECK(res[0] == full);
  CHECK(res[1].size() < 10);
}

TEST_CASE("generate: sampling rules against hand-computed probabilities", "[llm][generate]") {
  const std::vector<float> logits{2.0f, 1.0f, 0.5f, -1.0f, 3.0f};
  auto freq = [&](models::GenerationConfig g, const V& hist, int n) {
    std::mt19937_64 rng(g.seed);
    std::map<int64_t, double> f;
    for (int i = 0; i < n; ++i) f[models::choose_token(logits, hist, g, rng)] += 1.0 / n;
    return f;
  };
  models::GenerationConfig g;
  std::mt19937_64 rng(1);
  CHECK(models::choose_token(logits, {}, g, rng) == 4);  // greedy
  // Repetition penalty 4 on token 4 (3 -> 0.75) and 3 (-1 -> -4): greedy picks token 0.
  g.repetition_penalty = 4.0;
  CHECK(models::choose_token(logits, {4, 3, 4}, g, rng) == 0);
  g = {};
  g.do_sample = true;
  g.seed = 5;
  g.temperature = 0.5;
  g.top_k = 3;  // tokens 4, 0, 1 with logits 3, 2, 1 at T 0.5: weights e^6, e^4, e^2
  const int n = 20000;
  auto f = freq(g, {}, n);
  const double z = std::exp(6.0) + std::exp(4.0) + std::exp(2.0);
  CHECK(f.size() == 3);
  CHECK(f[4] == Approx(std::exp(6.0) / z).margin(0.01));
  CHECK(f[0] == Approx(std::exp(4.0) / z).margin(0.01));
  CHECK(f[1] == Approx(std::exp(2.0) / z).margin(0.01));
  // top_p 0.9 at T 1: probabilities of 4, 0, 1, 2, 3 are e^3, e^2, e^1, e^0.5, e^-1 over their sum;
  // 4 and 0 hold ~0.84 < 0.9, so 1 joins; the three are renormalised.
  g.temperature = 1.0;
  g.top_k = 0;
  g.top_p = 0.9;
  f = freq(g, {}, n);
  const double z3 = std::exp(3.0) + std::exp(2.0) + std::exp(1.0);
  CHECK(f.size() == 3);
  CHECK(f[4] == Approx(std::exp(3.0) / z3).margin(0.01));
  CHECK(f[1] == Approx(std::exp(1.0) / z3).margin(0.01));
  // Errors.
  Loaded l = tiny(14);
  models::GenerationConfig bad;
  bad.do_sample = true;
  bad.temperature = 0;
  expect_error([&] { models::generate(*l.m, {{1}}, bad); }, {"temperature"});
  expect_error([&] { models::generate(*l.m, {{1, 99}}); }, {"prompt 0", "99"});
  expect_error([&] { models::generate(*l.m, {{}}); }, {"prompt 0 is empty"});
}

TEST_CASE("generate: compiled decode compiles once over 200 steps and matches eager", "[llm][generate][jit]") {
  Loaded l = tiny(15);
  models::GenerationConfig g;
  g.max_new_tokens = 201;  // one token from the prefill, then 200 decode steps
  g.compile = true;
  g.compile_name = "test_llm_decode_200";
  const std::vector<V> prompts{{1, 2, 3}, {4, 5}};
  auto compiled = models::generate(*l.m, prompts, g);
  const jit::Stats stats = jit::stats();  // a snapshot: keep it while reading it
  const jit::FunctionStats* s = stats.find("test_llm_decode_200");
  REQUIRE(s != nullptr);
  CHECK(s->compiles == 1);
  CHECK(s->hits == 199);
  CHECK(s->breaks == 0);
  // A second call of the same batch size reuses the compiled step (and its cache).
  const std::vector<V> others{{9, 8, 7, 6}, {5}};
  auto again = models::generate(*l.m, others, g);
  const jit::Stats stats_again = jit::stats();
  s = stats_again.find("test_llm_decode_200");
  REQUIRE(s != nullptr);
  CHECK(s->compiles == 1);
  CHECK(s->hits == 399);
  g.compile = false;
  CHECK(models::generate(*l.m, prompts, g) == compiled);
  CHECK(models::generate(*l.m, others, g) == again);
}

TEST_CASE("generate: compiled decode buckets batch sizes (3 and 4 prompts share one compile)", "[llm][generate][jit]") {
  Loaded l = tiny(16);
  models::GenerationConfig g;
  g.max_new_tokens = 6;
  g.compile = true;
  g.compile_name = "test_llm_decode_buckets";
  auto compiles = [] {  // over every compiled step of that name (one per batch bucket)
    const jit::Stats st = jit::stats();
    int64_t n = 0;
    for (const jit::FunctionStats& f : st.functions)
      if (f.name == "test_llm_decode_buckets") n += f.compiles;
    return n;
  };
  const std::vector<V> three{{1, 2, 3}, {4, 5}, {6}}, four{{7}, {8, 9}, {10, 11, 12}, {2, 2}}, two{{3, 1}, {5}};
  auto c3 = models::generate(*l.m, three, g);
  CHECK(compiles() == 1);
  auto c4 = models::generate(*l.m, four, g);  // bucket 4 again: no new compile
  CHECK(compiles() == 1);
  auto c2 = models::generate(*l.m, two, g);  // bucket 2: its own step
  CHECK(compiles() == 2);
  auto c3b = models::generate(*l.m, three, g);
  CHECK(compiles() == 2);
  // Padding rows are never reported and do not change the real rows: one prompt at a time,
  // eager, gives the same tokens.
  REQUIRE(c3.size() == 3);
  CHECK(c3b == c3);
  g.compile = false;
  for (size_t r = 0; r < three.size(); ++r) CHECK(models::generate(*l.m, {three[r]}, g)[0] == c3[r]);
  for (size_t r = 0; r < four.size(); ++r) CHECK(models::generate(*l.m, {four[r]}, g)[0] == c4[r]);
  for (size_t r = 0; r < two.size(); ++r) CHECK(models::generate(*l.m, {two[r]}, g)[0] == c2[r]);
  models::GenerationConfig bad;
  bad.pad_token_id = 1000;
  expect_error([&] { models::generate(*l.m, {{1}}, bad); }, {"pad_token_id 1000"});
}
