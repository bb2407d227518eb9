// Serving engine: the ragged paged attention kernel against dense attention computed naively
// in double; continuous batching (chunked prefills mixed with decodes, preemption, cancel)
// against models::generate() run one request at a time; bad requests are tpu::Errors that
// leave the engine usable; no KV block leaks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "core/llm_reference.h"
#include "core/codegen_testing.h"
#include "core/opinfo.h"
#include "core/testing.h"
#include "tpucore/compile.h"
#include "tpucore/models.h"
#include "tpucore/serve/engine.h"
#include "tpucore/serve/paged_cache.h"

using namespace tpu;
using tpu::testing::expect_error;
using V = std::vector<int64_t>;

namespace {

// The compiled step's paged attention op (tpucore/serve/paged_op.h) is tested against naive
// attention, bad step data and the chip program in the serving tests.
const testing::OpInfoRegistrar serve_paged_entry("serve_paged_attention", "tests/serve/test_paged_op.cpp");

std::shared_ptr<models::CausalLM> tiny_model(uint32_t seed, bool qwen3 = false) {
  tpu::testing::llm::TinyCfg c;
  if (qwen3) {
    c.model_type = "qwen3";
    c.qk_norm = true;
  }
  auto dir = tpu::testing::llm::temp_dir("serve");
  tpu::testing::llm::write_tiny_model(dir, c, DType::f32, 1, seed);
  auto m = models::load_causal_lm(dir.string());
  std::filesystem::remove_all(dir);
  return m;
}

// Runs the engine until idle (bounded), collecting every request's tokens and finish reason.
struct Run {
  std::map<int64_t, V> out;
  std::map<int64_t, serve::FinishReason> why;
  bool mixed_step = false;  // a step held both a prefill chunk (> 1 token) and a decode (1 token)
};
Run drain(serve::Engine& e, Run& run, int max_steps = 2000) {
  for (int i = 0; i < max_steps && e.has_work(); ++i) {
    e.step();
    bool chunk = false, decode = false;
    for (auto [id, n] : e.last_schedule()) (n > 1 ? chunk : decode) = true;
    run.mixed_step = run.mixed_step || (chunk && decode);
  }
  REQUIRE_FALSE(e.has_work());
  return run;
}
int64_t submit(serve::Engine& e, Run& run, const V& prompt, const models::GenerationConfig& g) {
  auto id = std::make_shared<int64_t>(0);
  serve::RequestCallbacks cb;
  cb.on_token = [&run, id](int64_t t) {
    run.out[*id].push_back(t);
    return true;
  };
  cb.on_finish = [&run, id](serve::FinishReason r) { run.why[*id] = r; };
  *id = e.add_request(prompt, serve::SamplingParams::from_generation_config(g), cb);
  return *id;
}

std::vector<V> prompts_of(uint32_t seed, int n, int64_t vocab) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> tok(0, vocab - 1), len(1, 13);
  std::vector<V> ps(static_cast<size_t>(n));
  for (auto& p : ps) {
    p.resize(static_cast<size_t>(len(rng)));
    for (auto& t : p) t = tok(rng);
  }
  return ps;
}

}  // namespace

