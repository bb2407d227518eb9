// The decoder family against the naive double reference of llm_reference.h, on tiny random
// models the tests write in Hugging Face layout: Llama 3 (GQA, head_dim != hidden / heads,
// llama3 rope scaling, tied embeddings, bf16 shards), Qwen2 (q/k/v biases, f32 file), Qwen3
// (q/k norm, f16 weights), Mistral (plain GQA). Also: KV-cache decoding equals the full
// forward, building blocks on their own, and malformed checkpoints as named errors.
#include <catch2/catch.hpp>

#include "core/llm_reference.h"
#include "core/testing.h"
#include "tpucore/models.h"

using namespace tpu;
using namespace tpu::testing::llm;
using tpu::testing::expect_error;

namespace {

void check_logits(const Tensor& got, const std::vector<std::vector<std::vector<double>>>& want, double tol) {
  REQUIRE(got.dim() == 3);
  std::vector<float> g = to(got, DType::f32).to_vector<float>();
  const int64_t T = got.size(1), V = got.size(2);
  double worst = 0;
  for (size_t b = 0; b < want.size(); ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, std::abs(g[(b * T + t) * V + v] - want[b][t][v]));
  INFO("worst abs error " << worst);
  CHECK(worst < tol);
}

Tensor ids_tensor(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return from_vector(flat, Shape{static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, DType::i64);
}

void check_family(const TinyCfg& c, DType file_dtype, int shards, uint32_t seed) {
  auto dir = temp_dir(c.model_type);
  Weights w = write_tiny_model(dir, c, file_dtype, shards, seed);
  auto m = models::load_causal_lm(dir.string());
  CHECK(m->dtype() == DType::f32);
  const std::vector<std::vector<int64_t>> rows{{1, 5, 9, 36, 0, 2}, {7, 7, 3, 30, 12, 4}};
  Tensor logits = m->forward(ids_tensor(rows));
  CHECK(logits.shape() == Shape{2, 6, c.vocab});
  std::vector<std::vector<std::vector<double>>> want;
  for (const auto& r : rows) want.push_back(ref_forward(c, w, r, {0, 1, 2, 3, 4, 5}));
  check_logits(logits, want, 2e-4);

  // Prefill 4 tokens, then decode 2 one at a time through the cache: same logits.
  nn::KVCache cache = m->make_cache(2, 8);
  Tensor ids = ids_tensor(rows);
  Tensor pre = m->forward(slice(ids, 1, 0, 4), &cache);
  CHECK(cache.length() == 4);
  std::vector<Tensor> steps{pre};
  for (int64_t t = 4; t < 6; ++t) steps.push_back(m->forward(slice(ids, 1, t, t + 1), &cache));
  check_logits(cat(steps, 1), want, 2e-4);
  std::filesystem::remove_all(dir);
}

}  // namespace

TEST_CASE("llm: Llama 3 with GQA, head_dim, llama3 rope scaling, tied embeddings, bf16 shards", "[llm][model]") {
  TinyCfg c;
  c.llama3 = true;
  c.tied = true;
  c.hidden = 20;  // head_dim 8 with 4 heads: q is 32 wide, hidden 20
  check_family(c, DType::bf16, 2, 1);
}

TEST_CASE("llm: Qwen2 with q/k/v biases, untied head, one f32 file", "[llm][model]") {
  TinyCfg c;
  c.model_type = "qwen2";
  c.qkv_bias = true;
  c.theta = 1000000.0;
  check_family(c, DType::f32, 1, 2);
  // The same checkpoint computed in bf16 (parameters converted at load) stays near the reference.
  auto dir = temp_dir("bf16");
  Weights w = write_tiny_model(dir, c, DType::f32, 1, 2);
  auto m = models::load_causal_lm(dir.string(), Device(), DType::bf16);
  CHECK(m->dtype() == DType::bf16);
  Tensor logits = m->forward(ids_tensor({{1, 5, 9, 36}}));
  CHECK(logits.dtype() == DType::bf16);
  // bf16 keeps 8 significant bits (0.4% per rounding) through two layers; logits here reach
  // a few units, the worst error seen is 0.08.
  check_logits(logits, {ref_forward(c, w, {1, 5, 9, 36}, {0, 1, 2, 3})}, 0.25);
  std::filesystem::remove_all(dir);
}

TEST_CASE("llm: Qwen3 with q/k RMSNorm, f16 weights, three shards", "[llm][model]") {
  TinyCfg c;
  c.model_type = "qwen3";
  c.qk_norm = true;
  c.kv_heads = 1;
  check_family(c, DType::f16, 3, 3);
}

TEST_CASE("llm: Llama with attention_bias (q/k/v/o) and Mistral-style GQA", "[llm][model]") {
  TinyCfg c;
  c.qkv_bias = c.o_bias = true;
  check_family(c, DType::f32, 1, 4);
  TinyCfg m;
  m.model_type = "mistral";
  m.heads = 6;
  m.kv_heads = 2;
  m.head_dim = 4;
  check_family(m, DType::f32, 1, 5);
}

TEST_CASE("llm: the config reader keeps every field and save/load round trips", "[llm][model]") {
  TinyCfg c;
  c.llama3 = true;
  auto cfg = models::ModelConfig::from_json(c.json());
  CHECK(cfg.head_dim == 8);
  CHECK(cfg.num_key_value_heads == 2);
  CHECK(cfg.rope_scaling.type == "llama3");
  CHECK(cfg.rope_scaling.original_max_position_embeddings == 16);
  CHECK(cfg.eos_token_ids == std::vector<int64_t>{2, 3});
  CHECK(cfg.bos_token_id == 1);
  // Integer fields past int64 are errors naming the field, not numbers wrapped to -1 (an eos id of
  // -1 would never match, and generation would run past the end of text).
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string s = c.json();
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  const std::string huge = "18446744073709551615";
  expect_error([&] { models::ModelConfig::from_json(with("\"vocab_size\": 37", "\"vocab_size\": " + huge)); },
               {"vocab_size", huge});
  expect_error([&] { models::ModelConfig::from_json(with("\"eos_token_id\": [2, 3]", "\"eos_token_id\": [2, " + huge + "]")); },
               {"eos_token_id", huge});
  expect_error([&] { models::ModelConfig::from_json(with("\"bos_token_id\": 1", "\"bos_token_id\": " + huge)); },
               {"bos_token_id", huge});
  expect_error([&] { models::ModelConfig::from_json(with("\"vocab_size\": 37", "\"vocab_size\": 37.0")); },
               {"vocab_size", "integer"});
  auto dir = temp_dir("roundtrip");
  Weights w = write_tiny_model(dir, c, DType::f32, 1, 7);
  auto m = models::load_causal_lm(dir.string());
  auto dir2 = temp_dir("roundtrip2");
  models::save_causal_lm(*m, dir2.string());
  auto m2 = models::load_causal_lm(dir2.string());
  Tensor ids = ids_tensor({{3, 1, 4, 1, 5}});
  check_logits(m2->forward(ids), {ref_forward(c, w, {3, 1, 4, 1, 5}, {0, 1, 2, 3, 4})}, 2e-4);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir2);
}

