// The model shapes tpu-plan costs: a dense decoder-only transformer (Llama / Qwen / Mistral
// style: RMSNorm, grouped-query attention, RoPE, SwiGLU MLP), from a Hub config.json or a
// named shape. Anything the planner cannot model (MoE, an unknown model_type) is an error
// naming it.
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

  double layer_params() const;   // one decoder layer (norms, attention, MLP)
  double params() const;         // all (embedding + lm_head unless tied)
  void validate() const;         // PlanError naming the field
};

std::vector<std::string> model_names();
// A named shape ("qwen3-8b", "llama3.1-8b", "llama3-70b", "tiny"); PlanError listing the names.
ModelShape named_model(const std::string& name);
// A Hub config.json's text; PlanError for a model type or MoE it cannot model, naming it.
ModelShape model_from_config(const std::string& json_text, const std::string& label = "config.json");
// A named shape, or a path to a config.json.
ModelShape load_model(const std::string& name_or_path);

}  // namespace tpu::plan
