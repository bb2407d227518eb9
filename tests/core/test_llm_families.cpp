// The config-driven variants of the decoder family against the naive double reference of
// llm_reference.h on tiny random checkpoints in Hugging Face layout: Mistral's and Qwen2's sliding
// windows, Gemma 2 (sandwich (1 + w) norms, GELU-tanh, scaled embeddings, query_pre_attn_scalar,
// attention and final soft-capping, alternating windows), Gemma 3 (q/k norms, local rope base,
// window pattern, scaled global rope), yarn with partial rotary dims and longrope. Each: f32
// logits within 1e-5 relative error, KV-cache decoding equal to the full forward, greedy
// generation equal to the reference's argmax. The serving engine (paged caches on the cpu,
// compiled, and on the tiny sim chip) against generate() for windowed and soft-capped models,
// and the blocks a model whose every layer slides holds; multimodal Gemma 3 configs and weight
// layouts read as the text model.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <numbers>

#include "core/codegen_testing.h"
#include "ops/fallback.h"
#include "core/llm_reference.h"
#include "core/testing.h"
#include "tpucore/autograd.h"
#include "tpucore/models.h"
#include "tpucore/safetensors.h"
#include "tpucore/serve/engine.h"

using namespace tpu;
using namespace tpu::testing::llm;

namespace {

// Full forward against the reference, KV-cache decoding against the full forward, greedy
// generation against the reference's argmax.
void check_model(const TinyCfg& c, uint32_t seed, bool check_decode = true) {
  auto dir = temp_dir(c.model_type);
  Weights w = write_tiny_model(dir, c, DType::f32, 1, seed);
  auto m = models::load_causal_lm(dir.string());
  const std::vector<int64_t> ids{3, 1, 4, 1, 5, 9, 2, 6, 5};
  std::vector<int64_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>(i);
  NoGradGuard ng;
  const Tensor full = m->forward(row(ids));
  const Logits want = ref_forward(c, w, ids, pos);
  const double e = rel_error(full, want);
  INFO(c.model_type << ": relative error of the full forward " << e);
  CHECK(e <= 1e-5);
  if (check_decode) {
    // Prefill 3 tokens, then one token per step through the contiguous cache.
    nn::KVCache cache = m->make_cache(1, static_cast<int64_t>(ids.size()));
    std::vector<Tensor> parts{m->forward(row({ids.begin(), ids.begin() + 3}), &cache)};
    for (size_t i = 3; i < ids.size(); ++i) parts.push_back(m->forward(row({ids[i]}), &cache));
    const Tensor dec = cat(parts, 1);
    const std::vector<float> fv = full.to_vector<float>();
    Logits full_rows(ids.size());
    for (size_t t = 0; t < ids.size(); ++t)
      full_rows[t].assign(fv.begin() + static_cast<std::ptrdiff_t>(t * want[0].size()),
                          fv.begin() + static_cast<std::ptrdiff_t>((t + 1) * want[0].size()));
    const double d = rel_error(dec, full_rows);
    INFO("relative error of cached decoding " << d);
    CHECK(d <= 1e-5);
    // Greedy: the reference picks each next token from its own full forward.
    std::vector<int64_t> seq{3, 1, 4}, ref_tokens;
    for (int step = 0; step < 7; ++step) {
      std::vector<int64_t> p(seq.size());
      for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int64_t>(i);
      const Logits ref = ref_forward(c, w, seq, p);
      const std::vector<double>& last = ref.back();
      const auto t = static_cast<int64_t>(std::max_element(last.begin(), last.end()) - last.begin());
      ref_tokens.push_back(t);
      seq.push_back(t);
    }
    models::GenerationConfig g;
    g.max_new_tokens = 7;
    auto out = models::generate(*m, {{3, 1, 4}}, g);
    CHECK(out[0] == ref_tokens);
  }
  // The config and weights written back read into the same model.
  auto dir2 = temp_dir(c.model_type + "_saved");
  models::save_causal_lm(*m, dir2.string());
  auto m2 = models::load_causal_lm(dir2.string());
  CHECK(rel_error(m2->forward(row(ids)), want) <= 1e-5);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir2);
}

