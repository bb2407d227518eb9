// The mixture-of-experts fields of config.json: DeepSeek-V3's (n_routed_experts,
// n_shared_experts, n_group, topk_group, routed_scaling_factor, first_k_dense_replace and the
// latent attention's kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
// rope_interleave), Mixtral's (num_local_experts,
// num_experts_per_tok; every layer sparse, top-k always renormalized) and Qwen3-MoE's
// (num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob, decoder_sparse_step,
// mlp_only_layers), and router_z_loss_coef (the router z-loss in models::router_aux_loss).
// Expert fields in a dense family's config, DeepSeek's routing variants (shared experts, grouped
// or sigmoid routing, scaled routing weights) in Mixtral's and Qwen3-MoE's, and the MoE families
// this library lacks are refused by name.
#include <algorithm>
#include <map>

#include "tpucore/models/config_fields.h"

namespace tpu::models::detail {

using namespace config_fields;

namespace {

// Routing variants of other MoE families: refused whenever present with a value that changes
// results (absent, null, false, 0, an empty list; routed_scaling_factor 1).
constexpr const char* kOtherRouting[][2] = {
    {"shared_expert_intermediate_size", "a shared expert beside the routed ones (Qwen2-MoE)"},
    {"n_shared_experts", "shared experts (DeepSeek)"},
    {"first_k_dense_replace", "dense first layers (DeepSeek)"},
    {"moe_layer_freq", "a sparse-layer period (DeepSeek)"},
    {"routed_scaling_factor", "scaled routing weights (DeepSeek)"},
    {"n_group", "group-limited routing (DeepSeek)"},
    {"topk_group", "group-limited routing (DeepSeek)"},
    {"topk_method", "DeepSeek's top-k methods"},
    {"scoring_func", "sigmoid routing scores (DeepSeek)"},
};

bool neutral_value(const json& v, const std::string& key) {
  if (v.is_null()) return true;
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_number()) return v.get<double>() == (key == "routed_scaling_factor" ? 1.0 : 0.0);
  if (v.is_array() || v.is_object()) return v.empty();
  return false;
}

}  // namespace

bool is_moe_family(const std::string& t) { return t == "mixtral" || t == "qwen3_moe" || t == "deepseek_v3"; }

bool moe_family_reads(const std::string& t, const std::string& key) {
  return t == "deepseek_v3" && (key == "n_routed_experts" || key == "rope_interleave");
}

