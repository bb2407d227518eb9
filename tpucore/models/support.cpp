// The support table of the decoder family (architecture x feature), built from the code's own
// lists (supported_model_types, nn::supported_rope_types), so the docs cannot drift: a CTest
// compares the table in docs/models-and-tokenizers.md with this text.
#include <map>

#include "tpucore/models/causal_lm.h"

namespace tpu::models {

namespace {

struct Row {
  const char* attention;  // projections' biases and norms
  const char* window;     // sliding-window layers
  const char* blocks;     // norms, activation, embeddings, soft-capping
};

const std::map<std::string, Row>& rows() {
  static const std::map<std::string, Row> r{
      {"llama", {"`attention_bias` (q/k/v/o), `mlp_bias`", "none", "pre-norm, SwiGLU (`hidden_act`)"}},
      {"mistral", {"no biases", "`sliding_window` on every layer", "pre-norm, SwiGLU"}},
      {"qwen2", {"q/k/v biases", "`use_sliding_window`: layers from `max_window_layers` on (or `layer_types`)",
                 "pre-norm, SwiGLU"}},
      {"qwen3", {"q/k RMSNorm, `attention_bias`", "as qwen2", "pre-norm, SwiGLU"}},
      {"gemma2",
       {"`attention_bias`, `query_pre_attn_scalar`, `attn_logit_softcapping`",
        "`sliding_window` on every other layer from layer 0 (or `layer_types`)",
        "(1 + w) RMSNorm, sandwich norms, GELU-tanh (`hidden_activation`), embeddings x sqrt(hidden), "
        "`final_logit_softcapping`"}},
      {"gemma3_text",
       {"q/k (1 + w) RMSNorm, `query_pre_attn_scalar`, `attn_logit_softcapping`",
        "`sliding_window` except every `sliding_window_pattern`-th layer (or `layer_types`), "
        "`rope_local_base_freq` on sliding layers",
        "as gemma2"}},
      {"mixtral",
       {"no biases", "`sliding_window` on every layer",
        "pre-norm; every layer a sparse MoE (`block_sparse_moe`): `num_local_experts` SwiGLU experts of "
        "`intermediate_size`, top-`num_experts_per_tok` of the router's softmax renormalized"}},
      {"qwen3_moe",
       {"as qwen3", "as qwen2",
        "pre-norm; sparse MoE (`num_experts` SwiGLU experts of `moe_intermediate_size`, top-`num_experts_per_tok`, "
        "`norm_topk_prob`) on the layers of `decoder_sparse_step` except `mlp_only_layers`, which keep the SwiGLU "
        "MLP of `intermediate_size`"}},
      {"deepseek_v3",
       {"multi-head latent attention: `q_lora_rank` (null: `q_proj`), `kv_lora_rank`, `qk_nope_head_dim`, "
        "`qk_rope_head_dim` (`rope_interleave`), `v_head_dim`, `attention_bias`; the cache holds the compressed "
        "latent; yarn's `mscale_all_dim` squared in the softmax scale",
        "none",
        "pre-norm; the first `first_k_dense_replace` layers SwiGLU of `intermediate_size`, the rest `n_routed_experts` "
        "SwiGLU experts of `moe_intermediate_size` plus `n_shared_experts` shared ones; sigmoid scores with "
        "`e_score_correction_bias`, top-`topk_group` of `n_group` groups, top-`num_experts_per_tok`, "
        "`norm_topk_prob`, `routed_scaling_factor`"}},
  };
  return r;
}

}  // namespace

std::string support_table_markdown() {
  std::string s =
      "| model_type | attention | sliding window | blocks |\n"
      "|---|---|---|---|\n";
  for (const auto& t : supported_model_types()) {
    auto it = rows().find(t);
    TPU_CHECK(it != rows().end(), "support_table_markdown: no row for model_type '{}'", t);
    s += fmt::format("| `{}` | {} | {} | {} |\n", t, it->second.attention, it->second.window, it->second.blocks);
  }
  s += fmt::format(
      "\nEvery type: grouped KV heads, explicit `head_dim`, tied or untied head (`tie_word_embeddings`), "
      "rope types {} (`rope_scaling` or `rope_parameters`, `rope_type` or `type`), `partial_rotary_factor`.\n",
      [] {
        std::string t;
        for (const auto& r : nn::supported_rope_types()) t += (t.empty() ? "`" : ", `") + r + "`";
        return t;
      }());
  s += "\n`gemma3` (Gemma3ForConditionalGeneration) runs text-only: its `text_config` as `gemma3_text` "
       "(the fields it omits take Gemma3TextConfig's defaults), the weights under `language_model.model.` or "
       "`model.language_model.`; the vision tower and projector are not loaded and image inputs are not "
       "supported.\n";
  s += "\nMixture of experts: dropless routing (every token reaches its experts; capacity-factor routing "
       "as a training option), the router in f32; `router_aux_loss_coef` and `router_z_loss_coef` are read "
       "(they enter `models::router_aux_loss`; `output_router_logits` is refused), `router_jitter_noise` is "
       "refused in training mode. Refused by name: the model types "
       "`deepseek_v2`, `qwen2_moe`, `gpt_oss`, `llama4_text`, and, outside `deepseek_v3`, shared experts "
       "(`shared_expert_intermediate_size`, `n_shared_experts`), grouped or sigmoid routing, "
       "`routed_scaling_factor`. `deepseek_v3` is served by `generate()` and by the serving engine, whose "
       "paged blocks then hold the compressed latent (`kv_lora_rank` + `qk_rope_head_dim` values per token "
       "and layer) and attend in the absorbed form.\n";
  return s;
}

}  // namespace tpu::models
