// Speculative decoding with n-gram proposals (EngineConfig::speculative_tokens): the proposer
// against hand-worked sequences, and the engine's output with speculation against the same
// engine without it (plain one-token decoding, the reference): many requests together, some
// with repetitive prompts so proposals are accepted, greedy and seeded sampling, stop tokens,
// stop strings, min_tokens, penalties and log-probabilities, f32 and bf16, eager and compiled;
// tokens and log-probabilities bitwise equal, usage (generated tokens) equal to the returned
// tokens, no block leaked; and under a JSON-schema constraint.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/codegen_testing.h"
#include "core/llm_reference.h"
#include "serve/serve_testing.h"
#include "structured.h"
#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/models.h"
#include "tpucore/nn.h"
#include "tpucore/serve/engine.h"
#include "tpucore/serve/metrics.h"
#include "tpucore/serve/scheduler.h"

namespace {

using V = std::vector<int64_t>;
using namespace tpu;

std::shared_ptr<models::CausalLM> spec_model(DType dt, Device device = Device()) {
  auto m = testing::serve::small_engine_model(43, dt, device);
  // Damped attention and MLP outputs: the next token depends mostly on the last one, so greedy
  // output falls into cycles that n-gram proposals predict (most proposals are accepted).
  NoGradGuard ng;
  nn::StateDict sd = m->state_dict();
  for (auto& [name, t] : sd)
    if (name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos) t = t * 0.01;
  m->load_state_dict(sd);
  return m;
}

struct SpecReq {
  V prompt;
  serve::SamplingParams params;
};

// Requests with a passage repeated (n-gram proposals hit) or random prompts, greedy or seeded.
std::vector<SpecReq> spec_requests(int n) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int64_t> tok(0, 255), len(2, 9);
  std::vector<SpecReq> rs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    SpecReq& r = rs[static_cast<size_t>(i)];
    V passage(static_cast<size_t>(len(rng)));
    for (auto& t : passage) t = tok(rng);
    const int repeats = i % 3 == 2 ? 1 : 3;
    for (int k = 0; k < repeats; ++k) r.prompt.insert(r.prompt.end(), passage.begin(), passage.end());
    r.params.max_tokens = 24 + i % 7;
    r.params.logprobs = i % 4 == 0 ? 2 : 0;
    if (i % 5 == 1) {  // seeded sampling
      r.params.temperature = 0.7;
      r.params.seed = 77 + i;
    }
    if (i % 6 == 3) {  // a stop token the passage holds, not before two tokens
      r.params.stop_token_ids = {passage[1]};
      r.params.min_tokens = 2;
    }
    if (i % 7 == 4) r.params.stop = {std::string(1, static_cast<char>('a' + i % 5))};
    if (i % 8 == 5) r.params.frequency_penalty = 0.5;
  }
  return rs;
}

struct SpecOut {
  V tokens;
  std::vector<double> logprobs;
  std::vector<serve::TokenOutput> tops;
  serve::FinishReason why = serve::FinishReason::cancelled;
};

struct SpecRun {
  std::map<size_t, SpecOut> out;
  serve::EngineMetrics metrics;
};

SpecRun spec_serve(const std::shared_ptr<models::CausalLM>& m, const std::vector<SpecReq>& rs, int64_t k, bool compile,
                   bool prefix_caching) {
  serve::EngineConfig ec;
  ec.block_size = 4;
  ec.max_num_seqs = 16;
  ec.max_num_batched_tokens = 48;
  ec.max_model_len = 96;
  ec.compile = compile;
  ec.compile_name = "serve_speculative_step";
  ec.enable_prefix_caching = prefix_caching;
  ec.speculative_tokens = k;
  // Byte text: token t is the character t (mod 256).
  ec.detokenize = [](const V& ids) {
    std::string s;
    for (int64_t t : ids) s += static_cast<char>(t & 0xff);
    return s;
  };
  serve::Engine e(m, ec);
  // Compiled: every bucket (with room for the verification rows) compiles at warm-up, none later.
  const int64_t buckets = e.warm_up();
  const auto compiles = [&] {
    const jit::Stats st = jit::stats();
    const auto* f = st.find(ec.compile_name);
    return f ? f->compiles : int64_t{0};
  };
  const int64_t warm = compiles();
  CHECK((buckets > 0) == compile);
  SpecRun run;
  for (size_t i = 0; i < rs.size(); ++i) {
    serve::RequestCallbacks cb;
    cb.on_output = [&run, i](const serve::TokenOutput& t) {
      run.out[i].tokens.push_back(t.token);
      run.out[i].logprobs.push_back(t.logprob);
      run.out[i].tops.push_back(t);
      return true;
    };
    cb.on_finish = [&run, i](serve::FinishReason r) { run.out[i].why = r; };
    e.add_request(rs[i].prompt, rs[i].params, cb);
  }
  for (int s = 0; s < 2000 && e.has_work(); ++s) e.step();
  REQUIRE_FALSE(e.has_work());
  CHECK(compiles() == warm);
  run.metrics = e.metrics();
  return run;
}

