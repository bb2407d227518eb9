// The mixture-of-experts fields of config.json: Mixtral's (num_local_experts,
// num_experts_per_tok; every layer sparse, top-k always renormalized) and Qwen3-MoE's
// (num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob, decoder_sparse_step,
// mlp_only_layers), and router_z_loss_coef (the router z-loss in models::router_aux_loss). Expert fields in another family's config, routing variants no family here
// implements (shared experts, grouped or sigmoid routing, scaled routing weights) and the MoE
// families this library lacks are refused by name.
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

bool is_moe_family(const std::string& t) { return t == "mixtral" || t == "qwen3_moe"; }

void refuse_unsupported_moe_family(const std::string& t, const std::string& src) {
  static const std::map<std::string, const char*> other{
      {"deepseek_v3", "multi-head latent attention, shared experts, sigmoid routing with group-limited top-k"},
      {"deepseek_v2", "multi-head latent attention, shared experts, group-limited top-k"},
      {"qwen2_moe", "a shared expert (shared_expert_intermediate_size) beside the routed ones"},
      {"gpt_oss", "experts with biases and clamped SwiGLU, attention sinks"},
      {"llama4_text", "a shared expert, sigmoid routing, chunked attention"},
  };
  if (auto it = other.find(t); it != other.end())
    fail("{}: model_type '{}' ({}) is not supported; mixture-of-experts families: mixtral, qwen3_moe", src, t,
         it->second);
}

void parse_moe_fields(ModelConfig& c, const json& j, const std::string& src) {
  for (const auto& f : kOtherRouting)
    if (auto it = j.find(f[0]); it != j.end())
      TPU_CHECK(neutral_value(*it, f[0]), "{}: field '{}' = {} ({}) is not supported", src, f[0], it->dump(), f[1]);
  const auto n = static_cast<size_t>(c.num_hidden_layers);
  c.sparse_layers.assign(n, false);
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