namespace {

// DeepSeek-V3 (Transformers' DeepseekV3Config names and defaults): routed and shared experts with
// sigmoid group-limited routing from layer first_k_dense_replace on, multi-head latent attention.
void parse_deepseek_fields(ModelConfig& c, const json& j, const std::string& src) {
  // The routing variants of DeepSeek's own modeling code that Transformers' implementation
  // fixes: anything but its one choice is refused.
  const std::pair<const char*, const char*> fixed[] = {{"topk_method", "noaux_tc"}, {"scoring_func", "sigmoid"}};
  for (const auto& [key, want] : fixed)
    if (auto it = j.find(key); it != j.end() && !it->is_null())
      TPU_CHECK(it->is_string() && *it == want, "{}: field '{}' = {} is not supported for model_type 'deepseek_v3' "
                "(supported: \"{}\")", src, key, it->dump(), want);
  TPU_CHECK(get_int(j, "moe_layer_freq", src, 1) == 1, "{}: field 'moe_layer_freq' other than 1 (a sparse-layer "
            "period) is not supported for model_type 'deepseek_v3'", src);
  TPU_CHECK(get_int(j, "ep_size", src, 1) == 1, "{}: field 'ep_size' other than 1 is not supported in config.json "
            "(expert parallelism is nn::parallel::expert_parallel)", src);
  TPU_CHECK(!c.mlp_bias, "{}: field 'mlp_bias' = true is not supported for model_type 'deepseek_v3'", src);
  c.num_experts = get_int(j, "n_routed_experts", src, 256);
  c.num_experts_per_tok = get_int(j, "num_experts_per_tok", src, 8);
  c.moe_intermediate_size = get_int(j, "moe_intermediate_size", src, 2048);
  c.n_shared_experts = get_int(j, "n_shared_experts", src, 1);
  c.n_group = get_int(j, "n_group", src, 8);
  c.topk_group = get_int(j, "topk_group", src, 4);
  c.routed_scaling_factor = get_double(j, "routed_scaling_factor", src, 2.5);
  c.norm_topk_prob = get_bool(j, "norm_topk_prob", src, true);
  c.first_k_dense_replace = get_int(j, "first_k_dense_replace", src, 3);
  c.kv_lora_rank = get_int(j, "kv_lora_rank", src, 512);
  c.q_lora_rank = get_int(j, "q_lora_rank", src, 1536);  // null: a plain q_proj (0)
  if (auto it = j.find("q_lora_rank"); it != j.end() && it->is_null()) c.q_lora_rank = 0;
  c.qk_nope_head_dim = get_int(j, "qk_nope_head_dim", src, 128);
  c.qk_rope_head_dim = get_int(j, "qk_rope_head_dim", src, 64);
  c.v_head_dim = get_int(j, "v_head_dim", src, 128);
  c.rope_interleave = get_bool(j, "rope_interleave", src, true);
  TPU_CHECK(c.num_experts >= 1 && c.num_experts_per_tok >= 1 && c.moe_intermediate_size > 0 && c.n_shared_experts >= 0 &&
                c.first_k_dense_replace >= 0,
            "{}: n_routed_experts ({}), num_experts_per_tok ({}) and moe_intermediate_size ({}) must be positive, "
            "n_shared_experts ({}) and first_k_dense_replace ({}) not negative", src, c.num_experts,
            c.num_experts_per_tok, c.moe_intermediate_size, c.n_shared_experts, c.first_k_dense_replace);
  const int64_t per = c.n_group >= 1 && c.num_experts % c.n_group == 0 ? c.num_experts / c.n_group : 0;
  TPU_CHECK(per > 0 && (c.n_group == 1 || per >= 2) && c.topk_group >= 1 && c.topk_group <= c.n_group &&
                c.num_experts_per_tok <= c.topk_group * per,
            "{}: n_group ({}) must divide n_routed_experts ({}) into groups of at least 2 experts, topk_group ({}) "
            "be in [1, n_group] and num_experts_per_tok ({}) at most topk_group x the group size", src, c.n_group,
            c.num_experts, c.topk_group, c.num_experts_per_tok);
  TPU_CHECK(c.kv_lora_rank > 0 && c.q_lora_rank >= 0 && c.qk_nope_head_dim >= 0 && c.qk_rope_head_dim > 0 &&
                c.qk_rope_head_dim % 2 == 0 && c.v_head_dim > 0,
            "{}: kv_lora_rank ({}) and v_head_dim ({}) must be positive, qk_rope_head_dim ({}) positive and even, "
            "q_lora_rank ({}) and qk_nope_head_dim ({}) not negative", src, c.kv_lora_rank, c.v_head_dim,
            c.qk_rope_head_dim, c.q_lora_rank, c.qk_nope_head_dim);
  TPU_CHECK(c.num_key_value_heads == c.num_attention_heads, "{}: num_key_value_heads ({}) must equal "
            "num_attention_heads ({}) for model_type 'deepseek_v3' (latent attention expands every head)", src,
            c.num_key_value_heads, c.num_attention_heads);
  TPU_CHECK(c.rope_scaling.partial_rotary_factor == 1.0, "{}: field 'partial_rotary_factor' is not supported for "
            "model_type 'deepseek_v3' (qk_rope_head_dim sets the rotated width)", src);
  c.head_dim = c.qk_rope_head_dim;  // as Transformers' config: the rotary tables' width
  for (size_t i = 0; i < c.sparse_layers.size(); ++i)
    c.sparse_layers[i] = static_cast<int64_t>(i) >= c.first_k_dense_replace;
}

}  // namespace

void refuse_unsupported_moe_family(const std::string& t, const std::string& src) {
  static const std::map<std::string, const char*> other{
      {"deepseek_v2", "multi-head latent attention, shared experts, group-limited top-k"},
      {"qwen2_moe", "a shared expert (shared_expert_intermediate_size) beside the routed ones"},
      {"gpt_oss", "experts with biases and clamped SwiGLU, attention sinks"},
      {"llama4_text", "a shared expert, sigmoid routing, chunked attention"},
  };
  if (auto it = other.find(t); it != other.end())
    fail("{}: model_type '{}' ({}) is not supported; mixture-of-experts families: mixtral, qwen3_moe, deepseek_v3",
         src, t,
         it->second);
}

