// The serving engine's per-request semantics against independent references: log-probabilities
// equal log_softmax of the double-precision reference forward (tests/core/llm_reference.h);
// OpenAI's frequency / presence penalties and logit bias equal a hand-written greedy loop over
// the reference logits; stop strings end generation at the token that completes them;
// min_tokens masks stop tokens.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/llm_reference.h"
#include "tpucore/models.h"
#include "tpucore/serve/engine.h"

using namespace tpu;
namespace llm = tpu::testing::llm;
using V = std::vector<int64_t>;

namespace {

struct Tiny {
  llm::TinyCfg cfg;
  llm::Weights w;
  std::shared_ptr<models::CausalLM> model;
  explicit Tiny(uint32_t seed) {
    cfg.vocab = 53;
    auto dir = llm::temp_dir("serve_sampling");
    w = llm::write_tiny_model(dir, cfg, DType::f32, 1, seed);
    model = models::load_causal_lm(dir.string());
    std::filesystem::remove_all(dir);
  }
  // Reference logits of the next token after `ids`.
  std::vector<double> next_logits(const V& ids) {
    V pos(ids.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>(i);
    return llm::ref_forward(cfg, w, ids, pos).back();
  }
};

serve::EngineConfig small_engine() {
  serve::EngineConfig c;
  c.block_size = 4;
  c.max_model_len = 64;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 16;
  return c;
}

struct Out {
  std::vector<serve::TokenOutput> outs;
  serve::FinishReason why = serve::FinishReason::cancelled;
  V tokens() const {
    V t;
    for (const auto& o : outs) t.push_back(o.token);
    return t;
  }
};

// Runs requests (prompt, params) together until idle (bounded).
std::vector<Out> run(serve::Engine& e, const std::vector<std::pair<V, serve::SamplingParams>>& reqs) {
  std::vector<Out> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    serve::RequestCallbacks cb;
    cb.on_output = [&out, i](const serve::TokenOutput& o) {
      out[i].outs.push_back(o);
      return true;
    };
    cb.on_finish = [&out, i](serve::FinishReason r) { out[i].why = r; };
    e.add_request(reqs[i].first, reqs[i].second, cb);
  }
  for (int k = 0; k < 1000 && e.has_work(); ++k) e.step();
  REQUIRE_FALSE(e.has_work());
  return out;
}

double log_sum_exp(const std::vector<double>& x) {
  double m = -INFINITY, z = 0;
  for (double v : x) m = std::max(m, v);
  for (double v : x) z += std::exp(v - m);
  return m + std::log(z);
}

}  // namespace

TEST_CASE("serve sampling: logprobs are log_softmax of the model's logits", "[serve][sampling]") {
  Tiny t(11);
  serve::Engine e(t.model, small_engine());
  const V prompt{5, 9, 14, 2, 30};
  serve::SamplingParams greedy;
  greedy.max_tokens = 6;
  greedy.logprobs = 3;
  serve::SamplingParams sampled = greedy;
  sampled.temperature = 1.3;  // log-probabilities stay those of the raw logits
  sampled.seed = 4;
  const auto out = run(e, {{prompt, greedy}, {prompt, sampled}});
  for (const Out& o : out) {
    REQUIRE(o.outs.size() == 6);
    V seq = prompt;
    for (const auto& tok : o.outs) {
      const std::vector<double> l = t.next_logits(seq);
      const double lse = log_sum_exp(l);
      CHECK(std::abs(tok.logprob - (l[static_cast<size_t>(tok.token)] - lse)) < 1e-4);
      // The 3 most likely tokens by the reference, best first.
      V ids(l.size());
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
      std::sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return l[size_t(a)] > l[size_t(b)]; });
      REQUIRE(tok.top.size() == 3);
      for (size_t k = 0; k < 3; ++k) {
        CHECK(tok.top[k].first == ids[k]);
        CHECK(std::abs(tok.top[k].second - (l[static_cast<size_t>(ids[k])] - lse)) < 1e-4);
      }
      seq.push_back(tok.token);
    }
  }
  // Greedy picks the reference's argmax each step, so its top-1 is the chosen token.
  for (const auto& tok : out[0].outs) CHECK(tok.top[0].first == tok.token);

  // The prompt's log-probabilities, delivered before the first token.
  std::vector<serve::TokenOutput> prompt_lp;
  int64_t tokens_before = -1, tokens_seen = 0;
  serve::SamplingParams pp = greedy;
  pp.prompt_logprobs = 2;
  serve::RequestCallbacks cb;
  cb.on_prompt_logprobs = [&](const std::vector<serve::TokenOutput>& v) {
    prompt_lp = v;
    tokens_before = tokens_seen;
  };
  cb.on_token = [&](int64_t) { return ++tokens_seen > 0; };
  e.add_request(prompt, pp, cb);
  for (int k = 0; k < 1000 && e.has_work(); ++k) e.step();
  CHECK(tokens_before == 0);
  REQUIRE(prompt_lp.size() == prompt.size() - 1);
  const auto ref = llm::ref_forward(t.cfg, t.w, prompt, {0, 1, 2, 3, 4});
  for (size_t i = 1; i < prompt.size(); ++i) {
    const double lse = log_sum_exp(ref[i - 1]);
    CHECK(prompt_lp[i - 1].token == prompt[i]);
    CHECK(std::abs(prompt_lp[i - 1].logprob - (ref[i - 1][static_cast<size_t>(prompt[i])] - lse)) < 1e-4);
    REQUIRE(prompt_lp[i - 1].top.size() == 2);
    CHECK(prompt_lp[i - 1].top[0].second >= prompt_lp[i - 1].top[1].second);
  }
}

