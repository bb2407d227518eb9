// Rotary scaling of every rope_type against the published formulas (Transformers'
// modeling_rope_utils semantics), evaluated here independently and at hand-checked points, and
// config.json's rope fields (v4 rope_scaling, v5 rope_parameters) and refused fields.
#include <catch2/catch.hpp>
#include <cmath>
#include <numbers>

#include "core/testing.h"
#include "tpucore/models.h"

using namespace tpu;
using tpu::testing::expect_error;

namespace {

std::vector<double> plain(int64_t dim, double theta) {
  std::vector<double> f;
  for (int64_t i = 0; i < dim / 2; ++i) f.push_back(1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(dim)));
  return f;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel = 1e-12) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("index " << i);
    CHECK(got[i] == Approx(want[i]).epsilon(rel));
  }
}

const char* kBase =
    R"({"model_type": "llama", "vocab_size": 11, "hidden_size": 16, "intermediate_size": 8,
        "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 16, "max_position_embeddings": 256)";

models::ModelConfig parse(const std::string& extra) { return models::ModelConfig::from_json(std::string(kBase) + extra + "}"); }

}  // namespace

TEST_CASE("rope: default, linear and dynamic NTK frequencies", "[llm][rope]") {
  nn::RopeScaling s;
  check_close(nn::rope_frequencies(16, 10000.0, s).inv_freq, plain(16, 10000.0));
  s.type = "linear";
  s.factor = 4;
  auto lin = plain(16, 500.0);
  for (double& v : lin) v /= 4;
  check_close(nn::rope_frequencies(16, 500.0, s).inv_freq, lin);
  // dynamic: unchanged up to the context, then base * (factor * L / ctx - (factor - 1))^(d / (d - 2)).
  s.type = "dynamic";
  s.factor = 2;
  check_close(nn::rope_frequencies(16, 10000.0, s, 64, 64).inv_freq, plain(16, 10000.0));
  check_close(nn::rope_frequencies(16, 10000.0, s, 64, 128).inv_freq, plain(16, 10000.0 * std::pow(3.0, 16.0 / 14.0)));
  CHECK(nn::rope_frequencies(16, 10000.0, s, 64, 128).attention_scaling == 1.0);
}

TEST_CASE("rope: yarn frequencies and attention factor", "[llm][rope]") {
  nn::RopeScaling s;
  s.type = "yarn";
  s.factor = 4;
  s.original_max_position_embeddings = 64;
  // The ramp over dims [floor(-0.994), ceil(2.016)] = [0, 3] (beta_fast 32, beta_slow 1, theta 1e4, d 16,
  // original context 64), evaluated from the published formula outside this code base.
  const std::vector<double> want{1.0, 0.23717082451262847, 0.05, 0.007905694150420948, 0.0025,
                                 0.0007905694150420948, 0.00025, 7.905694150420948e-05};
  auto f = nn::rope_frequencies(16, 10000.0, s, 256);
  check_close(f.inv_freq, want, 1e-12);
  CHECK(f.attention_scaling == Approx(0.1 * std::log(4.0) + 1.0).epsilon(1e-14));
  // mscale / mscale_all_dim (DeepSeek): the ratio of the two corrections; equal ones cancel.
  s.mscale = 1.0;
  s.mscale_all_dim = 1.0;
  CHECK(nn::rope_frequencies(16, 10000.0, s, 256).attention_scaling == Approx(1.0));
  s.mscale_all_dim = 0.5;
  CHECK(nn::rope_frequencies(16, 10000.0, s, 256).attention_scaling ==
        Approx((0.1 * std::log(4.0) + 1.0) / (0.05 * std::log(4.0) + 1.0)).epsilon(1e-14));
  s.attention_factor = 0.75;  // explicit wins
  CHECK(nn::rope_frequencies(16, 10000.0, s, 256).attention_scaling == 0.75);
  // Without factor: max_position_embeddings / original; without truncation the ramp's ends stay
  // fractional: low = max(-0.994, 0) = 0, high = 2.016.
  nn::RopeScaling t;
  t.type = "yarn";
  t.factor = 0;
  t.original_max_position_embeddings = 64;
  t.truncate = false;
  auto g = nn::rope_frequencies(16, 10000.0, t, 256);
  auto p = plain(16, 10000.0);
  const double lo = 0, hi = 16 * std::log(64 / (1 * 2 * std::numbers::pi)) / (2 * std::log(10000.0));
  for (size_t i = 0; i < p.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
    CHECK(g.inv_freq[i] == Approx(p[i] * (1 - ramp) + p[i] / 4 * ramp).epsilon(1e-12));
  }
}