TEST_CASE("serve: ragged paged attention equals dense causal attention per sequence", "[serve]") {
  const int64_t H = 4, HKV = 2, D = 8, BS = 4, NB = 16;
  serve::PagedKVCache cache({1, HKV, D, BS, NB});
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  // Three sequences with scattered blocks; two steps: a first prefill, then a mix of a prefill
  // chunk after cached tokens, one decode token, and a fresh whole prefill.
  std::vector<std::vector<int32_t>> tables{{7, 2, 11}, {0, 5}, {9, 3, 14, 1}};
  std::vector<std::vector<std::vector<float>>> hist_k(3), hist_v(3);  // per seq, per position: HKV*D
  std::vector<std::vector<int64_t>> steps{{5, 3, 0}, {4, 1, 13}};
  for (const auto& q_lens : steps) {
    serve::RaggedBatch rb;
    rb.query_start.push_back(0);
    std::vector<int64_t> seqs;
    for (int64_t s = 0; s < 3; ++s) {
      if (q_lens[static_cast<size_t>(s)] == 0) continue;
      seqs.push_back(s);
      rb.query_start.push_back(rb.query_start.back() + q_lens[static_cast<size_t>(s)]);
      rb.context_len.push_back(static_cast<int64_t>(hist_k[static_cast<size_t>(s)].size()) + q_lens[static_cast<size_t>(s)]);
      rb.block_tables.push_back(&tables[static_cast<size_t>(s)]);
    }
    const int64_t n = rb.num_tokens();
    std::vector<float> q(static_cast<size_t>(n * H * D)), k(static_cast<size_t>(n * HKV * D)), v(k.size()),
        out(q.size());
    for (auto* x : {&q, &k, &v})
      for (float& f : *x) f = nd(rng);
    serve::ragged_paged_attention(cache, 0, rb, q.data(), k.data(), v.data(), out.data(), H, 0.3);
    for (size_t si = 0; si < seqs.size(); ++si) {
      auto& hk = hist_k[static_cast<size_t>(seqs[si])];
      auto& hv = hist_v[static_cast<size_t>(seqs[si])];
      const int64_t t0 = rb.query_start[si], t1 = rb.query_start[si + 1];
      for (int64_t t = t0; t < t1; ++t) {
        hk.emplace_back(k.begin() + t * HKV * D, k.begin() + (t + 1) * HKV * D);
        hv.emplace_back(v.begin() + t * HKV * D, v.begin() + (t + 1) * HKV * D);
      }
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t pos = static_cast<int64_t>(hk.size()) - (t1 - t);
        for (int64_t h = 0; h < H; ++h) {
          const int64_t kh = h / (H / HKV);
          std::vector<double> sc(static_cast<size_t>(pos + 1));
          double mx = -1e300, z = 0;
          for (int64_t j = 0; j <= pos; ++j) {
            double dot = 0;
            for (int64_t e = 0; e < D; ++e)
              dot += static_cast<double>(q[static_cast<size_t>((t * H + h) * D + e)]) *
                     hk[static_cast<size_t>(j)][static_cast<size_t>(kh * D + e)];
            sc[static_cast<size_t>(j)] = 0.3 * dot;
            mx = std::max(mx, sc[static_cast<size_t>(j)]);
          }
          for (double& s : sc) z += s = std::exp(s - mx);
          for (int64_t e = 0; e < D; ++e) {
            double o = 0;
            for (int64_t j = 0; j <= pos; ++j)
              o += sc[static_cast<size_t>(j)] / z * hv[static_cast<size_t>(j)][static_cast<size_t>(kh * D + e)];
            CHECK(out[static_cast<size_t>((t * H + h) * D + e)] == Approx(o).margin(1e-5));
          }
        }
      }
    }
  }
  // A table that does not cover the context is an error, not a read out of bounds.
  serve::RaggedBatch bad;
  bad.query_start = {0, 1};
  bad.context_len = {9};
  bad.block_tables = {&tables[1]};
  std::vector<float> x(static_cast<size_t>(H * D));
  expect_error([&] { serve::ragged_paged_attention(cache, 0, bad, x.data(), x.data(), x.data(), x.data(), H, 1.0); },
               {"block table of sequence 0 covers 8 positions"});
}

TEST_CASE("serve: block allocator free list", "[serve]") {
  serve::BlockAllocator a(3);
  CHECK(a.allocate() == 0);
  CHECK(a.allocate() == 1);
  CHECK(a.allocate() == 2);
  CHECK(a.allocate() == -1);
  CHECK(a.num_free() == 0);
  a.free(1);
  CHECK(a.num_used() == 2);
  CHECK(a.allocate() == 1);
  a.free(0);
  expect_error([&] { a.free(0); }, {"block 0 is not in use"});
  expect_error([&] { a.free(7); }, {"block 7 is not in use"});
  expect_error([] { serve::BlockAllocator(0); }, {"num_blocks"});
}

TEST_CASE("serve: continuous batching equals one-request-at-a-time greedy generation", "[serve]") {
  for (bool qwen3 : {false, true}) {
    auto m = tiny_model(qwen3 ? 21 : 22, qwen3);
    serve::EngineConfig ec;
    ec.block_size = 4;
    ec.max_num_batched_tokens = 10;  // small: prompts are prefilled in chunks next to decodes
    ec.max_num_seqs = 4;
    ec.max_model_len = 40;
    serve::Engine e(m, ec);
    const auto prompts = prompts_of(qwen3 ? 5 : 6, 9, m->config.vocab_size);
    Run run;
    std::vector<int64_t> ids;
    std::vector<models::GenerationConfig> gens;
    for (size_t i = 0; i < prompts.size(); ++i) {
      models::GenerationConfig g;
      g.max_new_tokens = 3 + static_cast<int64_t>(i % 4) * 3;
      gens.push_back(g);
      ids.push_back(submit(e, run, prompts[i], g));
      if (i % 3 == 2) e.step();  // requests arrive while others run
    }
    drain(e, run);
    CHECK(run.mixed_step);
    for (size_t i = 0; i < prompts.size(); ++i) {
      INFO("request " << i << " qwen3 " << qwen3);
      CHECK(run.out[ids[i]] == models::generate(*m, {prompts[i]}, gens[i])[0]);
      CHECK(run.why[ids[i]] == serve::FinishReason::length);
    }
    const auto met = e.metrics();
    CHECK(met.blocks_used == 0);
    CHECK(met.running == 0);
    CHECK(met.requests_finished == static_cast<int64_t>(prompts.size()));
    CHECK(met.ttft.count == static_cast<int64_t>(prompts.size()));
  }
}

