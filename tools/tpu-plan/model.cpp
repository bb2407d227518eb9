#include "tools/tpu-plan/model.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace tpu::plan {

double ModelShape::attention_params() const {
  const double E = double(hidden), D = double(head_dim);
  if (mla()) {
    const double H = double(heads), qk = double(qk_nope_dim + qk_rope_dim), Q = double(q_lora_rank),
                 C = double(kv_lora_rank);
    const double q = q_lora_rank > 0 ? E * Q + Q * H * qk + Q : E * H * qk;   // q_a, its norm, q_b (or q_proj)
    const double kv = E * (C + double(qk_rope_dim)) + C + C * H * double(qk_nope_dim + v_head_dim);  // kv_a, norm, kv_b
    return q + kv + H * double(v_head_dim) * E + 2.0 * E;                       // o_proj, the two layer norms
  }
  return E * D * double(heads) * 2 + E * D * double(kv_heads) * 2 + 2.0 * E;  // q, o, k, v, the two norms
}

double ModelShape::kv_bytes_per_token_layer() const {
  if (mla()) return 2.0 * double(kv_lora_rank + qk_rope_dim);
  return 2.0 * 2 * double(kv_heads) * double(head_dim);
}

double ModelShape::layer_params() const { return attention_params() + 3.0 * double(hidden) * double(intermediate); }

double ModelShape::expert_params() const { return 3.0 * double(hidden) * double(expert_intermediate); }

double ModelShape::moe_layer_params() const {
  return attention_params() + double(hidden) * double(experts) + double(experts + shared_experts) * expert_params();
}

double ModelShape::moe_layer_active() const {
  return attention_params() + double(hidden) * double(experts) + double(top_k + shared_experts) * expert_params();
}

double ModelShape::body_params() const {
  return double(layers - moe_layers) * layer_params() + double(moe_layers) * (moe() ? moe_layer_params() : 0);
}

double ModelShape::body_active_params() const {
  return double(layers - moe_layers) * layer_params() + double(moe_layers) * (moe() ? moe_layer_active() : 0);
}

double ModelShape::params() const {
  return body_params() + double(vocab) * double(hidden) * (tied ? 1 : 2) + double(hidden);
}

double ModelShape::active_params() const {
  return body_active_params() + double(vocab) * double(hidden) * (tied ? 1 : 2) + double(hidden);
}

void ModelShape::validate() const {
  auto pos = [&](int64_t v, const char* field) {
    if (v <= 0) throw PlanError(fmt::format("model {}: {} must be a positive integer (got {})", name, field, v));
  };
  pos(hidden, "hidden_size");
  pos(intermediate, "intermediate_size");
  pos(layers, "num_hidden_layers");
  pos(heads, "num_attention_heads");
  pos(kv_heads, "num_key_value_heads");
  pos(head_dim, "head_dim");
  pos(vocab, "vocab_size");
  if (moe()) {
    pos(top_k, "num_experts_per_tok");
    pos(expert_intermediate, "the experts' intermediate size");
    if (top_k > experts)
      throw PlanError(fmt::format("model {}: num_experts_per_tok {} exceeds the {} experts", name, top_k, experts));
    if (moe_layers < 0 || moe_layers > layers)
      throw PlanError(fmt::format("model {}: {} MoE layers of {} layers", name, moe_layers, layers));
  }
  if (heads % kv_heads != 0)
    throw PlanError(fmt::format("model {}: num_attention_heads {} is not a multiple of num_key_value_heads {}", name,
                                heads, kv_heads));
}