TEST_CASE("rope: longrope switches factors past the original context", "[llm][rope]") {
  nn::RopeScaling s;
  s.type = "longrope";
  s.original_max_position_embeddings = 64;
  s.short_factor = {1, 1.5, 2, 3};
  s.long_factor = {2, 4, 8, 16};
  const auto p = plain(8, 10000.0);
  auto short_f = nn::rope_frequencies(8, 10000.0, s, 256, 64);
  auto long_f = nn::rope_frequencies(8, 10000.0, s, 256, 65);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(short_f.inv_freq[i] == Approx(p[i] / s.short_factor[i]));
    CHECK(long_f.inv_freq[i] == Approx(p[i] / s.long_factor[i]));
  }
  // scale = 256 / 64 = 4: sqrt(1 + ln 4 / ln 64).
  CHECK(long_f.attention_scaling == Approx(std::sqrt(1 + std::log(4.0) / std::log(64.0))).epsilon(1e-14));
  CHECK(short_f.attention_scaling == long_f.attention_scaling);
  s.long_factor.pop_back();
  expect_error([&] { nn::rope_frequencies(8, 10000.0, s, 256, 65); }, {"longrope", "long_factor", "4 entries"});
}

TEST_CASE("rope: partial rotary dims, tables with attention scaling", "[llm][rope]") {
  nn::RopeScaling s;
  s.partial_rotary_factor = 0.5;
  CHECK(nn::rope_rotary_dim(16, s) == 8);
  check_close(nn::rope_frequencies(16, 10000.0, s).inv_freq, plain(8, 10000.0));
  s.partial_rotary_factor = 0.3;  // int(4.8) = 4
  CHECK(nn::rope_rotary_dim(16, s) == 4);
  s.partial_rotary_factor = 0.2;  // int(3.2) = 3: odd
  expect_error([&] { nn::rope_rotary_dim(16, s); }, {"partial_rotary_factor", "even"});
  auto [c, sn] = nn::rope_tables({0, 3}, 1, {0.5, 0.25}, DType::f32, Device(), 1.5);
  REQUIRE(c.shape() == Shape({1, 1, 2, 4}));
  auto cv = c.to_vector<float>(), sv = sn.to_vector<float>();
  CHECK(cv[4] == Approx(1.5 * std::cos(1.5)));
  CHECK(cv[6] == Approx(1.5 * std::cos(1.5)));
  CHECK(sv[5] == Approx(1.5 * std::sin(0.75)));
  CHECK(cv[0] == Approx(1.5));
  expect_error([] { nn::rope_frequencies(8, 1e4, nn::RopeScaling{"su", 2.0}); }, {"rope_type", "'su'"});
}