TEST_CASE("serve: preemption by recomputation keeps the outputs, sampling with a seed too", "[serve]") {
  auto m = tiny_model(23);
  serve::EngineConfig ec;
  ec.block_size = 2;
  ec.num_blocks = 12;  // 24 positions for 6 sequences of up to 23 tokens: someone must wait
  ec.max_num_seqs = 6;
  ec.max_num_batched_tokens = 16;
  ec.max_model_len = 24;
  serve::Engine e(m, ec);
  const auto prompts = prompts_of(7, 6, m->config.vocab_size);
  Run run;
  std::vector<int64_t> ids;
  std::vector<models::GenerationConfig> gens;
  for (size_t i = 0; i < prompts.size(); ++i) {
    models::GenerationConfig g;
    g.max_new_tokens = 10;
    if (i % 2) {
      g.do_sample = true;
      g.temperature = 0.9;
      g.top_k = 8;
      g.seed = 100 + i;
    }
    gens.push_back(g);
    ids.push_back(submit(e, run, prompts[i], g));
  }
  drain(e, run);
  CHECK(e.metrics().preemptions > 0);
  CHECK(e.metrics().blocks_used == 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("request " << i);
    CHECK(run.out[ids[i]] == models::generate(*m, {prompts[i]}, gens[i])[0]);
  }
}

TEST_CASE("serve: stop tokens, the context limit, cancel and a callback that cancels free their blocks", "[serve]") {
  auto m = tiny_model(24);
  serve::EngineConfig ec;
  ec.block_size = 4;
  ec.max_model_len = 20;
  serve::Engine e(m, ec);
  const V prompt{3, 9, 4, 1};
  models::GenerationConfig g;
  g.max_new_tokens = 8;
  const V full = models::generate(*m, {prompt}, g)[0];
  // Stop at the third generated token: it is kept, nothing after it.
  models::GenerationConfig gs = g;
  gs.stop_tokens = {full[2]};
  const size_t first_stop = static_cast<size_t>(std::find(full.begin(), full.end(), full[2]) - full.begin());
  Run run;
  const int64_t a = submit(e, run, prompt, gs);
  // The context limit ends generation: 17 prompt tokens + 3 new = 20.
  models::GenerationConfig gl = g;
  gl.max_new_tokens = 100;
  const int64_t b = submit(e, run, V(17, 5), gl);
  // Cancelled after its first token; and one whose callback refuses the second token.
  const int64_t c = submit(e, run, prompt, g);
  serve::RequestCallbacks cb;
  int seen = 0;
  cb.on_token = [&](int64_t) { return ++seen < 2; };
  serve::FinishReason d_why = serve::FinishReason::length;
  cb.on_finish = [&](serve::FinishReason r) { d_why = r; };
  e.add_request(prompt, serve::SamplingParams::from_generation_config(g), cb);
  e.step();
  e.cancel(c);
  drain(e, run);
  CHECK(run.out[a] == V(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(first_stop) + 1));
  CHECK(run.why[a] == serve::FinishReason::stop);
  CHECK(run.out[b].size() == 3);
  CHECK(run.why[b] == serve::FinishReason::length);
  CHECK(run.out[c].size() == 1);
  CHECK(run.why[c] == serve::FinishReason::cancelled);
  CHECK(seen == 2);
  CHECK(d_why == serve::FinishReason::cancelled);
  CHECK(e.metrics().requests_cancelled == 2);
  CHECK(e.metrics().blocks_used == 0);
}