TinyCfg gemma_base(const std::string& type) {
  TinyCfg c;
  c.model_type = type;
  c.gemma = true;
  c.tied = true;
  c.layers = 3;
  c.extra_json = R"(, "hidden_activation": "gelu_pytorch_tanh")";
  return c;
}

// Gemma 2 with soft-capping, query_pre_attn_scalar and a window of 3 on layers 0 and 2.
TinyCfg gemma2_windowed() {
  TinyCfg c = gemma_base("gemma2");
  c.qpas = 12;
  c.attn_cap = 2.0;
  c.final_cap = 3.0;
  c.window = 3;
  c.sliding = {true, false, true};
  c.extra_json += R"(, "query_pre_attn_scalar": 12, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                     "sliding_window": 3)";
  return c;
}

// Greedy outputs of the serving engine (blocks of 4, steps of at most 6 tokens, 3 sequences).
std::vector<std::vector<int64_t>> serve_greedy(const std::shared_ptr<models::CausalLM>& m,
                                               const std::vector<std::vector<int64_t>>& prompts,
                                               const models::GenerationConfig& g, bool compile,
                                               int64_t* peak_blocks = nullptr) {
  serve::EngineConfig ec;
  ec.block_size = 4;
  ec.max_num_batched_tokens = 6;
  ec.max_num_seqs = 3;
  ec.max_model_len = 24;
  ec.compile = compile;
  serve::Engine e(m, ec);
  std::vector<std::vector<int64_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    serve::RequestCallbacks cb;
    cb.on_token = [&out, i](int64_t t) {
      out[i].push_back(t);
      return true;
    };
    e.add_request(prompts[i], serve::SamplingParams::from_generation_config(g), cb);
  }
  int64_t peak = 0;
  for (int i = 0; i < 200 && e.has_work(); ++i) {
    e.step();
    peak = std::max(peak, e.metrics().blocks_used);
  }
  if (peak_blocks) *peak_blocks = peak;
  CHECK_FALSE(e.has_work());
  CHECK(e.metrics().blocks_used == 0);
  return out;
}

}  // namespace

TEST_CASE("llm families: Mistral with a sliding window on every layer", "[llm][families]") {
  TinyCfg c;
  c.model_type = "mistral";
  c.window = 4;
  c.sliding = {true, true};
  c.extra_json = R"(, "sliding_window": 4)";
  check_model(c, 21);
}

TEST_CASE("llm families: Qwen2 with use_sliding_window from max_window_layers", "[llm][families]") {
  TinyCfg c;
  c.model_type = "qwen2";
  c.qkv_bias = true;
  c.layers = 3;
  c.window = 3;
  c.sliding = {false, true, true};
  c.extra_json = R"(, "use_sliding_window": true, "sliding_window": 3, "max_window_layers": 1)";
  check_model(c, 22);
}