TEST_CASE("llm: position ids offset the rotation", "[llm][model]") {
  TinyCfg c;
  auto dir = temp_dir("pos");
  Weights w = write_tiny_model(dir, c, DType::f32, 1, 8);
  auto m = models::load_causal_lm(dir.string());
  Tensor got = m->forward(ids_tensor({{4, 8, 15}}), nullptr, {10, 11, 12});
  check_logits(got, {ref_forward(c, w, {4, 8, 15}, {10, 11, 12})}, 2e-4);
  std::filesystem::remove_all(dir);
}

TEST_CASE("llm: building blocks: GatedMLP, rope scaling, KV cache limits", "[llm][nn]") {
  Generator g(3);
  nn::GatedMLP mlp(3, 5, "silu", false, &g);
  Tensor x = from_vector(std::vector<float>{0.5f, -1.0f, 2.0f}, Shape{1, 3});
  std::vector<float> gw = mlp.gate_proj->weight.to_vector<float>(), uw = mlp.up_proj->weight.to_vector<float>(),
                     dw = mlp.down_proj->weight.to_vector<float>(), xv = x.to_vector<float>();
  std::vector<double> hmid(5);
  for (int i = 0; i < 5; ++i) {
    double a = 0, b = 0;
    for (int j = 0; j < 3; ++j) a += gw[i * 3 + j] * xv[j], b += uw[i * 3 + j] * xv[j];
    hmid[i] = a / (1 + std::exp(-a)) * b;
  }
  std::vector<float> y = mlp.forward(x).to_vector<float>();
  for (int o = 0; o < 3; ++o) {
    double s = 0;
    for (int i = 0; i < 5; ++i) s += dw[o * 5 + i] * hmid[i];
    CHECK(y[o] == Approx(s).epsilon(1e-5).margin(1e-6));
  }
  // Llama 3.1's published scaling: factor 8, low 1, high 4, original 8192, theta 500000.
  nn::RopeScaling s{"llama3", 8.0, 1.0, 4.0, 8192};
  auto f = nn::rope_inv_freq(128, 500000.0, s);
  CHECK(f[0] == Approx(1.0));                                    // high frequency: unchanged
  CHECK(f[63] == Approx(std::pow(500000.0, -126.0 / 128) / 8));  // low frequency: divided by 8
  expect_error([] { nn::rope_inv_freq(8, 1e4, nn::RopeScaling{"ntk-by-parts", 2.0}); }, {"rope_type", "ntk-by-parts"});
  nn::KVCache cache(1, 1, 2, 3, 4, DType::f32);
  Tensor kv = zeros({1, 2, 2, 4});
  cache.update(0, kv, kv);
  cache.advance(2);
  expect_error([&] { cache.update(0, kv, kv); }, {"KVCache", "capacity 3"});
  expect_error([&] { cache.update(0, zeros({1, 3, 1, 4}), zeros({1, 3, 1, 4})); }, {"KVCache", "[1, 3, 1, 4]"});
}

