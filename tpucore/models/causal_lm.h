// A decoder-only transformer family configured from a Hugging Face config.json and loaded from
// Hugging Face safetensors names: Llama 2/3 (incl. llama3 rope scaling), Mistral (grouped KV
// heads), Qwen2 (q/k/v bias) and Qwen3 (q/k RMSNorm, explicit head_dim), with or without tied
// embeddings. Checkpoints are one model.safetensors or shards listed in
// model.safetensors.index.json; weights may be bf16, f16 or f32 and are converted to the dtype
// asked for. Parameter names: model.embed_tokens.weight, model.layers.N.{input_layernorm,
// post_attention_layernorm}.weight, model.layers.N.self_attn.{q,k,v,o}_proj.{weight,bias},
// model.layers.N.self_attn.{q,k}_norm.weight, model.layers.N.mlp.{gate,up,down}_proj.weight,
// model.norm.weight, lm_head.weight (absent when tied).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpucore/nn/transformer.h"

namespace tpu::models {

struct ModelConfig {
  std::string model_type = "llama";  // llama, mistral, qwen2, qwen3
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0, rms_norm_eps = 1e-6;
  nn::RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // bias on q/k/v (Qwen2 always; Llama's attention_bias also on o_proj)
  bool o_bias = false, mlp_bias = false, qk_norm = false;
  std::string hidden_act = "silu";
  std::string torch_dtype = "float32";
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;

  // Parses config.json text; `source` names it in errors (missing or invalid fields).
  static ModelConfig from_json(const std::string& text, const std::string& source = "config.json");
  std::string to_json() const;
};

class DecoderLayer : public nn::Module {
 public:
  DecoderLayer(const ModelConfig& c, Generator* gen);
  using nn::Module::forward;  // forward(x) stays visible (an error naming the layer: it needs the rest)
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep, nn::KVCache* cache,
                 int64_t layer);
  std::string type_name() const override { return "DecoderLayer"; }
  std::shared_ptr<nn::RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<nn::Attention> self_attn;
  std::shared_ptr<nn::GatedMLP> mlp;
};

// The body ("model."): embeddings, layers, final norm.
class DecoderModel : public nn::Module {
 public:
  DecoderModel(const ModelConfig& c, Generator* gen);
  std::string type_name() const override { return "DecoderModel"; }
  std::shared_ptr<nn::Embedding> embed_tokens;
  std::vector<std::shared_ptr<DecoderLayer>> layers;
  std::shared_ptr<nn::RMSNorm> norm;
};

class CausalLM : public nn::Module {
 public:
  explicit CausalLM(const ModelConfig& c, Generator* gen = nullptr);
  // ids [B, T] (i64 or i32) -> logits [B, T, vocab]. positions: B x T position ids (default:
  // cache length + 0..T-1 for every row). keep: optional attention mask as nn::Attention (default
  // causal). cache: optional, advanced by T after the forward.
  Tensor forward(const Tensor& ids, nn::KVCache* cache, const std::vector<int64_t>& positions = {},
                 const Tensor& keep = {});
  Tensor forward(const Tensor& ids) override { return forward(ids, nullptr); }
  // The same from precomputed rotary tables (nn::rope_tables of the positions) and without
  // advancing the cache: everything position-dependent is a tensor, as compiled steps need.
  Tensor forward_tables(const Tensor& ids, const Tensor& cos, const Tensor& sin, const Tensor& keep,
                        nn::KVCache* cache);
  std::string type_name() const override { return "CausalLM"; }
  // A cache for `batch` sequences of up to `capacity` tokens in the model's dtype and device.
  nn::KVCache make_cache(int64_t batch, int64_t capacity) const;
  DType dtype() const;
  Device device() const;

  ModelConfig config;
  std::vector<double> inv_freq;
  std::shared_ptr<DecoderModel> model;
  std::shared_ptr<nn::Linear> lm_head;  // null when tied to model.embed_tokens
  // generate()'s compiled decode steps with their caches, by (batch, capacity); opaque here.
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<void>> generation_slots;
};

// Loads config.json and the weights (model.safetensors, or the shards named by
// model.safetensors.index.json) of a Hugging Face checkpoint folder. dtype: of the parameters
// (default f32, as from_pretrained without torch_dtype). Missing or unexpected weights, shape
// mismatches and bad files are a tpu::Error naming the file and tensor.
std::shared_ptr<CausalLM> load_causal_lm(const std::string& dir, Device device = Device(),
                                         std::optional<DType> dtype = std::nullopt);
// Writes config.json and model.safetensors (in the parameters' dtype, tied weights once).
void save_causal_lm(CausalLM& m, const std::string& dir);

}  // namespace tpu::models