// A prefill of 6 tokens, then `steps` greedy steps through `cache`: the relative error of every
// logit row against the reference's full forward over the whole sequence.
static double ring_decode_error(models::CausalLM& m, const TinyCfg& c, Weights& w, nn::KVCache& cache,
                                int steps) {
  std::vector<int64_t> seq{3, 1, 4, 1, 5, 9};
  std::vector<Tensor> parts{m.forward(row(seq), &cache)};
  for (int step = 0; step < steps; ++step) {
    const std::vector<float> last = select(parts.back(), 1, parts.back().size(1) - 1).to_vector<float>();
    seq.push_back(static_cast<int64_t>(std::max_element(last.begin(), last.end()) - last.begin()));
    parts.push_back(m.forward(row({seq.back()}), &cache));
  }
  std::vector<int64_t> pos(seq.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>(i);
  return rel_error(cat(parts, 1), ref_forward(c, w, seq, pos));
}

TEST_CASE("llm families: generate() keeps only the window when every layer slides", "[llm][families][compile]") {
  TinyCfg c;
  c.model_type = "mistral";
  c.window = 4;
  c.sliding = {true, true};
  c.extra_json = R"(, "sliding_window": 4)";
  auto dir = temp_dir("mistral_ring");
  Weights w = write_tiny_model(dir, c, DType::f32, 1, 29);
  auto m = models::load_causal_lm(dir.string());
  NoGradGuard ng;
  // Memory: layers x (keys, values) x kv heads x window x head_dim x 4 bytes, however long.
  nn::KVCache cache = models::make_generation_cache(*m, 1, 64);
  const int64_t ring_bytes = c.layers * 2 * c.kv_heads * c.window * c.head_dim * 4;
  CHECK(cache.ring());
  CHECK(cache.nbytes() == ring_bytes);
  CHECK_FALSE(models::make_generation_cache(*m, 1, 4).ring());  // a window as long as the sequence: no ring
  // A prefill longer than the window, then 16 greedy steps through the ring: every logit row
  // equals the reference's full forward over the whole sequence.
  CHECK(ring_decode_error(*m, c, w, cache, 16) <= 1e-5);
  CHECK(cache.length() == 22);
  CHECK(cache.nbytes() == ring_bytes);
  // Batched, left-padded greedy generation (eager and compiled) equals the reference's argmax.
  const std::vector<std::vector<int64_t>> prompts{{3, 1, 4, 1, 5, 9}, {2, 7}};
  std::vector<std::vector<int64_t>> want;
  for (const auto& p : prompts) {
    std::vector<int64_t> s = p, got;
    for (int step = 0; step < 12; ++step) {
      std::vector<int64_t> ps(s.size());
      for (size_t i = 0; i < ps.size(); ++i) ps[i] = static_cast<int64_t>(i);
      const std::vector<double> last = ref_forward(c, w, s, ps).back();
      got.push_back(static_cast<int64_t>(std::max_element(last.begin(), last.end()) - last.begin()));
      s.push_back(got.back());
    }
    want.push_back(got);
  }
  models::GenerationConfig g;
  g.max_new_tokens = 12;
  CHECK(models::generate(*m, prompts, g) == want);
  g.compile = true;
  CHECK(models::generate(*m, prompts, g) == want);
  std::filesystem::remove_all(dir);
}

TEST_CASE("llm families: Gemma 2", "[llm][families]") {
  TinyCfg c = gemma_base("gemma2");
  c.qpas = 12;
  c.attn_cap = 2.0;
  c.final_cap = 3.0;
  c.window = 3;
  c.sliding = {true, false, true};  // every other layer from layer 0
  c.extra_json += R"(, "query_pre_attn_scalar": 12, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                     "sliding_window": 3)";
  check_model(c, 23);
}

TEST_CASE("llm families: Gemma 2's windowed layers keep only the window in generate()'s cache", "[llm][families]") {
  TinyCfg c = gemma2_windowed();
  auto dir = temp_dir("gemma2_ring");
  Weights w = write_tiny_model(dir, c, DType::f32, 1, 31);
  auto m = models::load_causal_lm(dir.string());
  NoGradGuard ng;
  // Layers 0 and 2 rings of 3 positions, layer 1 (global) 32: (3 + 32 + 3) x keys and values.
  nn::KVCache cache = models::make_generation_cache(*m, 1, 32);
  CHECK(cache.nbytes() == (3 + 32 + 3) * 2 * c.kv_heads * c.head_dim * 4);
  CHECK_FALSE(cache.ring());
  CHECK(models::make_generation_cache(*m, 1, 32, true).nbytes() == 3 * 32 * 2 * c.kv_heads * c.head_dim * 4);
  CHECK(ring_decode_error(*m, c, w, cache, 14) <= 1e-5);
  std::filesystem::remove_all(dir);
}

TEST_CASE("llm families: Gemma 3 text", "[llm][families]") {
  TinyCfg c = gemma_base("gemma3_text");
  c.qk_norm = true;
  c.qpas = 8;
  c.window = 3;
  c.sliding = {true, false, true};  // sliding_window_pattern 2
  c.local_theta = 100.0;
  // Global layers: linear scaling by 2 of theta 10000.
  for (int64_t i = 0; i < c.head_dim / 2; ++i)
    c.inv_freq.push_back(std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim)) / 2);
  c.extra_json += R"(, "query_pre_attn_scalar": 8, "sliding_window": 3, "sliding_window_pattern": 2,
                     "rope_local_base_freq": 100.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                     "attn_logit_softcapping": null, "final_logit_softcapping": null)";
  check_model(c, 24);
}