TEST_CASE("llm: malformed checkpoints are named errors", "[llm][model][errors]") {
  TinyCfg c;
  auto dir = temp_dir("bad");
  write_tiny_model(dir, c, DType::f32, 1, 9);
  // A missing weight, an unexpected one, a wrong shape.
  auto sd = load_safetensors((dir / "model.safetensors").string());
  auto rewrite = [&](std::map<std::string, Tensor> m) { save_safetensors((dir / "model.safetensors").string(), m); };
  auto missing = sd;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  rewrite(missing);
  expect_error([&] { models::load_causal_lm(dir.string()); }, {"model.layers.1.mlp.up_proj.weight"});
  auto shaped = sd;
  shaped["model.norm.weight"] = zeros({5});
  rewrite(shaped);
  expect_error([&] { models::load_causal_lm(dir.string()); }, {"model.norm.weight"});
  rewrite(sd);
  std::ofstream(dir / "config.json") << "{\"model_type\": \"llama\", \"vocab_size\": 37}";
  expect_error([&] { models::load_causal_lm(dir.string()); }, {"config.json", "hidden_size"});
  std::ofstream(dir / "config.json") << "{\"model_type\": \"gpt_neox\"}";
  expect_error([&] { models::load_causal_lm(dir.string()); }, {"model_type", "gpt_neox"});
  std::ofstream(dir / "config.json") << "{not json";
  expect_error([&] { models::load_causal_lm(dir.string()); }, {"config.json", "invalid JSON"});
  std::ofstream(dir / "config.json") << c.json();
  std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": {\"model.norm.weight\": \"../x\"}}";
  expect_error([&] { models::load_causal_lm(dir.string()); }, {"weight_map", "../x"});
  std::filesystem::remove_all(dir);
  expect_error([&] { models::load_causal_lm(dir.string()); }, {"cannot open"});
  // Wrong input to forward.
  c.layers = 1;
  models::CausalLM m(models::ModelConfig::from_json(c.json()));
  expect_error([&] { m.forward(zeros({2, 3})); }, {"CausalLM", "f32"});
}
