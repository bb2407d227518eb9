// The mixture-of-experts families (Mixtral, Qwen3-MoE) on tiny random checkpoints written in
// Hugging Face layout (per-expert tensors), loaded by the normal loader, against the naive double
// reference of llm_reference.h / moe_reference.h: f32 logits within 1e-5 relative error, KV-cache
// decoding equal to the full forward, greedy generation equal to the reference's argmax, the
// forward under tpu::compile (one graph, no recompile for a new routing), and on the simulated
// chip; the config fields they refuse.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "core/codegen_testing.h"
#include "core/moe_reference.h"
#include "core/testing.h"
#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/models.h"
#include "tpucore/serve/engine.h"

using namespace tpu;
using namespace tpu::testing::llm;

namespace {

Logits rows_of(const Tensor& t) {
  const std::vector<float> v = to(t, DType::f32).to_vector<float>();
  const int64_t n = t.size(1), vocab = t.size(2);
  Logits r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[i].assign(v.begin() + i * vocab, v.begin() + (i + 1) * vocab);
  return r;
}

std::vector<int64_t> iota_pos(size_t n) {
  std::vector<int64_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<int64_t>(i);
  return p;
}

const std::vector<int64_t> kIds{3, 1, 4, 1, 5, 9, 2, 6, 5, 3};

// Full forward, cached decoding, greedy generation, compiled forward and a save/load round trip.
void check_moe_model(const TinyCfg& c, uint32_t seed) {
  auto dir = temp_dir(c.model_type);
  Weights w = write_tiny_model(dir, c, DType::f32, 2, seed);
  auto m = models::load_causal_lm(dir.string());
  NoGradGuard ng;
  const Tensor full = m->forward(row(kIds));
  const Logits want = ref_forward(c, w, kIds, iota_pos(kIds.size()));
  const double e = rel_error(full, want);
  INFO(c.model_type << ": relative error of the full forward " << e);
  CHECK(e <= 1e-5);
  // Prefill 4 tokens, then one token per step through the contiguous cache.
  nn::KVCache cache = m->make_cache(1, static_cast<int64_t>(kIds.size()));
  std::vector<Tensor> parts{m->forward(row({kIds.begin(), kIds.begin() + 4}), &cache)};
  for (size_t i = 4; i < kIds.size(); ++i) parts.push_back(m->forward(row({kIds[i]}), &cache));
  const double d = rel_error(cat(parts, 1), rows_of(full));
  INFO("relative error of cached decoding " << d);
  CHECK(d <= 1e-5);
  // Greedy: the reference picks each next token from its own full forward.
  std::vector<int64_t> seq{3, 1, 4}, ref_tokens;
  for (int step = 0; step < 6; ++step) {
    const Logits ref = ref_forward(c, w, seq, iota_pos(seq.size()));
    const std::vector<double>& last = ref.back();
    const auto t = static_cast<int64_t>(std::max_element(last.begin(), last.end()) - last.begin());
    ref_tokens.push_back(t);
    seq.push_back(t);
  }
  models::GenerationConfig g;
  g.max_new_tokens = 6;
  CHECK(models::generate(*m, {{3, 1, 4}}, g)[0] == ref_tokens);
  g.compile = true;
  g.compile_name = "test_llm_moe_" + c.model_type;
  CHECK(models::generate(*m, {{3, 1, 4}}, g)[0] == ref_tokens);
  // The forward as one compiled graph; other tokens (another routing) reuse it.
  auto f = compile([&](const Tensor& ids) { return m->forward(ids); },
                   CompileOptions{.name = "test_llm_moe_forward_" + c.model_type, .fullgraph = true});
  CHECK(rel_error(f(row(kIds)), want) <= 1e-5);
  std::vector<int64_t> other(kIds.rbegin(), kIds.rend());
  CHECK(rel_error(f(row(other)), ref_forward(c, w, other, iota_pos(other.size()))) <= 1e-5);
  const jit::Stats st = jit::stats();
  const jit::FunctionStats* fs = st.find("test_llm_moe_forward_" + c.model_type);
  REQUIRE(fs);
  CHECK(fs->compiles == 1);
  // Written back (per-expert tensors, as the Hub has them) and read into the same model.
  auto dir2 = temp_dir(c.model_type + "_saved");
  models::save_causal_lm(*m, dir2.string());
  const auto saved = load_safetensors((dir2 / "model.safetensors").string());
  std::set<std::string> names;
  for (const auto& [n, t] : saved) names.insert(n);
  std::set<std::string> hub;
  for (const auto& [n, s] : tiny_shapes(c)) hub.insert(n);
  CHECK(names == hub);
  CHECK(rel_error(models::load_causal_lm(dir2.string())->forward(row(kIds)), want) <= 1e-5);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir2);
}