TEST_CASE("llm families: yarn with partial rotary dims", "[llm][families][rope]") {
  TinyCfg c;
  c.head_dim = 8;
  // rotary dim 4 (partial 0.5): yarn over an original context of 4 with factor 3.
  const double d = 4, theta = 10000.0, factor = 3, orig = 4;
  auto corr = [&](double rot) { return d * std::log(orig / (rot * 2 * std::numbers::pi)) / (2 * std::log(theta)); };
  const double lo = std::max(std::floor(corr(32)), 0.0), hi = std::min(std::ceil(corr(1)), d - 1);
  for (int i = 0; i < 2; ++i) {
    const double f = std::pow(theta, -2.0 * i / d);
    const double ramp = std::clamp((i - lo) / (hi == lo ? 0.001 : hi - lo), 0.0, 1.0);
    c.inv_freq.push_back(f * (1 - ramp) + f / factor * ramp);
  }
  c.rope_scale = 0.1 * std::log(factor) + 1.0;
  c.extra_json = R"(, "partial_rotary_factor": 0.5, "rope_scaling": {"rope_type": "yarn", "factor": 3.0,
                    "original_max_position_embeddings": 4})";
  check_model(c, 25);
}

TEST_CASE("llm families: longrope uses the long factors past the original context", "[llm][families][rope]") {
  TinyCfg c;
  c.head_dim = 8;
  // Phi-3 style: original context 4 at the top level, max_position_embeddings 16 (scale 4); the
  // 9-token forward is past 4, so the long factors apply.
  const std::vector<double> lf{1.5, 2.0, 3.0, 5.0};
  for (int i = 0; i < 4; ++i) c.inv_freq.push_back(std::pow(10000.0, -2.0 * i / 8.0) / lf[static_cast<size_t>(i)]);
  c.rope_scale = std::sqrt(1 + std::log(4.0) / std::log(4.0));
  c.extra_json = R"(, "max_position_embeddings": 16, "original_max_position_embeddings": 4,
                    "rope_scaling": {"rope_type": "longrope", "short_factor": [1, 1, 1, 1], "long_factor": [1.5, 2.0, 3.0, 5.0]})";
  check_model(c, 26, /*check_decode=*/false);  // the frequencies change with the length, as in Transformers
}

TEST_CASE("llm families: compiled decoding with a sliding window and soft-capping", "[llm][families][compile]") {
  TinyCfg c = gemma_base("gemma2");
  c.qpas = 12;
  c.attn_cap = 2.0;
  c.final_cap = 3.0;
  c.window = 3;
  c.sliding = {true, false, true};
  c.extra_json += R"(, "query_pre_attn_scalar": 12, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                     "sliding_window": 3)";
  auto dir = temp_dir("gemma2_compiled");
  write_tiny_model(dir, c, DType::f32, 1, 27);
  auto m = models::load_causal_lm(dir.string());
  models::GenerationConfig g;
  g.max_new_tokens = 8;
  auto eager = models::generate(*m, {{3, 1, 4}, {2, 7}}, g);
  g.compile = true;
  auto compiled = models::generate(*m, {{3, 1, 4}, {2, 7}}, g);
  CHECK(eager == compiled);
  std::filesystem::remove_all(dir);
}

