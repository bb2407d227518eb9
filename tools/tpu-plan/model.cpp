#include "tools/tpu-plan/model.h"

#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace tpu::plan {

double ModelShape::layer_params() const {
  const double E = double(hidden), D = double(head_dim);
  const double attn = E * D * double(heads) * 2 + E * D * double(kv_heads) * 2;  // q, o, k, v
  return attn + 3.0 * E * double(intermediate) + 2.0 * E;                        // gate, up, down, norms
}

double ModelShape::params() const {
  return double(layers) * layer_params() + double(vocab) * double(hidden) * (tied ? 1 : 2) + double(hidden);
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
      // For tests: small enough for the tiny chip preset.
      {"tiny", {"tiny", 64, 128, 2, 4, 2, 16, 256, false}},
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
  // MoE fields of the Hub's MoE families: a dense model has none of them.
  for (const char* f : {"num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size"})
    if (j.contains(f) && !j[f].is_null() && !(j[f].is_number() && j[f].get<double>() == 0))
      throw PlanError(fmt::format("{}: model_type '{}' is a mixture of experts ('{}' = {}); tpu-plan models dense "
                                  "decoders only (llama, qwen2, qwen3, mistral)",
                                  label, type, f, j[f].dump()));
  static const char* dense[] = {"llama", "qwen2", "qwen3", "mistral"};
  bool known = false;
  for (const char* d : dense) known = known || type == d;
  if (!known)
    throw PlanError(fmt::format("{}: unknown architecture model_type '{}'; tpu-plan models the dense decoders "
                                "llama, qwen2, qwen3 and mistral",
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