TEST_CASE("config: rope_scaling and rope_parameters", "[llm][rope][config]") {
  auto a = parse(R"(, "rope_theta": 5000, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})");
  CHECK(a.rope_theta == 5000);
  CHECK(a.rope_scaling.type == "yarn");
  CHECK(a.rope_scaling.factor == 4.0);
  CHECK(a.rope_scaling.original_max_position_embeddings == 64);
  // Transformers v5: theta inside rope_parameters (a config without it ran at 10000 before).
  auto b = parse(R"(, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0})");
  CHECK(b.rope_theta == 1e6);
  CHECK(b.rope_scaling.type == "linear");
  auto m = std::make_shared<models::CausalLM>(b);
  auto want = plain(16, 1e6);
  for (double& v : want) v /= 2;
  check_close(m->inv_freq, want);
  CHECK(parse(R"(, "dtype": "bfloat16")").torch_dtype == "bfloat16");  // v5's name of torch_dtype
  auto c = parse(R"(, "partial_rotary_factor": 0.5, "rope_parameters": {"rope_type": "default", "rope_theta": 100.0})");
  CHECK(c.rope_scaling.partial_rotary_factor == 0.5);
  CHECK(std::make_shared<models::CausalLM>(c)->inv_freq.size() == 4);
  // Round trip through to_json.
  auto d = models::ModelConfig::from_json(a.to_json());
  CHECK(d.rope_scaling.type == "yarn");
  CHECK(d.rope_scaling.factor == 4.0);
  CHECK(d.rope_scaling.original_max_position_embeddings == 64);
  // Errors name the field.
  expect_error([] { parse(R"(, "rope_scaling": {"rope_type": "mrope", "factor": 2.0})"); }, {"rope_type", "mrope"});
  expect_error([] { parse(R"(, "rope_scaling": {"rope_type": "default", "mrope_section": [1, 2]})"); }, {"mrope_section"});
  expect_error([] { parse(R"(, "rope_scaling": {"rope_type": "linear"})"); }, {"linear", "factor"});
  expect_error([] { parse(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0})"); }, {"llama3", "low_freq_factor"});
  expect_error([] { parse(R"(, "rope_scaling": {"rope_type": "longrope", "short_factor": [1]})"); }, {"long_factor"});
}

TEST_CASE("config: math-changing fields that are not implemented are refused", "[llm][config]") {
  expect_error([] { parse(R"(, "quantization_config": {"quant_method": "fp8"})"); }, {"quantization_config"});
  expect_error([] { parse(R"(, "num_local_experts": 8)"); }, {"num_local_experts", "mixture of experts"});
  expect_error([] { parse(R"(, "attention_chunk_size": 8192)"); }, {"attention_chunk_size"});
  expect_error([] { parse(R"(, "final_logit_softcapping": 30.0)"); }, {"final_logit_softcapping", "llama"});
  expect_error([] { parse(R"(, "logits_scaling": 8.0)"); }, {"logits_scaling"});
  expect_error([] { parse(R"(, "hidden_act": "gelu_fast")"); }, {"hidden_act", "gelu_fast"});
  expect_error([] { parse(R"(, "model_type": "phi3")"); }, {"model_type", "phi3", "gemma3_text"});
  // A scaling factor that is not a positive number (the rope frequencies would divide by it).
  expect_error([] { parse(R"(, "rope_scaling": {"rope_type": "dynamic", "factor": 0.0})"); }, {"factor", "positive"});
  expect_error([] { parse(R"(, "rope_scaling": {"rope_type": "linear", "factor": -2.0})"); }, {"factor", "positive"});
  expect_error([] { parse(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 0})"); }, {"factor", "positive"});
  // Neutral values pass.
  CHECK_NOTHROW(parse(R"(, "quantization_config": null, "num_local_experts": 0, "logits_scaling": 1.0, "use_qk_norm": false)"));
  // layer_types: only full and sliding attention.
  auto lt = [](const std::string& kinds) {
    return models::ModelConfig::from_json(std::string(kBase) +
                                          R"(, "model_type": "qwen2", "use_sliding_window": true, "sliding_window": 4,
                                          "layer_types": )" + kinds + "}");
  };
  CHECK(lt(R"(["sliding_attention", "full_attention"])").is_sliding(0));
  CHECK_FALSE(lt(R"(["sliding_attention", "full_attention"])").is_sliding(1));
  expect_error([&] { lt(R"(["chunked_attention", "full_attention"])"); }, {"layer_types[0]", "chunked_attention"});
  expect_error([&] { lt(R"(["full_attention"])"); }, {"layer_types", "2 layer kinds"});
}

TEST_CASE("config: sliding windows per family", "[llm][config]") {
  const std::string base = R"({"vocab_size": 11, "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 6,
                               "num_attention_heads": 2, "head_dim": 8, "sliding_window": 5)";
  auto cfg = [&](const std::string& extra) { return models::ModelConfig::from_json(base + extra + "}"); };
  auto kinds = [](const models::ModelConfig& c) {
    std::string s;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) s += c.is_sliding(i) ? 'S' : 'F';
    return s;
  };
  CHECK(kinds(cfg(R"(, "model_type": "mistral")")) == "SSSSSS");
  // Without the field, Transformers' MistralConfig slides over 4096 positions; null: no window.
  const std::string no_window = R"({"vocab_size": 11, "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 2,
                                    "num_attention_heads": 2, "head_dim": 8, "model_type": )";
  CHECK(models::ModelConfig::from_json(no_window + R"("mistral"})").sliding_window == 4096);
  CHECK(models::ModelConfig::from_json(no_window + R"("mistral", "sliding_window": null})").sliding_window == 0);
  CHECK(models::ModelConfig::from_json(no_window + R"("mixtral"})").sliding_window == 0);
  CHECK(models::ModelConfig::from_json(no_window + R"("gemma2"})").sliding_window == 4096);
  CHECK(kinds(cfg(R"(, "model_type": "llama")")) == "FFFFFF");  // Llama has no sliding window
  CHECK(kinds(cfg(R"(, "model_type": "qwen2")")) == "FFFFFF");  // use_sliding_window defaults to false
  CHECK(kinds(cfg(R"(, "model_type": "qwen2", "use_sliding_window": true, "max_window_layers": 4)")) == "FFFFSS");
  CHECK(kinds(cfg(R"(, "model_type": "gemma2")")) == "SFSFSF");
  CHECK(kinds(cfg(R"(, "model_type": "gemma3_text", "sliding_window_pattern": 3)")) == "SSFSSF");
  CHECK(kinds(cfg(R"(, "model_type": "gemma3_text")")) == "SSSSSF");
  auto g3 = cfg(R"(, "model_type": "gemma3_text", "rope_parameters": {"full_attention": {"rope_type": "linear",
                 "factor": 8.0, "rope_theta": 1000000.0}, "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})");
  CHECK(g3.rope_scaling.type == "linear");
  CHECK(g3.rope_theta == 1e6);
  CHECK(g3.rope_local_base_freq == 1e4);
  CHECK(g3.sliding_window == 5);
  CHECK(g3.query_pre_attn_scalar == 256);
  CHECK(g3.tie_word_embeddings);
  CHECK(g3.hidden_act == "gelu_tanh");
  // Gemma's MLP uses hidden_activation (absent: gelu_pytorch_tanh), never hidden_act (as
  // Transformers): a hidden_act naming another function with no hidden_activation is refused by
  // name, not silently replaced.
  expect_error([&] { cfg(R"(, "model_type": "gemma2", "hidden_act": "gelu")"); }, {"hidden_act", "gelu", "hidden_activation"});
  CHECK(cfg(R"(, "model_type": "gemma3_text", "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh")").hidden_act ==
        "gelu_tanh");
  CHECK(cfg(R"(, "model_type": "gemma2", "hidden_act": "gelu_pytorch_tanh")").hidden_act == "gelu_tanh");
  CHECK(cfg(R"(, "model_type": "gemma2", "hidden_act": "gelu", "hidden_activation": "gelu")").hidden_act == "gelu");
  CHECK(cfg(R"(, "model_type": "gemma2", "hidden_activation": "gelu")").hidden_act == "gelu");
  auto g2 = cfg(R"(, "model_type": "gemma2")");
  CHECK(g2.attn_logit_softcapping == 50.0);
  CHECK(g2.final_logit_softcapping == 30.0);
}

TEST_CASE("config: an attention cache without the variants refuses a sliding window by name", "[llm][config]") {
  // The base AttentionCache only forwards plain attention.
  struct Plain : nn::AttentionCache {
    Tensor update_and_attend(int64_t, const Tensor& q, const Tensor&, const Tensor&, const Tensor&, double) override {
      return q;
    }
    int64_t num_layers() const override { return 1; }
  } cache;
  Tensor q = zeros({1, 1, 1, 4});
  nn::AttentionVariant v;
  CHECK(cache.update_and_attend_variant(0, q, q, q, {}, 1.0, v).shape() == q.shape());
  v.window = 4;
  expect_error([&] { cache.update_and_attend_variant(0, q, q, q, {}, 1.0, v); }, {"sliding_window"});
  v.window = 0;
  v.softcap = 50;
  expect_error([&] { cache.update_and_attend_variant(0, q, q, q, {}, 1.0, v); }, {"attn_logit_softcapping"});
}