TEST_CASE("llm families: Gemma 2 on the chip: eager and compiled decoding equal the cpu", "[llm][families][codegen]") {
  testing::TinySim tiny;
  TinyCfg c = gemma_base("gemma2");
  c.qpas = 12;
  c.attn_cap = 2.0;
  c.final_cap = 3.0;
  c.window = 3;
  c.sliding = {true, false, true};
  c.extra_json += R"(, "query_pre_attn_scalar": 12, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                     "sliding_window": 3)";
  auto dir = temp_dir("gemma2_chip");
  write_tiny_model(dir, c, DType::f32, 1, 28);
  auto cpu_model = models::load_causal_lm(dir.string());
  auto chip_model = models::load_causal_lm(dir.string(), tiny.dev());
  std::filesystem::remove_all(dir);
  models::GenerationConfig g;
  g.max_new_tokens = 6;
  const std::vector<std::vector<int64_t>> prompts{{3, 1, 4, 1, 5}, {2, 7}};
  const auto want = models::generate(*cpu_model, prompts, g);
  const uint64_t fb0 = ops::total_fallbacks();  // eager prefill and decode run as chip programs
  CHECK(models::generate(*chip_model, prompts, g) == want);
  CHECK(ops::total_fallbacks() == fb0);
  g.compile = true;
  g.compile_name = "test_llm_families_gemma2_sim";
  testing::ChipRunProbe probe;
  CHECK(models::generate(*chip_model, prompts, g) == want);
  testing::ChipRunProbe::sync_all();
  for (const auto& f : ops::fallback_counts()) UNSCOPED_INFO("host fallback " << f.op << " x" << f.calls);
  CHECK(probe.new_fallbacks() == 0);  // the window and the cap inside the decode step's program
}

TEST_CASE("llm families: the serving engine serves sliding-window and soft-capped models as generate() does",
          "[llm][families][serve]") {
  // Mistral (every layer sliding: steps planned with the window) and Gemma 2 (alternating
  // windows, soft-capping, query_pre_attn_scalar), through the paged caches on the cpu: eager
  // (the host kernel) and compiled (the graph node); prompts and outputs past the window, in
  // chunks of at most 6 tokens with decodes in the same steps.
  TinyCfg mistral;
  mistral.model_type = "mistral";
  mistral.window = 4;
  mistral.sliding = {true, true};
  mistral.extra_json = R"(, "sliding_window": 4)";
  TinyCfg gemma = gemma2_windowed();
  for (const auto& [c, seed] : {std::pair{mistral, 29u}, std::pair{gemma, 31u}}) {
    auto dir = temp_dir(c.model_type + "_serve");
    write_tiny_model(dir, c, DType::f32, 1, seed);
    auto m = models::load_causal_lm(dir.string());
    std::filesystem::remove_all(dir);
    const std::vector<std::vector<int64_t>> prompts{{3, 1, 4, 1, 5, 9, 2, 6, 5}, {2, 7}, {8, 1, 8, 2, 8}};
    models::GenerationConfig g;
    g.max_new_tokens = 7;
    for (bool compile : {false, true}) {
      INFO(c.model_type << (compile ? " compiled" : " eager"));
      const auto got = serve_greedy(m, prompts, g, compile);
      for (size_t i = 0; i < prompts.size(); ++i) CHECK(got[i] == models::generate(*m, {prompts[i]}, g)[0]);
    }
  }
}

TEST_CASE("llm families: serving a model whose every layer slides holds only the window's blocks",
          "[llm][families][serve]") {
  // Mistral with a window of 4 in blocks of 4: one request of 9 prompt and 12 new tokens (20
  // positions cached). Without the window it would hold ceil(20 / 4) = 5 blocks at the end; with it, the blocks wholly before
  // the next position's window go back to the pool after every step, so at most the blocks of
  // positions (p - 4, p] plus a step's new tokens (chunks of 6 here: 3 + 6 positions over at
  // most 4 blocks) are held, and 2 once decoding. Gemma 2 (global layers) keeps every block.
  TinyCfg c;
  c.model_type = "mistral";
  c.window = 4;
  c.sliding = {true, true};
  c.extra_json = R"(, "sliding_window": 4)";
  auto dir = temp_dir("mistral_serve_blocks");
  write_tiny_model(dir, c, DType::f32, 1, 35);
  auto m = models::load_causal_lm(dir.string());
  std::filesystem::remove_all(dir);
  models::GenerationConfig g;
  g.max_new_tokens = 12;
  const std::vector<int64_t> prompt{3, 1, 4, 1, 5, 9, 2, 6, 5};
  for (bool compile : {false, true}) {
    int64_t peak = 0;
    CHECK(serve_greedy(m, {prompt}, g, compile, &peak)[0] == models::generate(*m, {prompt}, g)[0]);
    CHECK(peak <= 4);
  }
  // The same request through a model with global layers holds all its blocks.
  auto dir2 = temp_dir("gemma2_serve_blocks");
  write_tiny_model(dir2, gemma2_windowed(), DType::f32, 1, 36);
  auto gm = models::load_causal_lm(dir2.string());
  std::filesystem::remove_all(dir2);
  int64_t peak = 0;
  serve_greedy(gm, {prompt}, g, false, &peak);
  CHECK(peak == 5);
}