namespace {
const std::map<std::string, ModelShape>& table() {
  static const std::map<std::string, ModelShape> m = {
      // Hub configs: Qwen/Qwen3-8B, meta-llama/Llama-3.1-8B, meta-llama/Meta-Llama-3-70B.
      {"qwen3-8b", {"qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, false}},
      {"llama3.1-8b", {"llama3.1-8b", 4096, 14336, 32, 32, 8, 128, 128256, false}},
      {"llama3-70b", {"llama3-70b", 8192, 28672, 80, 64, 8, 128, 128256, false}},
      // Hub configs: mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen3-30B-A3B (every layer sparse).
      {"mixtral-8x7b", {"mixtral-8x7b", 4096, 14336, 32, 32, 8, 128, 32000, false, 8, 2, 14336, 32}},
      {"qwen3-30b-a3b", {"qwen3-30b-a3b", 2048, 6144, 48, 32, 4, 128, 151936, false, 128, 8, 768, 48}},
      // Hub config: deepseek-ai/DeepSeek-V3 (61 layers, the first 3 dense; 256 routed experts,
      // top 8, one shared; MLA with q_lora_rank 1536, kv_lora_rank 512, head dims 128 + 64, v 128).
      {"deepseek-v3", {"deepseek-v3", 7168, 18432, 61, 128, 128, 192, 129280, false, 256, 8, 2048, 58, 1, 1536, 512, 128, 64, 128}},
      // For tests: small enough for the tiny chip preset.
      {"tiny", {"tiny", 64, 128, 2, 4, 2, 16, 256, false}},
      {"tiny-moe", {"tiny-moe", 64, 128, 2, 4, 2, 16, 256, false, 8, 2, 32, 2}},
      {"tiny-mla", {"tiny-mla", 64, 128, 3, 4, 4, 24, 256, false, 8, 2, 32, 2, 1, 32, 16, 16, 8, 16}},
  };
  return m;
}
}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> v;
  for (const auto& [k, s] : table()) v.push_back(k);
  return v;
}

ModelShape named_model(const std::string& name) {
  auto it = table().find(name);
  if (it == table().end())
    throw PlanError(fmt::format("unknown model '{}': a named shape ({}) or a path to a Hub config.json", name,
                                fmt::join(model_names(), ", ")));
  return it->second;
}

ModelShape model_from_config(const std::string& text, const std::string& label) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw PlanError(fmt::format("{}: not valid JSON ({})", label, e.what()));
  }
  if (!j.is_object()) throw PlanError(fmt::format("{}: expected a JSON object", label));
  const std::string type = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  static const char* dense[] = {"llama", "qwen2", "qwen3", "mistral"};
  bool is_dense = false;
  for (const char* d : dense) is_dense = is_dense || type == d;
  const bool mixtral = type == "mixtral", qwen3_moe = type == "qwen3_moe", deepseek = type == "deepseek_v3";
  // MoE fields on a dense family (or a family the planner does not model) are an error naming them.
  if (is_dense)
    for (const char* f : {"num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size"})
      if (j.contains(f) && !j[f].is_null() && !(j[f].is_number() && j[f].get<double>() == 0))
        throw PlanError(fmt::format("{}: model_type '{}' with the mixture-of-experts field '{}' = {}; tpu-plan models "
                                    "MoE as model_type mixtral or qwen3_moe",
                                    label, type, f, j[f].dump()));
  if (!is_dense && !mixtral && !qwen3_moe && !deepseek)
    throw PlanError(fmt::format("{}: unknown architecture model_type '{}'; tpu-plan models the dense decoders "
                                "llama, qwen2, qwen3 and mistral and the mixtures of experts mixtral, qwen3_moe and "
                                "deepseek_v3",
                                label, type.empty() ? "(missing)" : type));
  auto get = [&](const char* f) -> int64_t {
    if (!j.contains(f) || !j[f].is_number_integer())
      throw PlanError(fmt::format("{}: '{}' is missing or not an integer", label, f));
    return j[f].get<int64_t>();
  };
  ModelShape m;
  m.name = label;
  m.hidden = get("hidden_size");
  m.intermediate = get("intermediate_size");
  m.layers = get("num_hidden_layers");
  m.heads = get("num_attention_heads");
  m.kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null() ? get("num_key_value_heads") : m.heads;
  m.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? get("head_dim") : (m.heads > 0 ? m.hidden / m.heads : 0);
  m.vocab = get("vocab_size");
  m.tied = j.value("tie_word_embeddings", false);
  if (deepseek) {
    // Routed experts after first_k_dense_replace dense layers, every moe_layer_freq-th layer
    // sparse; MLA. The routing rule (sigmoid scores, the correction bias, group-limited top-k)
    // changes which experts a token meets, not the work of balanced routing.
    m.experts = get("n_routed_experts");
    m.top_k = get("num_experts_per_tok");
    m.expert_intermediate = get("moe_intermediate_size");
    m.shared_experts = j.contains("n_shared_experts") && !j["n_shared_experts"].is_null() ? get("n_shared_experts") : 0;
    const int64_t first = j.contains("first_k_dense_replace") ? get("first_k_dense_replace") : 0;
    const int64_t freq = j.contains("moe_layer_freq") ? get("moe_layer_freq") : 1;
    if (freq < 1) throw PlanError(fmt::format("{}: moe_layer_freq must be positive (got {})", label, freq));
    for (int64_t i = 0; i < m.layers; ++i)
      if (i >= first && i % freq == 0) ++m.moe_layers;
    m.q_lora_rank = j.contains("q_lora_rank") && !j["q_lora_rank"].is_null() ? get("q_lora_rank") : 0;
    m.kv_lora_rank = get("kv_lora_rank");
    m.qk_nope_dim = get("qk_nope_head_dim");
    m.qk_rope_dim = get("qk_rope_head_dim");
    m.v_head_dim = get("v_head_dim");
    m.head_dim = m.qk_nope_dim + m.qk_rope_dim;
  }
  if (mixtral) {  // every layer is sparse; intermediate_size is one expert's
    m.experts = get("num_local_experts");
    m.top_k = get("num_experts_per_tok");
    m.expert_intermediate = m.intermediate;
    m.moe_layers = m.layers;
  }
  if (qwen3_moe) {
    m.experts = get("num_experts");
    m.top_k = get("num_experts_per_tok");
    m.expert_intermediate = get("moe_intermediate_size");
    const int64_t step = j.contains("decoder_sparse_step") && !j["decoder_sparse_step"].is_null() ? get("decoder_sparse_step") : 1;
    if (step < 1) throw PlanError(fmt::format("{}: decoder_sparse_step must be positive (got {})", label, step));
    std::vector<int64_t> dense_only;
    if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
      if (!j["mlp_only_layers"].is_array()) throw PlanError(fmt::format("{}: mlp_only_layers is not a list", label));
      for (const auto& x : j["mlp_only_layers"]) {
        if (!x.is_number_integer()) throw PlanError(fmt::format("{}: mlp_only_layers holds {}, not a layer index", label, x.dump()));
        dense_only.push_back(x.get<int64_t>());
      }
    }
    // As Transformers builds Qwen3-MoE: layer i is sparse unless listed, when (i + 1) % step == 0.
    for (int64_t i = 0; i < m.layers; ++i)
      if (std::find(dense_only.begin(), dense_only.end(), i) == dense_only.end() && (i + 1) % step == 0) ++m.moe_layers;
    if (m.experts == 0) m.moe_layers = 0;
  }
  m.validate();
  return m;
}

ModelShape load_model(const std::string& s) {
  if (table().count(s)) return named_model(s);
  std::ifstream f(s);
  if (!f) {
    if (s.find('/') == std::string::npos && s.find(".json") == std::string::npos) return named_model(s);
    throw PlanError(fmt::format("cannot read the config '{}'", s));
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return model_from_config(ss.str(), s);
}

}  // namespace tpu::plan
