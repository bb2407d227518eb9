// The config-driven variants of the decoder family against the naive double reference of
// llm_reference.h on tiny random checkpoints in Hugging Face layout: Mistral's and Qwen2's sliding
// windows, Gemma 2 (sandwich (1 + w) norms, GELU-tanh, scaled embeddings, query_pre_attn_scalar,
// attention and final soft-capping, alternating windows), Gemma 3 (q/k norms, local rope base,
// window pattern, scaled global rope), yarn with partial rotary dims and longrope. Each: f32
// logits within 1e-5 relative error, KV-cache decoding equal to the full forward, greedy
// generation equal to the reference's argmax.
#include <catch2/catch.hpp>
#include <cmath>
#include <numbers>

#include "core/codegen_testing.h"
#include "core/llm_reference.h"
#include "core/testing.h"
#include "tpucore/autograd.h"
#include "tpucore/models.h"
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
  CHECK(models::generate(*chip_model, prompts, g) == want);
  g.compile = true;
  g.compile_name = "test_llm_families_gemma2_sim";
  CHECK(models::generate(*chip_model, prompts, g) == want);
}

TEST_CASE("llm families: the serving engine's paged cache refuses a sliding-window model by name", "[llm][families]") {
  TinyCfg c;
  c.model_type = "mistral";
  c.extra_json = R"(, "sliding_window": 4)";
  auto dir = temp_dir("mistral_serve");
  write_tiny_model(dir, c, DType::f32, 1, 29);
  auto m = models::load_causal_lm(dir.string());
  std::filesystem::remove_all(dir);
  serve::EngineConfig ec;
  ec.block_size = 4;
  ec.max_model_len = 32;
  serve::Engine e(m, ec);
  e.add_request({3, 1, 4, 1, 5}, serve::SamplingParams::from_generation_config(models::GenerationConfig{}), {});
  tpu::testing::expect_error([&] { e.step(); }, {"sliding_window"});
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