TEST_CASE("llm families: Gemma 2 and Mistral served on the chip equal cpu generate()", "[llm][families][serve][codegen]") {
  // The engine with the model on the tiny sim chip: the ragged paged attention program with the
  // window and soft-cap as constants (no host fallback).
  testing::TinySim tiny;
  TinyCfg mistral;
  mistral.model_type = "mistral";
  mistral.window = 5;
  mistral.sliding = {true, true};
  mistral.extra_json = R"(, "sliding_window": 5)";
  for (const auto& [c, seed] : {std::pair{gemma2_windowed(), 33u}, std::pair{mistral, 34u}}) {
    INFO(c.model_type);
    auto dir = temp_dir(c.model_type + "_serve_sim");
    write_tiny_model(dir, c, DType::f32, 1, seed);
    auto cpu_model = models::load_causal_lm(dir.string());
    auto chip_model = models::load_causal_lm(dir.string(), tiny.dev());
    std::filesystem::remove_all(dir);
    const std::vector<std::vector<int64_t>> prompts{{3, 1, 4, 1, 5, 9, 2, 6, 5}, {2, 7}};
    models::GenerationConfig g;
    g.max_new_tokens = 6;
    testing::ChipRunProbe probe;
    const auto got = serve_greedy(chip_model, prompts, g, false);
    testing::ChipRunProbe::sync_all();
    CHECK(probe.new_fallbacks() == 0);
    for (size_t i = 0; i < prompts.size(); ++i) CHECK(got[i] == models::generate(*cpu_model, {prompts[i]}, g)[0]);
  }
}