TEST_CASE("serve: bad requests are errors and the engine stays usable", "[serve]") {
  auto m = tiny_model(25);
  serve::EngineConfig ec;
  ec.max_model_len = 16;
  ec.max_waiting = 2;
  serve::Engine e(m, ec);
  models::GenerationConfig g;
  g.max_new_tokens = 2;
  expect_error([&] { e.add_request({}, serve::SamplingParams::from_generation_config(g), {}); }, {"prompt is empty"});
  expect_error([&] { e.add_request(V(16, 1), serve::SamplingParams::from_generation_config(g), {}); }, {"prompt has 16 tokens", "context is 16"});
  expect_error([&] { e.add_request({1, 37}, serve::SamplingParams::from_generation_config(g), {}); }, {"token 37", "vocabulary of 37"});
  expect_error([&] { e.add_request({1, -1}, serve::SamplingParams::from_generation_config(g), {}); }, {"token -1"});
  models::GenerationConfig bad = g;
  bad.max_new_tokens = 0;
  expect_error([&] { e.add_request({1}, serve::SamplingParams::from_generation_config(bad), {}); }, {"max_tokens"});
  bad = g;
  bad.do_sample = true;
  bad.temperature = 0;
  expect_error([&] { e.add_request({1}, serve::SamplingParams::from_generation_config(bad), {}); }, {"temperature"});
  bad = g;
  bad.top_p = 1.5;
  expect_error([&] { e.add_request({1}, serve::SamplingParams::from_generation_config(bad), {}); }, {"top_p"});
  expect_error([&] { serve::Engine(m, serve::EngineConfig{.block_size = 0}); }, {"block_size (0)"});
  expect_error([&] { serve::Engine(m, serve::EngineConfig{.block_size = 4, .num_blocks = 2, .max_model_len = 16}); },
               {"cannot hold one sequence"});
  Run run;
  const int64_t a = submit(e, run, {1, 2}, g);
  submit(e, run, {2, 3}, g);
  CHECK_THROWS_AS(e.add_request({1}, serve::SamplingParams::from_generation_config(g), {}), serve::Overloaded);
  drain(e, run);
  CHECK(run.out[a] == models::generate(*m, {{1, 2}}, g)[0]);
  CHECK(e.metrics().blocks_used == 0);
}

TEST_CASE("serve: the compiled step on bucketed shapes equals generate() and never recompiles after warm-up",
          "[serve][jit]") {
  auto m = tiny_model(26, true);
  serve::EngineConfig ec;
  ec.block_size = 4;
  ec.max_num_batched_tokens = 16;  // token buckets: every count 1 to 16 (cpu)
  ec.max_num_seqs = 4;
  ec.max_model_len = 48;
  ec.compile = true;
  ec.compile_name = "serve_step_test";
  serve::Engine e(m, ec);
  CHECK(e.warm_up() == 16);
  const jit::Stats warm = jit::stats();  // kept alive: find() points into it
  REQUIRE(warm.find("serve_step_test") != nullptr);
  const int64_t compiles = warm.find("serve_step_test")->compiles, hits = warm.find("serve_step_test")->hits;
  CHECK(compiles == 16);
  for (uint32_t round = 0; round < 2; ++round) {
    const auto prompts = prompts_of(40 + round, 7, m->config.vocab_size);
    Run run;
    std::vector<int64_t> ids;
    std::vector<models::GenerationConfig> gens;
    for (size_t i = 0; i < prompts.size(); ++i) {
      models::GenerationConfig g;
      g.max_new_tokens = 4 + static_cast<int64_t>(i) * 4;  // up to 28 new tokens: contexts reach the 64 bucket
      gens.push_back(g);
      ids.push_back(submit(e, run, prompts[i], g));
      if (i % 2) e.step();
    }
    drain(e, run);
    CHECK(run.mixed_step);
    for (size_t i = 0; i < prompts.size(); ++i) {
      INFO("round " << round << " request " << i);
      CHECK(run.out[ids[i]] == models::generate(*m, {prompts[i]}, gens[i])[0]);
    }
  }
  const jit::Stats after = jit::stats();
  CHECK(after.find("serve_step_test")->compiles == compiles);
  CHECK(after.find("serve_step_test")->hits > hits + 20);
  CHECK(e.metrics().blocks_used == 0);
}