TEST_CASE("serve sampling: frequency / presence penalties and logit bias follow OpenAI's formula", "[serve][sampling]") {
  Tiny t(12);
  const V prompt{7, 1, 22};
  const int64_t steps = 12;
  // The hand-written reference: logit + bias - count * frequency - (count > 0) * presence, argmax.
  auto reference = [&](double fp, double pp, const std::map<int64_t, double>& bias) {
    V seq = prompt, gen;
    std::map<int64_t, int64_t> count;
    for (int64_t s = 0; s < steps; ++s) {
      std::vector<double> l = t.next_logits(seq);
      for (auto [id, b] : bias) l[static_cast<size_t>(id)] += b;
      for (auto [id, c] : count) l[static_cast<size_t>(id)] -= static_cast<double>(c) * fp + (c > 0 ? pp : 0.0);
      const auto best = static_cast<int64_t>(std::max_element(l.begin(), l.end()) - l.begin());
      gen.push_back(best);
      seq.push_back(best);
      count[best]++;
    }
    return gen;
  };
  struct Case {
    double fp, pp;
    std::map<int64_t, double> bias;
  };
  const std::vector<Case> cases{{0, 0, {}}, {1.5, 0, {}}, {0, 1.2, {}}, {0.8, 0.6, {{4, 2.5}, {10, -1.0}}},
                                {-0.5, 0, {}}};
  std::vector<std::pair<V, serve::SamplingParams>> reqs;
  for (const auto& c : cases) {
    serve::SamplingParams p;
    p.max_tokens = steps;
    p.frequency_penalty = c.fp;
    p.presence_penalty = c.pp;
    p.logit_bias = c.bias;
    reqs.push_back({prompt, p});
  }
  serve::Engine e(t.model, small_engine());
  const auto out = run(e, reqs);
  std::vector<V> got;
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("case " << i);
    got.push_back(out[i].tokens());
    CHECK(got.back() == reference(cases[i].fp, cases[i].pp, cases[i].bias));
  }
  // The penalties change the output (the comparison above is not vacuous).
  CHECK(got[1] != got[0]);
  CHECK(got[2] != got[0]);
}

TEST_CASE("serve sampling: a stop string ends generation at the token that completes it", "[serve][sampling]") {
  Tiny t(13);
  // A detokenizer of its own: token id -> one letter.
  auto cfg = small_engine();
  cfg.detokenize = [](const V& ids) {
    std::string s;
    for (int64_t id : ids) s += static_cast<char>('a' + id % 26);
    return s;
  };
  serve::Engine e(t.model, cfg);
  const V prompt{3, 8, 40};
  serve::SamplingParams p;
  p.max_tokens = 16;
  p.logit_bias = {{5, 0.5}};
  const Out plain = run(e, {{prompt, p}})[0];
  REQUIRE(plain.outs.size() == 16);
  const std::string text = cfg.detokenize(plain.tokens());
  // A two-letter stop string from the middle of the text: generation ends at the token that
  // completes its first occurrence (one letter per token).
  const std::string stop = text.substr(6, 2);
  const size_t expect = text.find(stop) + 2;
  serve::SamplingParams ps = p;
  ps.stop = {"zzzzzz", stop};
  const Out stopped = run(e, {{prompt, ps}})[0];
  CHECK(stopped.why == serve::FinishReason::stop);
  CHECK(stopped.outs.size() == expect);
  const V all = plain.tokens();
  CHECK(stopped.tokens() == V(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(expect)));
  // min_tokens past that point: the stop string is not looked for before it.
  serve::SamplingParams pm = ps;
  pm.min_tokens = static_cast<int64_t>(expect) + 1;
  const Out later = run(e, {{prompt, pm}})[0];
  CHECK(later.outs.size() > expect);
  // Stop strings without a detokenizer are refused.
  serve::Engine bare(t.model, small_engine());
  CHECK_THROWS_WITH(bare.add_request(prompt, ps, {}), Catch::Contains("detokenize"));
}

TEST_CASE("serve sampling: min_tokens masks stop tokens until reached", "[serve][sampling]") {
  Tiny t(14);
  serve::Engine e(t.model, small_engine());
  const V prompt{9, 9, 1};
  serve::SamplingParams p;
  p.max_tokens = 8;
  p.logit_bias = {{2, 100.0}};  // token 2 wins every step unless masked
  p.stop_token_ids = {2};
  serve::SamplingParams pm = p;
  pm.min_tokens = 3;
  const auto out = run(e, {{prompt, p}, {prompt, pm}});
  CHECK(out[0].tokens() == V{2});
  CHECK(out[0].why == serve::FinishReason::stop);
  // Masked for 3 tokens: the reference's argmax without token 2 (bias included), then 2.
  V seq = prompt;
  V want;
  for (int s = 0; s < 3; ++s) {
    std::vector<double> l = t.next_logits(seq);
    l[2] = -INFINITY;
    const auto best = static_cast<int64_t>(std::max_element(l.begin(), l.end()) - l.begin());
    want.push_back(best);
    seq.push_back(best);
  }
  want.push_back(2);
  CHECK(out[1].tokens() == want);
  CHECK(out[1].why == serve::FinishReason::stop);
  // Out of range values are refused with the field's name.
  serve::SamplingParams bad = p;
  bad.min_tokens = 9;
  CHECK_THROWS_WITH(e.add_request(prompt, bad, {}), Catch::Contains("min_tokens"));
  bad = p;
  bad.frequency_penalty = 2.5;
  CHECK_THROWS_WITH(e.add_request(prompt, bad, {}), Catch::Contains("frequency_penalty"));
  bad = p;
  bad.logit_bias = {{999, 1.0}};
  CHECK_THROWS_WITH(e.add_request(prompt, bad, {}), Catch::Contains("logit_bias token 999"));
}