void check_spec_equals_plain(DType dt, bool compile, bool prefix_caching, Device device = Device(), int n = 24) {
  auto m = spec_model(dt, device);
  const auto rs = spec_requests(n);
  const SpecRun plain = spec_serve(m, rs, 0, compile, prefix_caching);
  const SpecRun spec = spec_serve(m, rs, 4, compile, prefix_caching);
  int64_t returned = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    INFO("request " << i << " dtype " << dtype_name(dt) << " compile " << compile << " prefix caching "
                    << prefix_caching << " device " << device.str());
    const SpecOut &a = plain.out.at(i), &b = spec.out.at(i);
    CHECK(b.tokens == a.tokens);
    CHECK(b.logprobs == a.logprobs);  // bitwise: the same logits
    CHECK(b.why == a.why);
    CHECK(b.why != serve::FinishReason::cancelled);
    CHECK(b.tokens.size() <= static_cast<size_t>(rs[i].params.max_tokens));
    for (size_t j = 0; j < a.tops.size() && j < b.tops.size(); ++j) CHECK(b.tops[j].top == a.tops[j].top);
    returned += static_cast<int64_t>(b.tokens.size());
  }
  // Usage counts exactly the returned tokens; every block is back in the pool.
  CHECK(spec.metrics.generation_tokens == returned);
  CHECK(plain.metrics.generation_tokens == returned);
  CHECK(spec.metrics.blocks_used == 0);
  CHECK(plain.metrics.spec_draft_tokens == 0);
  // Proposals were made and some accepted (a request got several tokens in one step).
  CHECK(spec.metrics.spec_drafts > 0);
  CHECK(spec.metrics.spec_draft_tokens > 0);
  CHECK(spec.metrics.spec_accepted_tokens * 5 > spec.metrics.spec_draft_tokens);  // 42% in f32
  CHECK(spec.metrics.spec_accepted_tokens <= spec.metrics.spec_draft_tokens);
}

}  // namespace

TEST_CASE("speculative decoding: n-gram proposals, the longest n-gram and its most recent match first",
          "[serve][speculative]") {
  // Last 3 tokens (3 4 5) occur at 2: the tokens after them are proposed.
  CHECK(serve::propose_ngram({1, 2, 3, 4, 5, 9, 8, 3, 4, 5}, 3, 1, 3) == V{9, 8, 3});
  // k larger than what follows: the continuation runs through the proposals (a cycle repeats).
  CHECK(serve::propose_ngram({1, 2, 3, 4, 5, 9, 8, 3, 4, 5}, 6, 1, 3) == V{9, 8, 3, 4, 5, 9});
  CHECK(serve::propose_ngram({7, 7, 7}, 4, 1, 3) == V{7, 7, 7, 7});
  // The most recent occurrence of the 1-gram 5 (not the earlier one), as no 2-gram recurs.
  CHECK(serve::propose_ngram({5, 1, 5, 2, 6, 5}, 2, 1, 3) == V{2, 6});
  // A 2-gram match wins over a more recent 1-gram match.
  CHECK(serve::propose_ngram({4, 5, 8, 3, 5, 0, 4, 5}, 2, 1, 3) == V{8, 3});
  // ngram_min above every recurring n-gram, nothing recurs, or k = 0: no proposal.
  CHECK(serve::propose_ngram({5, 1, 5, 2, 6, 5}, 2, 2, 3).empty());
  CHECK(serve::propose_ngram({1, 2, 3, 4}, 2, 1, 3).empty());
  CHECK(serve::propose_ngram({3, 3}, 0, 1, 3).empty());
  CHECK(serve::propose_ngram({3}, 2, 1, 3).empty());
}