TEST_CASE("serve: the compiled step with the model on sim (tiny chip) equals cpu generate()", "[serve][jit][sim]") {
  tpu::testing::TinySim sim;
  auto cpu = tiny_model(27);
  auto dir = tpu::testing::llm::temp_dir("serve_sim");
  tpu::testing::llm::TinyCfg c;
  tpu::testing::llm::write_tiny_model(dir, c, DType::f32, 1, 27);
  auto on_chip = models::load_causal_lm(dir.string(), sim.dev());
  std::filesystem::remove_all(dir);
  serve::EngineConfig ec;
  ec.block_size = 4;
  ec.max_num_batched_tokens = 8;
  ec.max_num_seqs = 3;
  ec.max_model_len = 16;
  ec.compile = true;
  ec.compile_name = "serve_step_sim";
  serve::Engine e(on_chip, ec);
  const int64_t graphs = e.warm_up();  // one graph per token bucket
  CHECK(graphs >= 1);
  const jit::Stats warm = jit::stats();
  REQUIRE(warm.find("serve_step_sim") != nullptr);
  const int64_t compiles = warm.find("serve_step_sim")->compiles;
  CHECK(compiles == graphs);
  const auto prompts = prompts_of(9, 3, c.vocab);
  Run run;
  std::vector<int64_t> ids;
  models::GenerationConfig g;
  g.max_new_tokens = 5;
  tpu::testing::ChipRunProbe probe;
  for (const auto& p : prompts) ids.push_back(submit(e, run, p, g));
  drain(e, run);
  const uint64_t chip_runs = probe.new_runs(), fallbacks = probe.new_fallbacks();
  INFO("chip programs " << chip_runs << ", host fallbacks " << fallbacks);
  CHECK(chip_runs > 0);
  CHECK(fallbacks == 0);  // every op of the compiled step runs as a chip program
  CHECK(run.mixed_step);
  const jit::Stats after = jit::stats();
  CHECK(after.find("serve_step_sim")->compiles == compiles);  // no compile after warm-up
  for (size_t i = 0; i < prompts.size(); ++i) CHECK(run.out[ids[i]] == models::generate(*cpu, {prompts[i]}, g)[0]);
  CHECK(e.metrics().blocks_used == 0);
}

TEST_CASE("serve: block allocator reference counts and the prefix cache", "[serve]") {
  serve::BlockAllocator a(3);
  const std::vector<int64_t> toks{4, 5};
  const uint64_t h = serve::BlockAllocator::chain_hash(0, toks.data(), 2);
  CHECK(h != serve::BlockAllocator::chain_hash(1, toks.data(), 2));  // the parent is part of the hash
  const int32_t b = a.allocate();
  a.register_cached(b, h, 0, toks);
  CHECK(a.find_cached(h, 0, toks) == b);
  CHECK(a.find_cached(h, 0, {4, 6}) == -1);  // same hash, other tokens: not a hit
  a.share(b);
  CHECK(a.refcount(b) == 2);
  a.free(b);
  a.free(b);
  CHECK(a.num_free() == 3);
  CHECK(a.find_cached(h, 0, toks) == b);  // free but still cached
  a.share(b);                              // revived from the free list
  CHECK(a.num_free() == 2);
  a.free(b);
  // Allocating every block hands out the cached one last (least recently freed first) and evicts it.
  a.allocate();
  a.allocate();
  CHECK(a.allocate() == b);
  CHECK(a.find_cached(h, 0, toks) == -1);
  expect_error([&] { a.register_cached(7, h, 0, toks); }, {"cannot register block 7"});
}

TEST_CASE("serve: prefix sharing reuses cached blocks and keeps the outputs", "[serve]") {
  for (bool compiled : {false, true}) {
    auto m = tiny_model(28);
    serve::EngineConfig ec;
    ec.block_size = 4;
    ec.max_num_batched_tokens = 32;
    ec.max_model_len = 40;
    ec.enable_prefix_caching = true;
    ec.compile = compiled;
    ec.compile_name = "serve_step_prefix";
    serve::Engine e(m, ec);
    const V system{7, 1, 30, 2, 9, 9, 14, 5, 22, 3, 11};  // 11 tokens: two full blocks to share
    std::vector<V> prompts;
    for (int64_t i = 0; i < 6; ++i) {
      V p = system;
      for (int64_t j = 0; j <= i; ++j) p.push_back((i * 5 + j * 3) % 37);
      prompts.push_back(p);
    }
    models::GenerationConfig g;
    g.max_new_tokens = 6;
    Run run;
    std::vector<int64_t> ids;
    ids.push_back(submit(e, run, prompts[0], g));  // first alone: it fills the cache
    drain(e, run);
    for (size_t i = 1; i < prompts.size(); ++i) ids.push_back(submit(e, run, prompts[i], g));
    drain(e, run);
    // Requests 1..5 each reuse the two full system blocks (8 tokens).
    CHECK(e.metrics().prefix_cache_hit_tokens >= 5 * 8);
    CHECK(e.metrics().blocks_used == 0);
    for (size_t i = 0; i < prompts.size(); ++i) {
      INFO("compiled " << compiled << " request " << i);
      CHECK(run.out[ids[i]] == models::generate(*m, {prompts[i]}, g)[0]);
    }
    // The same prompt again: everything but its last token comes from the cache.
    Run again;
    const int64_t id = submit(e, again, prompts[5], g);
    drain(e, again);
    CHECK(again.out[id] == run.out[ids[5]]);
  }
}
