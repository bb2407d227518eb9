// ModelConfig: a Hugging Face config.json parsed (strictly: missing or mistyped fields are errors
// naming the file and field) and written.
#include <nlohmann/json.hpp>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "tpucore/models/causal_lm.h"
#include "tpucore/models/config_fields.h"
#include "sim/json_int.h"

namespace tpu::models {

using json = nlohmann::json;

using namespace config_fields;

namespace {

// Hugging Face activation names (ACT2FN) -> nn::activation names.
std::string activation_name(const std::string& hf, const std::string& src, const char* key) {
  if (hf == "silu" || hf == "swish") return "silu";
  if (hf == "gelu") return "gelu";
  if (hf == "gelu_pytorch_tanh" || hf == "gelu_new" || hf == "gelu_tanh") return "gelu_tanh";
  if (hf == "relu") return "relu";
  fail("{}: unsupported {} '{}' (supported: silu, swish, gelu, gelu_pytorch_tanh, gelu_new, relu)", src, key, hf);
}

std::vector<double> get_doubles(const json& j, const char* key, const std::string& src) {
  std::vector<double> v;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return v;
  TPU_CHECK(it->is_array(), "{}: field '{}' must be a list of numbers, got {}", src, key, it->dump());
  for (const auto& e : *it) {
    TPU_CHECK(e.is_number(), "{}: field '{}' must be a list of numbers, got {}", src, key, it->dump());
    v.push_back(e.get<double>());
  }
  return v;
}

// One rope_scaling / rope_parameters object. theta: updated from its rope_theta when present.
nn::RopeScaling parse_rope(const json& r, const std::string& where, double& theta, double partial) {
  static const std::set<std::string> known{"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                                           "high_freq_factor", "original_max_position_embeddings", "beta_fast",
                                           "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate",
                                           "short_factor", "long_factor", "partial_rotary_factor",
                                           "finetuned"};  // finetuned: a yarn flag Transformers never reads
  TPU_CHECK(r.is_object(), "{} must be an object or null, got {}", where, r.dump());
  for (const auto& [k, v] : r.items())
    TPU_CHECK(known.count(k) || v.is_null(), "{}: unsupported field '{}' ({})", where, k, v.dump());
  nn::RopeScaling s;
  s.type = get_string(r, "rope_type", where, get_string(r, "type", where, "default"));
  const auto& types = nn::supported_rope_types();
  TPU_CHECK(std::find(types.begin(), types.end(), s.type) != types.end(), "{}: unsupported rope_type '{}' (supported: {})",
            where, s.type, fmt::join(types, ", "));
  theta = get_double(r, "rope_theta", where, theta);
  const bool needs_factor = s.type == "linear" || s.type == "dynamic" || s.type == "llama3";
  TPU_CHECK(!needs_factor || (r.contains("factor") && !r["factor"].is_null()), "{}: rope_type '{}' needs 'factor'",
            where, s.type);
  s.factor = get_double(r, "factor", where, s.type == "yarn" || s.type == "longrope" ? 0.0 : 1.0);
  TPU_CHECK(!r.contains("factor") || r["factor"].is_null() || (std::isfinite(s.factor) && s.factor > 0),
            "{}: 'factor' must be a positive number, got {}", where, s.factor);
  s.low_freq_factor = get_double(r, "low_freq_factor", where, 1.0);
  s.high_freq_factor = get_double(r, "high_freq_factor", where, 4.0);
  if (s.type == "llama3")
    for (const char* k : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      TPU_CHECK(r.contains(k) && !r[k].is_null(), "{}: rope_type 'llama3' needs '{}'", where, k);
  s.original_max_position_embeddings = get_double(r, "original_max_position_embeddings", where, 0.0);
  s.beta_fast = get_double(r, "beta_fast", where, 32.0);
  s.beta_slow = get_double(r, "beta_slow", where, 1.0);
  s.mscale = get_double(r, "mscale", where, 0.0);
  s.mscale_all_dim = get_double(r, "mscale_all_dim", where, 0.0);
  s.attention_factor = get_double(r, "attention_factor", where, 0.0);
  s.truncate = get_bool(r, "truncate", where, true);
  s.short_factor = get_doubles(r, "short_factor", where);
  s.long_factor = get_doubles(r, "long_factor", where);
  if (s.type == "longrope")
    TPU_CHECK(!s.short_factor.empty() && !s.long_factor.empty(), "{}: rope_type 'longrope' needs 'short_factor' and "
              "'long_factor'", where);
  s.partial_rotary_factor = get_double(r, "partial_rotary_factor", where, partial);
  return s;
}

// Fields of the decoder families' Transformers configs that change the computation and that this
// family does not implement: present with a value other than the neutral one, they are refused.
struct RefusedField {
  const char* key;
  const char* what;
};
constexpr RefusedField kRefused[] = {
    {"quantization_config", "quantized weights: load_causal_lm reads the formats it supports"},
    {"n_routed_experts", "DeepSeek's routed experts"},
    {"attention_chunk_size", "chunked attention"},
    {"no_rope_layers", "layers without rotary embeddings"},
    {"use_qk_norm", "Llama 4's q/k norm"},
    {"rope_interleave", "interleaved rotary pairs"},
    {"embedding_multiplier", "scaled embeddings (Granite)"},
    {"residual_multiplier", "scaled residuals (Granite)"},
    {"attention_multiplier", "a custom attention scale (Granite)"},
    {"logits_scaling", "scaled logits (Granite)"},
    {"use_bidirectional_attention", "bidirectional attention"},
};

// Whether a value is the neutral one (absent, null, false, 0, 1 for multipliers, empty).
bool neutral(const json& v, const char* key) {
  if (v.is_null()) return true;
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_number()) {
    const double d = v.get<double>();
    const std::string k = key;
    return k.ends_with("multiplier") || k.ends_with("scaling") ? d == 1.0 : d == 0.0;
  }
  if (v.is_array() || v.is_object()) return v.empty();
  return false;
}

// The layer kinds of layer_types (or of the family's default pattern).
void resolve_layers(ModelConfig& c, const json& j, const std::string& src) {
  const auto n = static_cast<size_t>(c.num_hidden_layers);
  c.sliding_layers.assign(n, false);
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    TPU_CHECK(it->is_array() && it->size() == n, "{}: layer_types must list {} layer kinds, got {}", src, n, it->dump());
    for (size_t i = 0; i < n; ++i) {
      const json& e = (*it)[i];
      TPU_CHECK(e.is_string() && (e == "full_attention" || e == "sliding_attention"),
                "{}: unsupported layer_types[{}] {} (supported: full_attention, sliding_attention)", src, i, e.dump());
      c.sliding_layers[i] = e == "sliding_attention";
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    if (c.model_type == "mistral") c.sliding_layers[i] = true;
    else if (c.model_type == "gemma2") c.sliding_layers[i] = (i + 1) % 2 != 0;
    else if (c.model_type == "gemma3_text") {
      const int64_t pattern =
          get_int(j, "sliding_window_pattern", src, get_int(j, "_sliding_window_pattern", src, 6));
      TPU_CHECK(pattern > 0, "{}: sliding_window_pattern must be positive, got {}", src, pattern);
      c.sliding_layers[i] = (static_cast<int64_t>(i) + 1) % pattern != 0;
    } else if (c.model_type == "mixtral") {
      c.sliding_layers[i] = true;  // as mistral
    } else if (c.model_type == "qwen2" || c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
      c.sliding_layers[i] = static_cast<int64_t>(i) >= get_int(j, "max_window_layers", src, 28);
    }
  }
}

// Gemma3ForConditionalGeneration's config (model_type gemma3): the text model's fields are in
// text_config, which Transformers completes with Gemma3TextConfig's defaults (published configs
// list only what differs, e.g. hidden_size and num_hidden_layers); the end-of-sequence ids,
// bos id and dtype may sit at the top level. The vision fields (vision_config,
// mm_tokens_per_image, image_token_index, ...) describe the image path, which is not
// implemented: the model is read as its text-only language model.
json gemma3_text_config(const json& j, const std::string& src) {
  auto it = j.find("text_config");
  TPU_CHECK(it != j.end() && it->is_object(), "{}: model_type 'gemma3' needs a 'text_config' object", src);
  json t = *it;
  const std::string inner = get_string(t, "model_type", src + " text_config", "gemma3_text");
  TPU_CHECK(inner == "gemma3_text", "{} text_config: model_type '{}' inside a gemma3 config (want gemma3_text)", src,
            inner);
  static const std::pair<const char*, json> kDefaults[] = {
      {"model_type", "gemma3_text"}, {"vocab_size", 262208}, {"hidden_size", 2304}, {"intermediate_size", 9216},
      {"num_hidden_layers", 26}, {"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"head_dim", 256},
      {"max_position_embeddings", 131072}, {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0},
      {"query_pre_attn_scalar", 256}, {"sliding_window", 4096}, {"rope_local_base_freq", 10000.0},
      {"hidden_activation", "gelu_pytorch_tanh"}, {"tie_word_embeddings", true}};
  for (const auto& [k, v] : kDefaults)
    if (!t.contains(k)) t[k] = v;
  for (const char* k : {"eos_token_id", "bos_token_id", "torch_dtype", "dtype"})
    if (!t.contains(k) && j.contains(k)) t[k] = j[k];
  return t;
}

}  // namespace

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> types{"llama",  "mistral",     "qwen2",   "qwen3",
                                              "gemma2", "gemma3_text", "mixtral", "qwen3_moe",
                                              "deepseek_v3"};
  return types;
}

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
  if (c.model_type == "gemma3") {
    return from_json(gemma3_text_config(j, src).dump(), src + " text_config");
  }
  detail::refuse_unsupported_moe_family(c.model_type, src);
  const auto& types = supported_model_types();
  TPU_CHECK(std::find(types.begin(), types.end(), c.model_type) != types.end(),
            "{}: unsupported model_type '{}' (supported: {})", src, c.model_type, fmt::join(types, ", "));
  c.gemma = c.model_type == "gemma2" || c.model_type == "gemma3_text";
  for (const auto& f : kRefused)
    if (auto it = j.find(f.key); it != j.end() && !detail::moe_family_reads(c.model_type, f.key))
      TPU_CHECK(neutral(*it, f.key), "{}: field '{}' = {} ({}) is not supported", src, f.key, it->dump(), f.what);
  if (!c.gemma)
    for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
                          "rope_local_base_freq"})
      if (auto it = j.find(k); it != j.end())
        TPU_CHECK(it->is_null(), "{}: field '{}' = {} is not supported for model_type '{}' (Gemma's)", src, k,
                  it->dump(), c.model_type);
  c.vocab_size = get_int(j, "vocab_size", src);
  c.hidden_size = get_int(j, "hidden_size", src);
  c.intermediate_size = get_int(j, "intermediate_size", src);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", src);
  c.num_attention_heads = get_int(j, "num_attention_heads", src);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", src, c.num_attention_heads);
  c.head_dim = get_int(j, "head_dim", src, c.gemma ? 256 : 0);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", src, c.gemma ? 8192 : 2048);
  TPU_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0 &&
                c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim >= 0,
            "{}: sizes must be positive (vocab_size {}, hidden_size {}, intermediate_size {}, num_hidden_layers {}, "
            "num_attention_heads {}, num_key_value_heads {}, head_dim {})",
            src, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim);
  TPU_CHECK(c.num_hidden_layers <= 100000, "{}: num_hidden_layers {} is out of range", src, c.num_hidden_layers);
  c.rope_theta = get_double(j, "rope_theta", src, c.model_type == "gemma3_text" ? 1000000.0 : 10000.0);
  c.rms_norm_eps = get_double(j, "rms_norm_eps", src, 1e-6);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", src, c.gemma);
  if (c.gemma) {
    // Gemma 2 / 3's MLP reads hidden_activation (absent: gelu_pytorch_tanh), as Transformers does;
    // it never reads their hidden_act. A hidden_act naming another function with no
    // hidden_activation beside it would silently run gelu_pytorch_tanh: refused by name.
    const std::string act = get_string(j, "hidden_act", src, "");
    const bool has_activation = j.contains("hidden_activation") && !j["hidden_activation"].is_null();
    c.hidden_act = activation_name(get_string(j, "hidden_activation", src, "gelu_pytorch_tanh"), src,
                                   "hidden_activation");
    TPU_CHECK(has_activation || act.empty() || activation_name(act, src, "hidden_act") == c.hidden_act,
              "{}: field 'hidden_act' = \"{}\" is not the activation of model_type '{}': its MLP uses "
              "hidden_activation (absent: gelu_pytorch_tanh); set hidden_activation", src, act, c.model_type);
  } else {
    c.hidden_act = activation_name(get_string(j, "hidden_act", src, "silu"), src, "hidden_act");
  }
  // Transformers v5 writes "dtype", v4 "torch_dtype".
  c.torch_dtype = get_string(j, "dtype", src, get_string(j, "torch_dtype", src, "float32"));
  c.mlp_bias = get_bool(j, "mlp_bias", src, false);
  const bool attn_bias = get_bool(j, "attention_bias", src, false);
  if (c.model_type == "qwen2") {
    c.attention_bias = true;  // Qwen2 always has q/k/v biases and none on o_proj
  } else if (c.model_type != "mistral" && c.model_type != "mixtral") {
    c.attention_bias = c.o_bias = attn_bias;  // Llama, Qwen3 (and its MoE), Gemma: q/k/v/o
  }
  c.qk_norm = c.model_type == "qwen3" || c.model_type == "qwen3_moe" || c.model_type == "gemma3_text";
  // Rope: v4's rope_theta + rope_scaling (+ partial_rotary_factor), or v5's rope_parameters (Gemma
  // 3: one entry per layer kind).
  const double partial = get_double(j, "partial_rotary_factor", src, 1.0);
  if (c.model_type == "gemma3_text") c.rope_local_base_freq = get_double(j, "rope_local_base_freq", src, 10000.0);
  c.rope_scaling.partial_rotary_factor = partial;
  auto rp = j.find("rope_parameters");
  if (rp != j.end() && !rp->is_null()) {
    TPU_CHECK(rp->is_object(), "{}: rope_parameters must be an object or null", src);
    if (rp->contains("full_attention") || rp->contains("sliding_attention")) {
      TPU_CHECK(c.model_type == "gemma3_text" || c.model_type == "gemma2",
                "{}: per-layer-kind rope_parameters are not supported for model_type '{}'", src, c.model_type);
      for (const auto& [kind, v] : rp->items())
        TPU_CHECK(kind == "full_attention" || kind == "sliding_attention",
                  "{}: unsupported rope_parameters entry '{}' (supported: full_attention, sliding_attention)", src, kind);
      if (rp->contains("full_attention"))
        c.rope_scaling = parse_rope((*rp)["full_attention"], src + " rope_parameters.full_attention", c.rope_theta, partial);
      if (rp->contains("sliding_attention")) {
        double local = c.model_type == "gemma3_text" ? c.rope_local_base_freq : c.rope_theta;
        const nn::RopeScaling ls =
            parse_rope((*rp)["sliding_attention"], src + " rope_parameters.sliding_attention", local, partial);
        TPU_CHECK(ls.type == "default", "{}: rope_parameters.sliding_attention: rope_type '{}' is not supported "
                  "(sliding layers rotate with the default rope)", src, ls.type);
        if (c.model_type == "gemma3_text") c.rope_local_base_freq = local;
        else TPU_CHECK(local == c.rope_theta, "{}: rope_parameters: different rope_theta per layer kind is not "
                       "supported for model_type '{}'", src, c.model_type);
      }
    } else {
      c.rope_scaling = parse_rope(*rp, src + " rope_parameters", c.rope_theta, partial);
    }
  } else if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    c.rope_scaling = parse_rope(*it, src + " rope_scaling", c.rope_theta, partial);
  }
  // Phi-3-style longrope keeps the original context at the top level.
  if (c.rope_scaling.type == "longrope" && c.rope_scaling.original_max_position_embeddings == 0)
    c.rope_scaling.original_max_position_embeddings = get_double(j, "original_max_position_embeddings", src, 0.0);
  // Sliding windows: Mistral's sliding_window on every layer; Qwen2/3's with use_sliding_window from
  // max_window_layers on; Gemma's on the sliding kinds of layer_types (or their default pattern).
  int64_t window = 0;
  const bool qwen = c.model_type == "qwen2" || c.model_type == "qwen3" || c.model_type == "qwen3_moe";
  if (c.model_type == "mistral" || c.model_type == "mixtral" || c.gemma ||
      (qwen && get_bool(j, "use_sliding_window", src, false)))
    // Absent, Transformers' defaults: 4096 for Mistral and Gemma, none for Mixtral and Qwen;
    // null: none.
    window = j.contains("sliding_window") ? get_int(j, "sliding_window", src, 0)
                                          : (c.gemma || c.model_type == "mistral" ? 4096 : 0);
  TPU_CHECK(window >= 0, "{}: sliding_window must be >= 0, got {}", src, window);
  c.sliding_window = window;
  resolve_layers(c, j, src);
  detail::parse_moe_fields(c, j, src);
  if (c.gemma) {
    c.query_pre_attn_scalar = get_double(j, "query_pre_attn_scalar", src, 256.0);
    const bool g2 = c.model_type == "gemma2";
    c.attn_logit_softcapping = get_double(j, "attn_logit_softcapping", src, g2 ? 50.0 : 0.0);
    c.final_logit_softcapping = get_double(j, "final_logit_softcapping", src, g2 ? 30.0 : 0.0);
    TPU_CHECK(c.query_pre_attn_scalar > 0 && c.attn_logit_softcapping >= 0 && c.final_logit_softcapping >= 0,
              "{}: query_pre_attn_scalar ({}) must be positive, attn_logit_softcapping ({}) and "
              "final_logit_softcapping ({}) not negative",
              src, c.query_pre_attn_scalar, c.attn_logit_softcapping, c.final_logit_softcapping);
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
  static const std::map<std::string, std::string> arch{
      {"llama", "LlamaForCausalLM"},   {"mistral", "MistralForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"},   {"gemma2", "Gemma2ForCausalLM"},   {"gemma3_text", "Gemma3ForCausalLM"},
      {"mixtral", "MixtralForCausalLM"}, {"qwen3_moe", "Qwen3MoeForCausalLM"},
      {"deepseek_v3", "DeepseekV3ForCausalLM"}};
  // Back to Transformers' activation names.
  const std::string act = hidden_act == "gelu_tanh" ? "gelu_pytorch_tanh" : hidden_act;
  json j{{"model_type", model_type},
         {"architectures", {arch.count(model_type) ? arch.at(model_type) : "LlamaForCausalLM"}},
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
         {gemma ? "hidden_activation" : "hidden_act", act},
         {"torch_dtype", torch_dtype},
         {"attention_bias", model_type == "qwen2" ? false : attention_bias},
         {"mlp_bias", mlp_bias}};
  const nn::RopeScaling& r = rope_scaling;
  if (r.partial_rotary_factor != 1.0) j["partial_rotary_factor"] = r.partial_rotary_factor;
  if (r.type != "default") {
    json o{{"rope_type", r.type}};
    if (r.factor > 0) o["factor"] = r.factor;
    if (r.type == "llama3") {
      o["low_freq_factor"] = r.low_freq_factor;
      o["high_freq_factor"] = r.high_freq_factor;
    }
    if (r.original_max_position_embeddings > 0) o["original_max_position_embeddings"] = r.original_max_position_embeddings;
    if (r.type == "yarn") {
      o["beta_fast"] = r.beta_fast;
      o["beta_slow"] = r.beta_slow;
      o["truncate"] = r.truncate;
      if (r.mscale > 0) o["mscale"] = r.mscale;
      if (r.mscale_all_dim > 0) o["mscale_all_dim"] = r.mscale_all_dim;
    }
    if (r.attention_factor > 0) o["attention_factor"] = r.attention_factor;
    if (r.type == "longrope") {
      o["short_factor"] = r.short_factor;
      o["long_factor"] = r.long_factor;
    }
    j["rope_scaling"] = o;
  }
  if (sliding_window > 0) {
    j["sliding_window"] = sliding_window;
    if (model_type == "qwen2" || model_type == "qwen3" || model_type == "qwen3_moe") j["use_sliding_window"] = true;
    json kinds = json::array();
    for (int64_t i = 0; i < num_hidden_layers; ++i) kinds.push_back(is_sliding(i) ? "sliding_attention" : "full_attention");
    if (model_type != "mistral" && model_type != "mixtral") j["layer_types"] = kinds;
  } else if (model_type == "mistral" || model_type == "mixtral") {
    j["sliding_window"] = nullptr;
  } else if (gemma) {
    j["sliding_window"] = 0;
  }
  if (gemma) {
    j["query_pre_attn_scalar"] = query_pre_attn_scalar;
    j["attn_logit_softcapping"] = attn_logit_softcapping > 0 ? json(attn_logit_softcapping) : json(nullptr);
    j["final_logit_softcapping"] = final_logit_softcapping > 0 ? json(final_logit_softcapping) : json(nullptr);
    if (model_type == "gemma3_text") j["rope_local_base_freq"] = rope_local_base_freq;
  }
  detail::write_moe_fields(*this, j);
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  else if (!eos_token_ids.empty()) j["eos_token_id"] = eos_token_ids;
  return j.dump(2);
}

}  // namespace tpu::models