TEST_CASE("speculative decoding: output equals plain decoding, eager f32 and bf16, metrics", "[serve][speculative]") {
  check_spec_equals_plain(DType::f32, false, false);
  check_spec_equals_plain(DType::bf16, false, true);
}

TEST_CASE("speculative decoding: compiled step equals plain decoding (f32, bf16)", "[serve][speculative][jit]") {
  check_spec_equals_plain(DType::f32, true, true);
  check_spec_equals_plain(DType::bf16, true, false);
}

// On the chip the verification rows are computed one by one in the ragged attention program's
// decode units, as plain decoding computes them, so the output is bitwise the same there too.
TEST_CASE("speculative decoding on the simulated chip equals plain decoding bitwise (bf16, f32)",
          "[serve][speculative][sim]") {
  tpu::testing::TinySim chip;
  check_spec_equals_plain(DType::bf16, false, true, chip.dev(), 12);
  check_spec_equals_plain(DType::f32, false, false, chip.dev(), 12);
}

TEST_CASE("speculative decoding: metrics text and bad settings", "[serve][speculative]") {
  serve::EngineMetrics m;
  m.spec_drafts = 2;
  m.spec_draft_tokens = 8;
  m.spec_accepted_tokens = 6;
  CHECK(m.spec_acceptance_rate() == 0.75);
  const std::string text = serve::prometheus_text(m, "", "tiny");
  CHECK(text.find("tpu_serve_spec_draft_tokens_total 8\n") != std::string::npos);
  CHECK(text.find("tpu_serve_spec_accepted_tokens_total 6\n") != std::string::npos);
  CHECK(text.find("tpu_serve_spec_acceptance_rate 0.75\n") != std::string::npos);
  CHECK(text.find("vllm:spec_decode_num_draft_tokens_total{model_name=\"tiny\"} 8\n") != std::string::npos);
  CHECK(text.find("vllm:spec_decode_num_accepted_tokens_total{model_name=\"tiny\"} 6\n") != std::string::npos);
  CHECK(text.find("vllm:spec_decode_num_drafts_total{model_name=\"tiny\"} 2\n") != std::string::npos);
  auto model = spec_model(DType::f32);
  serve::EngineConfig ec;
  ec.max_model_len = 32;
  ec.speculative_tokens = -1;
  CHECK_THROWS_WITH(serve::Engine(model, ec), Catch::Contains("speculative_tokens"));
  ec.speculative_tokens = 2;
  ec.ngram_min = 3;
  ec.ngram_max = 2;
  CHECK_THROWS_WITH(serve::Engine(model, ec), Catch::Contains("ngram_min"));
}

TEST_CASE("speculative decoding under a JSON-schema constraint equals plain decoding", "[serve][speculative][structured]") {
  testing::serve::ModelFixture f(31, 160, 64);
  const nlohmann::json schema = nlohmann::json::parse(R"({"type": "object", "properties": {
      "a": {"type": "array", "items": {"enum": ["xy", "xz"]}}}, "required": ["a"], "additionalProperties": false})");
  serve::SamplingParams p;
  p.max_tokens = 120;
  p.stop_token_ids = f.model->config.eos_token_ids;
  p.constraint = serve::JsonConstraint::compile(schema, serve_http::token_bytes(f.tok, f.model->config.vocab_size));
  auto run = [&](int64_t k, double temperature) {
    serve::EngineConfig cfg;
    cfg.block_size = 4;
    cfg.max_model_len = 160;
    cfg.max_num_batched_tokens = 64;
    cfg.speculative_tokens = k;
    serve::Engine engine(f.model, cfg);
    p.temperature = temperature;
    p.seed = 9;
    V out;
    serve::RequestCallbacks cb;
    cb.on_token = [&](int64_t t) {
      out.push_back(t);
      return true;
    };
    engine.add_request(f.tok.encode("a: xy, xz, xy, xz, a:"), p, cb);
    for (int s = 0; s < 300 && engine.has_work(); ++s) engine.step();
    return std::make_pair(out, engine.metrics());
  };
  for (const double temperature : {0.0, 1.0}) {
    const auto [plain, pm] = run(0, temperature);
    const auto [spec, sm] = run(4, temperature);
    INFO("temperature " << temperature << ": " << f.tok.decode(spec, true));
    CHECK(spec == plain);
    CHECK(sm.generation_tokens == static_cast<int64_t>(spec.size()));
    CHECK(sm.spec_draft_tokens > 0);
    CHECK_FALSE(nlohmann::json::parse(f.tok.decode(spec, true), nullptr, false).is_discarded());
  }
}