TinyCfg mixtral() {
  TinyCfg c;
  make_moe(c, MoeSpec{.mixtral = true, .experts = 4, .top_k = 2, .inter = 12});
  return c;
}

}  // namespace

TEST_CASE("llm moe: Mixtral (block_sparse_moe, top-2 renormalized) matches the reference", "[llm][moe]") {
  check_moe_model(mixtral(), 41);
}

TEST_CASE("llm moe: Qwen3-MoE with q/k norms, raw top-k weights and dense mlp_only_layers", "[llm][moe]") {
  TinyCfg c;
  c.layers = 3;
  make_moe(c, MoeSpec{.mixtral = false, .experts = 6, .top_k = 3, .inter = 10, .norm_topk = false, .mlp_only = {1}});
  check_moe_model(c, 42);
}

TEST_CASE("llm moe: Qwen3-MoE with norm_topk_prob and decoder_sparse_step 2", "[llm][moe]") {
  TinyCfg c;
  c.layers = 4;
  c.tied = true;
  make_moe(c, MoeSpec{.mixtral = false, .experts = 5, .top_k = 2, .inter = 8, .norm_topk = true, .sparse_step = 2});
  auto dir = temp_dir("qwen3_moe_step");
  Weights w = write_tiny_model(dir, c, DType::f32, 1, 43);
  auto m = models::load_causal_lm(dir.string());
  std::filesystem::remove_all(dir);
  CHECK(!m->model->layers[0]->moe);  // layers 1 and 3 are sparse
  CHECK(m->model->layers[1]->moe);
  NoGradGuard ng;
  CHECK(rel_error(m->forward(row(kIds)), ref_forward(c, w, kIds, iota_pos(kIds.size()))) <= 1e-5);
}

TEST_CASE("llm moe: on the simulated chip, eager and compiled decoding equal the cpu", "[llm][moe][codegen]") {
  testing::TinySim tiny;
  TinyCfg qwen3;
  make_moe(qwen3, MoeSpec{.mixtral = false, .experts = 5, .top_k = 3, .inter = 8, .norm_topk = true});
  for (const auto& [name, c] : {std::pair{"mixtral", mixtral()}, std::pair{"qwen3_moe", qwen3}}) {
    CAPTURE(name);
    auto dir = temp_dir(std::string(name) + "_chip");
    write_tiny_model(dir, c, DType::f32, 1, 44);
    auto cpu_model = models::load_causal_lm(dir.string());
    auto chip_model = models::load_causal_lm(dir.string(), tiny.dev());
    std::filesystem::remove_all(dir);
    models::GenerationConfig g;
    g.max_new_tokens = 4;
    const std::vector<std::vector<int64_t>> prompts{{3, 1, 4, 1, 5}, {2, 7}};
    const auto want = models::generate(*cpu_model, prompts, g);
    // Host fallbacks on the chip so far (the device may have served earlier tests).
    auto fallbacks = [&] {
      uint64_t n = 0;
      for (const auto& f : ops::fallback_counts())
        if (f.device == tiny.dev()) n += f.calls;
      return n;
    };
    const uint64_t before = fallbacks();
    testing::ChipRunProbe::sync_all();
    const codegen::CodegenStats s0 = codegen::stats();
    CHECK(models::generate(*chip_model, prompts, g) == want);
    g.compile = true;
    g.compile_name = fmt::format("test_llm_moe_{}_sim", name);
    CHECK(models::generate(*chip_model, prompts, g) == want);
    // The whole model ran on the chip, the routing included (topk, moe_sort, then the grouped
    // products, the permute and the unpermute eagerly; the fused moe_ffn program compiled):
    // nothing on the host.
    CHECK(fallbacks() == before);
    testing::ChipRunProbe::sync_all();
    const codegen::CodegenStats s1 = codegen::stats();
    auto runs = [](const codegen::CodegenStats& s, const char* k) {
      return s.runs_by_kernel.count(k) ? s.runs_by_kernel.at(k) : uint64_t{0};
    };
    for (const char* k : {"topk", "moe_sort", "grouped_matmul", "moe_permute", "moe_unpermute", "moe_ffn"}) {
      CAPTURE(k);
      CHECK(runs(s1, k) > runs(s0, k));
    }
  }
}

