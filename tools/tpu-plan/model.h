// The model shapes tpu-plan costs: a decoder-only transformer (Llama / Qwen / Mistral style:
// RMSNorm, grouped-query attention, RoPE, SwiGLU MLP), dense or with a mixture-of-experts MLP
// (Mixtral, Qwen3-MoE: a linear router, top-k of `experts` SwiGLU experts; DeepSeek-V3: routed
// plus shared experts after dense first layers, with multi-head latent attention), from a Hub
// config.json or a named shape. Anything the planner cannot model (an unknown model_type) is an
// error naming it.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tpu::plan {

// Bad input: the message names the field, the value and what would be accepted.
struct PlanError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ModelShape {
  std::string name;
  int64_t hidden = 0;         // hidden_size (E)
  int64_t intermediate = 0;   // intermediate_size (F)
  int64_t layers = 0;         // num_hidden_layers (L)
  int64_t heads = 0;          // num_attention_heads (H)
  int64_t kv_heads = 0;       // num_key_value_heads (HK)
  int64_t head_dim = 0;       // head_dim (D)
  int64_t vocab = 0;          // vocab_size (V)
  bool tied = false;          // tie_word_embeddings
  // Mixture of experts (experts == 0: dense). A MoE layer's MLP is a router [hidden, experts]
  // and `experts` SwiGLU experts of `expert_intermediate`, `top_k` of them per token; layers
  // listed by mlp_only_layers or off the decoder_sparse_step keep the dense MLP.
  int64_t experts = 0;              // num_local_experts (Mixtral) / num_experts (Qwen3-MoE)
  int64_t top_k = 0;                // num_experts_per_tok
  int64_t expert_intermediate = 0;  // moe_intermediate_size (Qwen3-MoE); intermediate_size (Mixtral)
  int64_t moe_layers = 0;           // how many of the layers are MoE layers
  int64_t shared_experts = 0;       // n_shared_experts (DeepSeek): experts every token of a MoE layer uses
  // Multi-head latent attention (DeepSeek-V3; kv_lora_rank 0: plain grouped-query attention):
  // queries through a rank-q_lora_rank bottleneck (0: a full projection), keys and values
  // through a shared kv_lora_rank latent, cached with the decoupled RoPE key of qk_rope_dim.
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_dim = 0, qk_rope_dim = 0, v_head_dim = 0;

  bool moe() const { return experts > 0; }
  bool mla() const { return kv_lora_rank > 0; }
  // Bytes of one token's cached keys and values in one layer (bf16): the latent plus the RoPE
  // key for MLA; 2 x kv_heads x head_dim otherwise.
  double kv_bytes_per_token_layer() const;
  double attention_params() const;      // q, k, v, o and the two norms of one layer
  double expert_params() const;         // one expert (gate, up, down)
  double layer_params() const;          // one dense decoder layer (norms, attention, MLP)
  double moe_layer_params() const;      // one MoE layer: attention, router, every expert
  double moe_layer_active() const;      // one MoE layer as one token uses it: router + top_k experts
  double params() const;                // all (embedding + lm_head unless tied)
  double active_params() const;         // what one token uses (the top_k experts of each MoE layer)
  double body_params() const;           // all layers, no embedding / lm_head
  double body_active_params() const;    // the layers' parameters one token uses
  void validate() const;         // PlanError naming the field
};

std::vector<std::string> model_names();
// A named shape ("qwen3-8b", "llama3.1-8b", "llama3-70b", "mixtral-8x7b", "qwen3-30b-a3b",
// "deepseek-v3", "tiny", "tiny-moe", "tiny-mla"); PlanError listing the names.
ModelShape named_model(const std::string& name);
// A Hub config.json's text (llama, qwen2, qwen3, mistral, mixtral, qwen3_moe, deepseek_v3); PlanError for a
// model type or an MoE field it cannot model, naming it.
ModelShape model_from_config(const std::string& json_text, const std::string& label = "config.json");
// A named shape, or a path to a config.json.
ModelShape load_model(const std::string& name_or_path);

}  // namespace tpu::plan