TEST_CASE("tpu-serve with speculative decoding answers as without it, acceptance in /metrics", "[serve][speculative][http]") {
  testing::serve::ModelFixture f(47, 96, 32);
  std::vector<nlohmann::json> bodies;
  for (const char* prompt : {"abcabcabcabc", "the cat and the cat and the", "xyz"})
    for (const nlohmann::json& extra : {nlohmann::json::object(), nlohmann::json{{"stop", {"a"}}}}) {
      nlohmann::json b{{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
      b.update(extra);
      bodies.push_back(b);
    }
  auto answers = [&](int64_t k, std::string& metrics) {
    serve_http::ServerOptions o = f.options();
    o.engine.speculative_tokens = k;
    testing::serve::Running r(f.model, f.tok, o);
    auto c = r.client();
    std::vector<std::pair<std::string, int64_t>> out;  // text, usage.completion_tokens
    for (const auto& b : bodies) {
      auto res = c.Post("/v1/completions", b.dump(), "application/json");
      REQUIRE(res);
      REQUIRE(res->status == 200);
      const auto j = nlohmann::json::parse(res->body);
      out.push_back({j["choices"][0]["text"].get<std::string>(), j["usage"]["completion_tokens"].get<int64_t>()});
    }
    auto met = c.Get("/metrics");
    REQUIRE(met);
    metrics = met->body;
    return std::make_pair(out, r.server->engine().metrics());
  };
  std::string plain_text, spec_text;
  const auto [plain, pm] = answers(0, plain_text);
  const auto [spec, sm] = answers(4, spec_text);
  CHECK(spec == plain);
  CHECK(sm.generation_tokens == pm.generation_tokens);
  CHECK(sm.spec_draft_tokens > 0);
  CHECK(spec_text.find(fmt::format("vllm:spec_decode_num_draft_tokens_total{{model_name=\"tiny\"}} {}\n",
                                   sm.spec_draft_tokens)) != std::string::npos);
  CHECK(spec_text.find(fmt::format("vllm:spec_decode_num_accepted_tokens_total{{model_name=\"tiny\"}} {}\n",
                                   sm.spec_accepted_tokens)) != std::string::npos);
  CHECK(spec_text.find("tpu_serve_spec_acceptance_rate ") != std::string::npos);
  CHECK(plain_text.find("vllm:spec_decode_num_draft_tokens_total{model_name=\"tiny\"} 0\n") != std::string::npos);
}

TEST_CASE("speculative decoding with the model on sim (tiny chip) equals cpu generate()", "[serve][speculative][sim]") {
  tpu::testing::TinySim sim;
  testing::llm::TinyCfg c;
  auto dir = testing::llm::temp_dir("serve_speculative_sim");
  testing::llm::write_tiny_model(dir, c, DType::f32, 1, 31);
  auto cpu = models::load_causal_lm(dir.string());
  auto on_chip = models::load_causal_lm(dir.string(), sim.dev());
  std::filesystem::remove_all(dir);
  serve::EngineConfig ec;
  ec.block_size = 4;
  ec.max_num_batched_tokens = 16;
  ec.max_num_seqs = 3;
  ec.max_model_len = 32;
  ec.speculative_tokens = 3;
  serve::Engine e(on_chip, ec);
  const std::vector<V> prompts{{5, 6, 7, 5, 6, 7, 5, 6}, {1, 2, 1, 2, 1}, {9, 30, 4}};
  const std::vector<V> out = testing::serve::engine_greedy_tokens(e, prompts, 12, 200);
  models::GenerationConfig g;
  g.max_new_tokens = 12;
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("request " << i);
    CHECK(out[i] == models::generate(*cpu, {prompts[i]}, g)[0]);
  }
  CHECK(e.metrics().spec_draft_tokens > 0);
  CHECK(e.metrics().blocks_used == 0);
}