TEST_CASE("llm moe: gradients reach the router and every routed expert", "[llm][moe][autograd]") {
  TinyCfg c = mixtral();
  auto dir = temp_dir("mixtral_grad");
  write_tiny_model(dir, c, DType::f32, 1, 45);
  auto m = models::load_causal_lm(dir.string());
  std::filesystem::remove_all(dir);
  m->train();
  sum(m->forward(row(kIds))).backward();
  auto& moe = *m->model->layers[0]->moe;
  REQUIRE(moe.gate->weight.grad().defined());
  REQUIRE(moe.experts->gate_up_proj.grad().defined());
  // An expert no token chose has a zero gradient; one that was chosen has a non-zero one.
  const Tensor norm = sum(abs(moe.experts->down_proj.grad()), {1, 2});
  const std::vector<float> per_expert = norm.to_vector<float>();
  float total = 0;
  for (float v : per_expert) total += v;
  CHECK(total > 0);
  CHECK(std::isfinite(total));
}

TEST_CASE("llm moe: router_aux_loss is the coefficient times the loss over every sparse layer", "[llm][moe]") {
  TinyCfg c = mixtral();  // router_aux_loss_coef 0.02
  auto dir = temp_dir("mixtral_aux");
  write_tiny_model(dir, c, DType::f32, 1, 47);
  auto m = models::load_causal_lm(dir.string());
  std::filesystem::remove_all(dir);
  m->forward(row(kIds));
  std::vector<Tensor> logits;
  for (const auto& l : m->model->layers) {
    REQUIRE(l->moe->router_logits.shape() == Shape({static_cast<int64_t>(kIds.size()), 4}));
    logits.push_back(l->moe->router_logits);
  }
  const double want = 0.02 * nn::load_balancing_loss(logits, 4, 2).item<double>();
  CHECK(std::abs(models::router_aux_loss(*m).item<double>() - want) <= 1e-7);
  TinyCfg dense;
  auto dir2 = temp_dir("llama_aux");
  write_tiny_model(dir2, dense, DType::f32, 1, 48);
  auto d = models::load_causal_lm(dir2.string());
  std::filesystem::remove_all(dir2);
  tpu::testing::expect_error([&] { models::router_aux_loss(*d); }, {"router_aux_loss", "no mixture-of-experts"});
}

TEST_CASE("llm moe: unsupported families and fields are refused by name", "[llm][moe][errors]") {
  const std::string base = R"({"vocab_size": 16, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
    "num_attention_heads": 2)";
  auto parse = [&](const std::string& extra) { return models::ModelConfig::from_json(base + extra + "}"); };
  using tpu::testing::expect_error;
  expect_error([&] { parse(R"(, "model_type": "deepseek_v2", "n_routed_experts": 8)"); },
               {"deepseek_v2", "not supported", "mixtral, qwen3_moe, deepseek_v3"});
  expect_error([&] { parse(R"(, "model_type": "qwen2_moe")"); }, {"qwen2_moe", "shared_expert_intermediate_size"});
  expect_error([&] { parse(R"(, "model_type": "qwen3_moe", "shared_expert_intermediate_size": 16)"); },
               {"shared_expert_intermediate_size", "not supported"});
  expect_error([&] { parse(R"(, "model_type": "qwen3_moe", "output_router_logits": true)"); },
               {"output_router_logits", "not supported"});
  expect_error([&] { parse(R"(, "model_type": "mixtral", "routed_scaling_factor": 2.5)"); },
               {"routed_scaling_factor"});
  expect_error([&] { parse(R"(, "model_type": "llama", "num_local_experts": 8)"); },
               {"num_local_experts", "model_type 'llama'"});
  expect_error([&] { parse(R"(, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 5)"); },
               {"num_experts_per_tok (5)", "[1, 4]"});
  expect_error([&] { parse(R"(, "model_type": "qwen3_moe", "mlp_only_layers": [3])"); }, {"mlp_only_layers", "[0, 1)"});
  // Accepted: the inference-neutral training fields as the Hub configs carry them.
  const models::ModelConfig q = parse(R"(, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 6, "router_aux_loss_coef": 0.001, "routed_scaling_factor": 1.0)");
  CHECK(q.is_sparse(0));
  CHECK(q.num_experts == 4);
  CHECK(q.moe_intermediate_size == 6);
  // Training with router jitter is refused when it would change the forward.
  const models::ModelConfig mx = parse(R"(, "model_type": "mixtral", "num_local_experts": 4,
    "router_jitter_noise": 0.1)");
  models::CausalLM m(mx);
  m.train();
  expect_error([&] { m.forward(row({1, 2})); }, {"router_jitter_noise", "not supported"});
  m.eval();
  NoGradGuard ng;
  CHECK(m.forward(row({1, 2})).size(2) == 16);
}

