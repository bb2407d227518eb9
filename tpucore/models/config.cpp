// ModelConfig: a Hugging Face config.json parsed (strictly: missing or mistyped fields are errors
// naming the file and field) and written.
#include <nlohmann/json.hpp>
#include <set>

#include "tpucore/models/causal_lm.h"
#include "sim/json_int.h"

namespace tpu::models {

using json = nlohmann::json;

namespace {

// Field readers with errors naming the file and field.
int64_t get_int(const json& j, const char* key, const std::string& src, std::optional<int64_t> dflt = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    TPU_CHECK(dflt.has_value(), "{}: missing required field '{}'", src, key);
    return *dflt;
  }
  const std::optional<int64_t> v = tpu::detail::json_int(*it);
  TPU_CHECK(v.has_value(), "{}: field '{}' must be an integer in int64 range, got {}", src, key, it->dump());
  return *v;
}
double get_double(const json& j, const char* key, const std::string& src, double dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  TPU_CHECK(it->is_number(), "{}: field '{}' must be a number, got {}", src, key, it->dump());
  return it->get<double>();
}
bool get_bool(const json& j, const char* key, const std::string& src, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  TPU_CHECK(it->is_boolean(), "{}: field '{}' must be true or false, got {}", src, key, it->dump());
  return it->get<bool>();
}
std::string get_string(const json& j, const char* key, const std::string& src, const std::string& dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  TPU_CHECK(it->is_string(), "{}: field '{}' must be a string, got {}", src, key, it->dump());
  return it->get<std::string>();
}

}  // namespace

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& src) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON ({})", src, e.what());
  }
  TPU_CHECK(j.is_object(), "{}: expected a JSON object", src);
  ModelConfig c;
  c.model_type = get_string(j, "model_type", src, "llama");
  static const std::set<std::string> known{"llama", "mistral", "qwen2", "qwen3"};
  TPU_CHECK(known.count(c.model_type), "{}: unsupported model_type '{}' (supported: llama, mistral, qwen2, qwen3)", src,
            c.model_type);
  c.vocab_size = get_int(j, "vocab_size", src);
  c.hidden_size = get_int(j, "hidden_size", src);
  c.intermediate_size = get_int(j, "intermediate_size", src);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", src);
  c.num_attention_heads = get_int(j, "num_attention_heads", src);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", src, c.num_attention_heads);
  c.head_dim = get_int(j, "head_dim", src, 0);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", src, 2048);
  TPU_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0 &&
                c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim >= 0,
            "{}: sizes must be positive (vocab_size {}, hidden_size {}, intermediate_size {}, num_hidden_layers {}, "
            "num_attention_heads {}, num_key_value_heads {}, head_dim {})",
            src, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim);
  c.rope_theta = get_double(j, "rope_theta", src, 10000.0);
  c.rms_norm_eps = get_double(j, "rms_norm_eps", src, 1e-6);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", src, false);
  c.hidden_act = get_string(j, "hidden_act", src, "silu");
  c.torch_dtype = get_string(j, "torch_dtype", src, "float32");
  c.mlp_bias = get_bool(j, "mlp_bias", src, false);
  const bool attn_bias = get_bool(j, "attention_bias", src, false);
  if (c.model_type == "qwen2") {
    c.attention_bias = true;  // Qwen2 always has q/k/v biases and none on o_proj
  } else if (c.model_type == "llama" || c.model_type == "qwen3") {
    c.attention_bias = c.o_bias = attn_bias;
  }
  c.qk_norm = c.model_type == "qwen3";
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    TPU_CHECK(it->is_object(), "{}: rope_scaling must be an object or null", src);
    const std::string where = src + " rope_scaling";
    c.rope_scaling.type = get_string(*it, "rope_type", where, get_string(*it, "type", where, "default"));
    c.rope_scaling.factor = get_double(*it, "factor", where, 1.0);
    c.rope_scaling.low_freq_factor = get_double(*it, "low_freq_factor", where, 1.0);
    c.rope_scaling.high_freq_factor = get_double(*it, "high_freq_factor", where, 4.0);
    c.rope_scaling.original_max_position_embeddings =
        get_double(*it, "original_max_position_embeddings", where, 8192.0);
  }
  if (auto it = j.find("bos_token_id"); it != j.end() && it->is_number_integer()) {
    const std::optional<int64_t> v = tpu::detail::json_int(*it, 0);
    TPU_CHECK(v.has_value(), "{}: bos_token_id must be an id >= 0 in int64 range, got {}", src, it->dump());
    c.bos_token_id = *v;
  }
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    const auto id = [&](const json& e) {
      const std::optional<int64_t> v = tpu::detail::json_int(e, 0);
      TPU_CHECK(v.has_value(), "{}: eos_token_id entries must be ids >= 0 in int64 range, got {}", src, e.dump());
      return *v;
    };
    if (it->is_number_integer()) c.eos_token_ids.push_back(id(*it));
    else if (it->is_array())
      for (const auto& e : *it) c.eos_token_ids.push_back(id(e));
    else
      fail("{}: eos_token_id must be an integer or a list of integers, got {}", src, it->dump());
  }
  return c;
}

std::string ModelConfig::to_json() const {
  json j{{"model_type", model_type},
         {"architectures", {model_type == "qwen2" ? "Qwen2ForCausalLM"
                            : model_type == "qwen3" ? "Qwen3ForCausalLM"
                            : model_type == "mistral" ? "MistralForCausalLM"
                                                      : "LlamaForCausalLM"}},
         {"vocab_size", vocab_size},
         {"hidden_size", hidden_size},
         {"intermediate_size", intermediate_size},
         {"num_hidden_layers", num_hidden_layers},
         {"num_attention_heads", num_attention_heads},
         {"num_key_value_heads", num_key_value_heads},
         {"head_dim", head_dim},
         {"max_position_embeddings", max_position_embeddings},
         {"rope_theta", rope_theta},
         {"rms_norm_eps", rms_norm_eps},
         {"tie_word_embeddings", tie_word_embeddings},
         {"hidden_act", hidden_act},
         {"torch_dtype", torch_dtype},
         {"attention_bias", model_type == "qwen2" ? false : attention_bias},
         {"mlp_bias", mlp_bias}};
  if (rope_scaling.type != "default")
    j["rope_scaling"] = {{"rope_type", rope_scaling.type},
                         {"factor", rope_scaling.factor},
                         {"low_freq_factor", rope_scaling.low_freq_factor},
                         {"high_freq_factor", rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  else if (!eos_token_ids.empty()) j["eos_token_id"] = eos_token_ids;
  return j.dump(2);
}

}  // namespace tpu::models