TEST_CASE("llm families: a multimodal Gemma 3 checkpoint runs as its text model (both weight layouts)",
          "[llm][families][gemma3]") {
  // Gemma3ForConditionalGeneration: config.json with model_type gemma3 and the text model in
  // text_config; the language model's tensors under language_model.model. (older Transformers)
  // or model.language_model. (newer), plus vision tensors that are not loaded. The forward
  // equals the reference of the text model.
  TinyCfg c = gemma_base("gemma3_text");
  c.qk_norm = true;
  c.qpas = 8;
  c.window = 3;
  c.sliding = {true, false, true};
  c.local_theta = 100.0;
  c.extra_json += R"(, "query_pre_attn_scalar": 8, "sliding_window": 3, "sliding_window_pattern": 2,
                     "rope_local_base_freq": 100.0)";
  auto dir = temp_dir("gemma3_mm");
  Weights w = write_tiny_model(dir, c, DType::f32, 1, 37);
  const std::map<std::string, Tensor> text = load_safetensors((dir / "model.safetensors").string());
  const std::vector<int64_t> ids{3, 1, 4, 1, 5, 9};
  const Logits want = ref_forward(c, w, ids, {0, 1, 2, 3, 4, 5});
  const std::string text_json = c.json();
  for (const char* layout : {"language_model.model.", "model.language_model."}) {
    INFO(layout);
    TensorList out;
    for (const auto& [name, t] : text) out.emplace_back(layout + name.substr(std::string("model.").size()), t);
    const std::string vision = std::string(layout).starts_with("model.") ? "model.vision_tower." : "vision_tower.";
    out.emplace_back(vision + "vision_model.embeddings.patch_embedding.weight", ones(Shape{4, 3}));
    out.emplace_back("multi_modal_projector.mm_soft_emb_norm.weight", ones(Shape{4}));
    save_safetensors((dir / "model.safetensors").string(), out);
    std::ofstream(dir / "config.json") << R"({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "image_token_index": 262144, "mm_tokens_per_image": 256, "vision_config": {"model_type": "siglip_vision_model"},
        "text_config": )" << text_json << "}";
    auto m = models::load_causal_lm(dir.string());
    CHECK(m->config.model_type == "gemma3_text");
    NoGradGuard ng;
    CHECK(rel_error(m->forward(row(ids)), want) <= 1e-5);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("llm families: gemma3's sparse text_config takes Gemma3TextConfig's defaults", "[llm][families][gemma3]") {
  // The shape of the published gemma-3-4b-it config.json: text_config lists only what differs
  // from Gemma3TextConfig (defaults: 8 heads, 4 KV heads, head_dim 256, vocab 262208,
  // query_pre_attn_scalar 256, rope_theta 1e6, local base 10000, pattern 6).
  const auto c = models::ModelConfig::from_json(R"({"architectures": ["Gemma3ForConditionalGeneration"],
      "boi_token_index": 255999, "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
      "mm_tokens_per_image": 256, "model_type": "gemma3",
      "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                      "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                      "sliding_window": 1024},
      "torch_dtype": "bfloat16", "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}})");
  CHECK(c.model_type == "gemma3_text");
  CHECK(c.hidden_size == 2560);
  CHECK(c.num_hidden_layers == 34);
  CHECK(c.num_attention_heads == 8);
  CHECK(c.num_key_value_heads == 4);
  CHECK(c.head_dim == 256);
  CHECK(c.vocab_size == 262208);
  CHECK(c.sliding_window == 1024);
  CHECK(c.is_sliding(4));
  CHECK_FALSE(c.is_sliding(5));  // every 6th layer is global
  CHECK(c.query_pre_attn_scalar == 256);
  CHECK(c.rope_theta == 1e6);
  CHECK(c.rope_local_base_freq == 10000);
  CHECK(c.rope_scaling.type == "linear");
  CHECK(c.rope_scaling.factor == 8.0);
  CHECK(c.tie_word_embeddings);
  CHECK(c.eos_token_ids == std::vector<int64_t>{1, 106});
  tpu::testing::expect_error([] { models::ModelConfig::from_json(R"({"model_type": "gemma3"})"); }, {"text_config"});
  tpu::testing::expect_error(
      [] { models::ModelConfig::from_json(R"({"model_type": "gemma3", "text_config": {"model_type": "llama"}})"); },
      {"gemma3_text"});
}

TEST_CASE("llm families: Gemma 3 in bf16 stays near the reference", "[llm][families]") {
  TinyCfg c = gemma_base("gemma3_text");
  c.qk_norm = true;
  c.window = 3;
  c.sliding = {true, false, true};
  c.local_theta = 100.0;
  c.qpas = 8;
  c.extra_json += R"(, "query_pre_attn_scalar": 8, "sliding_window": 3, "sliding_window_pattern": 2,
                     "rope_local_base_freq": 100.0)";
  auto dir = temp_dir("gemma3_bf16");
  Weights w = write_tiny_model(dir, c, DType::bf16, 1, 30);  // the reference reads the bf16 values
  auto m = models::load_causal_lm(dir.string(), Device(), DType::bf16);
  std::filesystem::remove_all(dir);
  const std::vector<int64_t> ids{3, 1, 4, 1, 5, 9};
  NoGradGuard ng;
  const double e = rel_error(m->forward(row(ids)), ref_forward(c, w, ids, {0, 1, 2, 3, 4, 5}));
  INFO("bf16 relative error " << e);
  // bf16 activations and rotary tables (8 significant bits) through 3 layers: a few percent;
  // a wrong block (scale, norm offset, window, rope base) is tens of percent.
  CHECK(e < 0.08);
}