void parse_moe_fields(ModelConfig& c, const json& j, const std::string& src) {
  const auto n = static_cast<size_t>(c.num_hidden_layers);
  c.sparse_layers.assign(n, false);
  if (c.model_type == "deepseek_v3") {
    parse_deepseek_fields(c, j, src);
    TPU_CHECK(!get_bool(j, "output_router_logits", src, false), "{}: field 'output_router_logits' = true is not "
              "supported for model_type 'deepseek_v3' (it has no auxiliary loss)", src);
    return;
  }
  for (const auto& f : kOtherRouting)
    if (auto it = j.find(f[0]); it != j.end())
      TPU_CHECK(neutral_value(*it, f[0]), "{}: field '{}' = {} ({}) is not supported", src, f[0], it->dump(), f[1]);
  if (!is_moe_family(c.model_type)) {
    for (const char* k : {"num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size"})
      if (auto it = j.find(k); it != j.end())
        TPU_CHECK(neutral_value(*it, k), "{}: field '{}' = {} (mixture of experts) is not supported for model_type "
                  "'{}' (mixture-of-experts families: mixtral, qwen3_moe)", src, k, it->dump(), c.model_type);
    return;
  }
  const bool mixtral = c.model_type == "mixtral";
  if (mixtral) {
    c.num_experts = get_int(j, "num_local_experts", src, 8);
    c.num_experts_per_tok = get_int(j, "num_experts_per_tok", src, 2);
    c.moe_intermediate_size = c.intermediate_size;  // every layer's MLP is the experts
    c.norm_topk_prob = true;                        // Mixtral always renormalizes its top-k
    c.router_jitter_noise = get_double(j, "router_jitter_noise", src, 0.0);
    c.sparse_layers.assign(n, true);
  } else {
    c.num_experts = get_int(j, "num_experts", src, 128);
    c.num_experts_per_tok = get_int(j, "num_experts_per_tok", src, 8);
    c.moe_intermediate_size = get_int(j, "moe_intermediate_size", src, 768);
    c.norm_topk_prob = get_bool(j, "norm_topk_prob", src, false);
    c.decoder_sparse_step = get_int(j, "decoder_sparse_step", src, 1);
    TPU_CHECK(c.decoder_sparse_step >= 1, "{}: decoder_sparse_step must be positive, got {}", src,
              c.decoder_sparse_step);
    if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
      TPU_CHECK(it->is_array(), "{}: mlp_only_layers must be a list of layer indices, got {}", src, it->dump());
      for (const auto& e : *it) {
        const std::optional<int64_t> v = tpu::detail::json_int(e, 0);
        TPU_CHECK(v.has_value() && *v < c.num_hidden_layers, "{}: mlp_only_layers entries must be layer indices in "
                  "[0, {}), got {}", src, c.num_hidden_layers, e.dump());
        c.mlp_only_layers.push_back(*v);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const auto li = static_cast<int64_t>(i);
      const bool dense = std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), li) != c.mlp_only_layers.end();
      c.sparse_layers[i] = !dense && c.num_experts > 0 && (li + 1) % c.decoder_sparse_step == 0;
    }
  }
  const bool any = std::find(c.sparse_layers.begin(), c.sparse_layers.end(), true) != c.sparse_layers.end();
  TPU_CHECK(!any || (c.num_experts >= 1 && c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.num_experts &&
                     c.moe_intermediate_size > 0),
            "{}: {} ({}) must be positive, num_experts_per_tok ({}) in [1, {}] and {} ({}) positive", src,
            mixtral ? "num_local_experts" : "num_experts", c.num_experts, c.num_experts_per_tok, c.num_experts,
            mixtral ? "intermediate_size" : "moe_intermediate_size", c.moe_intermediate_size);
  c.router_aux_loss_coef = get_double(j, "router_aux_loss_coef", src, 0.001);
  c.router_z_loss_coef = get_double(j, "router_z_loss_coef", src, 0.0);
  c.output_router_logits = get_bool(j, "output_router_logits", src, false);
  // The load-balancing loss only enters a training loss Transformers computes with
  // output_router_logits (router_aux_loss_coef is inert without it).
  TPU_CHECK(!c.output_router_logits, "{}: field 'output_router_logits' = true (the load-balancing loss added to "
            "the training loss) is not supported; add models::router_aux_loss(model) to the loss instead", src);
}

void write_moe_fields(const ModelConfig& c, json& j) {
  if (!is_moe_family(c.model_type)) return;
  if (c.model_type == "deepseek_v3") {
    j["n_routed_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["n_shared_experts"] = c.n_shared_experts;
    j["n_group"] = c.n_group;
    j["topk_group"] = c.topk_group;
    j["routed_scaling_factor"] = c.routed_scaling_factor;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["first_k_dense_replace"] = c.first_k_dense_replace;
    j["kv_lora_rank"] = c.kv_lora_rank;
    j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
    j["qk_nope_head_dim"] = c.qk_nope_head_dim;
    j["qk_rope_head_dim"] = c.qk_rope_head_dim;
    j["v_head_dim"] = c.v_head_dim;
    j["rope_interleave"] = c.rope_interleave;
    return;
  }
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["router_aux_loss_coef"] = c.router_aux_loss_coef;
  j["output_router_logits"] = c.output_router_logits;
  if (c.router_z_loss_coef != 0) j["router_z_loss_coef"] = c.router_z_loss_coef;
  if (c.model_type == "mixtral") {
    j["num_local_experts"] = c.num_experts;
    j["router_jitter_noise"] = c.router_jitter_noise;
    return;
  }
  j["num_experts"] = c.num_experts;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["decoder_sparse_step"] = c.decoder_sparse_step;
  j["mlp_only_layers"] = c.mlp_only_layers;
}

}  // namespace tpu::models::detail
