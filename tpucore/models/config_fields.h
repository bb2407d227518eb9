// Readers of config.json fields with errors naming the file and field (config.cpp and the
// mixture-of-experts fields of moe_config.cpp), and the MoE part of the config parser.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "sim/json_int.h"
#include "tpucore/models/causal_lm.h"

namespace tpu::models {

namespace config_fields {

using json = nlohmann::json;

inline int64_t get_int(const json& j, const char* key, const std::string& src,
                       std::optional<int64_t> dflt = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    TPU_CHECK(dflt.has_value(), "{}: missing required field '{}'", src, key);
    return *dflt;
  }
  const std::optional<int64_t> v = tpu::detail::json_int(*it);
  TPU_CHECK(v.has_value(), "{}: field '{}' must be an integer in int64 range, got {}", src, key, it->dump());
  return *v;
}
inline double get_double(const json& j, const char* key, const std::string& src, double dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  TPU_CHECK(it->is_number(), "{}: field '{}' must be a number, got {}", src, key, it->dump());
  return it->get<double>();
}
inline bool get_bool(const json& j, const char* key, const std::string& src, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  TPU_CHECK(it->is_boolean(), "{}: field '{}' must be true or false, got {}", src, key, it->dump());
  return it->get<bool>();
}
inline std::string get_string(const json& j, const char* key, const std::string& src, const std::string& dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  TPU_CHECK(it->is_string(), "{}: field '{}' must be a string, got {}", src, key, it->dump());
  return it->get<std::string>();
}

}  // namespace config_fields

namespace detail {
/// Whether model_type is a mixture-of-experts family (mixtral, qwen3_moe, deepseek_v3).
bool is_moe_family(const std::string& model_type);
/// Whether the config reader of `model_type` reads field `key` itself (DeepSeek-V3's
/// n_routed_experts and rope_interleave), so the generic refusal of that field skips it.
bool moe_family_reads(const std::string& model_type, const std::string& key);
/// Refuses the mixture-of-experts families this library does not implement (deepseek_v3, qwen2_moe,
/// ...) with an error naming them; runs before the model_type check.
void refuse_unsupported_moe_family(const std::string& model_type, const std::string& src);
/// Reads the expert fields of a mixtral / qwen3_moe config (and refuses expert fields in any
/// other family's config, and routing fields no family here implements).
void parse_moe_fields(ModelConfig& c, const config_fields::json& j, const std::string& src);
/// Writes the expert fields back (ModelConfig::to_json).
void write_moe_fields(const ModelConfig& c, config_fields::json& j);
}  // namespace detail

}  // namespace tpu::models