TEST_CASE("llm moe: a missing expert tensor is named as the checkpoint names it", "[llm][moe][errors]") {
  TinyCfg c = mixtral();
  auto dir = temp_dir("mixtral_missing");
  write_tiny_model(dir, c, DType::f32, 1, 46);
  TensorList kept;
  for (auto& [n, t] : load_safetensors((dir / "model.safetensors").string()))
    if (n != "model.layers.1.block_sparse_moe.experts.2.w3.weight") kept.emplace_back(n, t);
  save_safetensors((dir / "model.safetensors").string(), kept);
  tpu::testing::expect_error([&] { models::load_causal_lm(dir.string()); },
                             {"missing keys", "model.layers.1.block_sparse_moe.experts.2.w3.weight"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("llm moe: stacked expert tensors (Transformers v5 names) load too, not both forms", "[llm][moe]") {
  TinyCfg c = mixtral();
  auto dir = temp_dir("mixtral_v4");
  Weights w = write_tiny_model(dir, c, DType::f32, 1, 49);
  auto m = models::load_causal_lm(dir.string());
  // The model's own parameter names: experts.gate_up_proj / experts.down_proj stacked.
  auto dir2 = temp_dir("mixtral_v5");
  std::ofstream(dir2 / "config.json") << m->config.to_json();
  TensorList stacked;
  for (auto& [n, t] : m->named_parameters()) stacked.emplace_back(n, t.detach());
  save_safetensors((dir2 / "model.safetensors").string(), stacked);
  NoGradGuard ng;
  CHECK(rel_error(models::load_causal_lm(dir2.string())->forward(row(kIds)),
                  ref_forward(c, w, kIds, iota_pos(kIds.size()))) <= 1e-5);
  // A stacked tensor beside the per-expert ones of the same parameter is refused.
  TensorList both;
  for (auto& [n, t] : load_safetensors((dir / "model.safetensors").string())) both.emplace_back(n, t);
  both.emplace_back("model.layers.0.block_sparse_moe.experts.down_proj",
                    m->model->layers[0]->moe->experts->down_proj.detach());
  save_safetensors((dir / "model.safetensors").string(), both);
  tpu::testing::expect_error([&] { models::load_causal_lm(dir.string()); },
                             {"model.layers.0.block_sparse_moe.experts.down_proj", "both stacked and per expert"});
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir2);
}

TEST_CASE("llm moe: the serving engine's continuous batching equals generate()", "[llm][moe][serve]") {
  TinyCfg c;
  c.layers = 3;
  make_moe(c, MoeSpec{.mixtral = false, .experts = 6, .top_k = 2, .inter = 10, .norm_topk = true, .mlp_only = {0}});
  auto dir = temp_dir("qwen3_moe_serve");
  write_tiny_model(dir, c, DType::f32, 1, 50);
  auto m = models::load_causal_lm(dir.string());
  std::filesystem::remove_all(dir);
  serve::EngineConfig ec;
  ec.block_size = 4;
  ec.max_num_batched_tokens = 10;  // prompts prefilled in chunks beside the others' decodes
  ec.max_model_len = 40;
  serve::Engine e(m, ec);
  const std::vector<std::vector<int64_t>> prompts{{3, 1, 4, 1, 5, 9, 2, 6}, {2, 7}, {11, 30, 8, 5, 17}};
  std::map<int64_t, std::vector<int64_t>> out;
  std::vector<int64_t> ids;
  models::GenerationConfig g;
  g.max_new_tokens = 5;
  for (const auto& p : prompts) {
    auto id = std::make_shared<int64_t>(0);
    serve::RequestCallbacks cb;
    cb.on_token = [&out, id](int64_t t) {
      out[*id].push_back(t);
      return true;
    };
    *id = e.add_request(p, serve::SamplingParams::from_generation_config(g), cb);
    ids.push_back(*id);
  }
  for (int i = 0; i < 200 && e.has_work(); ++i) e.step();
  REQUIRE_FALSE(e.has_work());
  for (size_t i = 0; i < prompts.size(); ++i) CHECK(out[ids[i]] == models::generate(*m, {prompts[i]}, g)[0]);
}

TEST_CASE("llm moe: Mixtral in bf16 stays near the reference", "[llm][moe]") {
  TinyCfg c = mixtral();
  auto dir = temp_dir("mixtral_bf16");
  Weights w = write_tiny_model(dir, c, DType::bf16, 1, 51);  // the reference reads the bf16 values
  auto m = models::load_causal_lm(dir.string(), Device(), DType::bf16);
  std::filesystem::remove_all(dir);
  NoGradGuard ng;
  const double e = rel_error(m->forward(row(kIds)), ref_forward(c, w, kIds, iota_pos(kIds.size())));
  INFO("bf16 relative error " << e);
  // bf16 activations (8 significant bits) through 2 layers with the router in f32: about 1% here.
  CHECK(e < 0.03);
}

TEST_CASE("llm moe: router_z_loss is the mean squared logsumexp of the router logits", "[llm][moe]") {
  // Rows [0, 0] and [ln 3, 0]: logsumexp ln 2 and ln 4 = 2 ln 2; the mean of the squares 2.5 ln^2 2.
  const double l3 = std::log(3.0), l2 = std::log(2.0);
  Tensor a = from_vector(std::vector<float>{0.0f, 0.0f}, Shape{1, 2}).requires_grad_(true);
  Tensor b = from_vector(std::vector<float>{static_cast<float>(l3), 0.0f}, Shape{1, 2}).requires_grad_(true);
  Tensor z = nn::router_z_loss({a, b});
  CHECK(z.item<double>() == Approx(2.5 * l2 * l2).epsilon(1e-6));
  // d/dl[n, e] = (2 / N) logsumexp(l[n]) softmax(l[n])[e].
  z.backward();
  const std::vector<float> gb = b.grad().to_vector<float>();
  CHECK(gb[0] == Approx(2.0 / 2 * 2 * l2 * 0.75).epsilon(1e-5));
  CHECK(gb[1] == Approx(2.0 / 2 * 2 * l2 * 0.25).epsilon(1e-5));
  tpu::testing::expect_error([] { nn::router_z_loss({}); }, {"router_z_loss", "no router logits"});
  // router_z_loss_coef is read from config.json and adds its term to router_aux_loss.
  const models::ModelConfig q = models::ModelConfig::from_json(
      R"({"model_type": "qwen3_moe", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 8,
          "num_hidden_layers": 1, "num_attention_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
          "moe_intermediate_size": 6, "router_aux_loss_coef": 0.01, "router_z_loss_coef": 0.001})");
  CHECK(q.router_z_loss_coef == 0.001);
  Generator g(5);
  models::CausalLM m(q, &g);
  NoGradGuard ng;
  m.forward(row({1, 2, 3}));
  const Tensor lg = m.model->layers[0]->moe->router_logits;
  const double want = 0.01 * nn::load_balancing_loss({lg}, 4, 2).item<double>() + 0.001 * nn::router_z_loss({lg}).item<double>();
  CHECK(models::router_aux_loss(m).item<double>() == Approx(want).epsilon(1e-6));
}

namespace {
// Expert e's SwiGLU MLP of x with naive loops over the stacked weights.
std::vector<double> naive_expert(const nn::MoEExperts& ex, int64_t e, const std::vector<double>& x) {
  const int64_t h = ex.down_proj.size(1), f = ex.down_proj.size(2);
  const std::vector<float> gu = ex.gate_up_proj.to_vector<float>(), dn = ex.down_proj.to_vector<float>();
  std::vector<double> a(static_cast<size_t>(f)), out(static_cast<size_t>(h), 0.0);
  for (int64_t i = 0; i < f; ++i) {
    double gt = 0, up = 0;
    for (int64_t k = 0; k < h; ++k) {
      gt += gu[static_cast<size_t>((e * 2 * f + i) * h + k)] * x[static_cast<size_t>(k)];
      up += gu[static_cast<size_t>((e * 2 * f + f + i) * h + k)] * x[static_cast<size_t>(k)];
    }
    a[static_cast<size_t>(i)] = gt / (1.0 + std::exp(-gt)) * up;
  }
  for (int64_t j = 0; j < h; ++j)
    for (int64_t i = 0; i < f; ++i) out[static_cast<size_t>(j)] += dn[static_cast<size_t>((e * h + j) * f + i)] * a[static_cast<size_t>(i)];
  return out;
}
}  // namespace

TEST_CASE("llm moe: capacity-factor routing drops the slots over an expert's capacity in training", "[llm][moe]") {
  // 3 tokens, 2 experts, top-2, capacity factor 0.5: C = ceil(0.5 * 3 * 2 / 2) = 2 slots per expert.
  // The router gives logits (x0, -x0): tokens 0 and 1 prefer expert 0, token 2 expert 1. First
  // choices: expert 0 takes tokens 0, 1; expert 1 token 2. Second choices: token 0 -> expert 1
  // (its 2nd slot), token 1 -> expert 1 (full: dropped), token 2 -> expert 0 (full: dropped).
  nn::MoEConfig mc;
  mc.hidden = 2;
  mc.intermediate = 3;
  mc.num_experts = 2;
  mc.top_k = 2;
  mc.capacity_factor = 0.5;
  Generator gen(9);
  nn::SparseMoE moe(mc, &gen);
  {
    NoGradGuard ng;
    moe.gate->weight.copy_(from_vector(std::vector<float>{1, 0, -1, 0}, Shape{2, 2}));
  }
  const std::vector<float> xv{0.5f, -0.3f, 0.2f, 0.7f, -0.4f, 0.1f};
  const Tensor x = from_vector(xv, Shape{3, 2});
  moe.train();
  const std::vector<float> got = moe.forward(x).to_vector<float>();
  const std::vector<std::vector<int>> kept{{0, 1}, {0}, {1}};
  for (int t = 0; t < 3; ++t) {
    const std::vector<double> xt{xv[static_cast<size_t>(2 * t)], xv[static_cast<size_t>(2 * t + 1)]};
    const double p0 = 1.0 / (1.0 + std::exp(-2.0 * xt[0]));  // softmax of (x0, -x0)
    std::vector<double> want(2, 0.0);
    for (int e : kept[static_cast<size_t>(t)]) {
      const std::vector<double> y = naive_expert(*moe.experts, e, xt);
      for (int j = 0; j < 2; ++j) want[static_cast<size_t>(j)] += (e == 0 ? p0 : 1 - p0) * y[static_cast<size_t>(j)];
    }
    for (int j = 0; j < 2; ++j) CHECK(got[static_cast<size_t>(2 * t + j)] == Approx(want[static_cast<size_t>(j)]).margin(1e-6));
  }
  // Evaluation is dropless: token 1 gets both experts.
  moe.eval();
  const std::vector<float> ev = moe.forward(x).to_vector<float>();
  const std::vector<double> x1{xv[2], xv[3]};
  const double p0 = 1.0 / (1.0 + std::exp(-2.0 * x1[0]));
  const std::vector<double> y0 = naive_expert(*moe.experts, 0, x1), y1 = naive_expert(*moe.experts, 1, x1);
  for (int j = 0; j < 2; ++j) CHECK(ev[static_cast<size_t>(2 + j)] == Approx(p0 * y0[static_cast<size_t>(j)] + (1 - p0) * y1[static_cast<size_t>(j)]).margin(1e-6));
  mc.capacity_factor = -1;
  tpu::testing::expect_error([&] { nn::SparseMoE bad(mc); }, {"capacity_factor", "negative"});
}
