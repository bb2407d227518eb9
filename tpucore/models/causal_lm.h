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

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpucore/nn/transformer.h"

namespace tpu::models {

/// The fields of a Hugging Face config.json that the family reads.
struct ModelConfig {
  std::string model_type = "llama";  ///< llama, mistral, qwen2, qwen3
  int64_t vocab_size = 0;           ///< tokens in the vocabulary
  int64_t hidden_size = 0;          ///< model width
  int64_t intermediate_size = 0;    ///< MLP width
  int64_t num_hidden_layers = 0;    ///< decoder layers
  int64_t num_attention_heads = 0;  ///< query heads
  int64_t num_key_value_heads = 0;  ///< key/value heads (0: num_attention_heads)
  int64_t head_dim = 0;             ///< 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;  ///< the context the model was trained for
  double rope_theta = 10000.0;                       ///< rotary base
  double rms_norm_eps = 1e-6;                        ///< epsilon of every RMSNorm
  nn::RopeScaling rope_scaling;                      ///< rope_scaling
  bool tie_word_embeddings = false;                  ///< the head reuses the embedding matrix
  bool attention_bias = false;  ///< bias on q/k/v (Qwen2 always; Llama's attention_bias also on o_proj)
  bool o_bias = false;    ///< bias on o_proj
  bool mlp_bias = false;  ///< bias on the MLP's projections
  bool qk_norm = false;   ///< Qwen3's q/k RMSNorm
  std::string hidden_act = "silu";                          ///< the MLP's activation
  std::string torch_dtype = "float32";                      ///< the checkpoint's dtype
  std::optional<int64_t> bos_token_id;                      ///< beginning-of-sequence id
  std::vector<int64_t> eos_token_ids;                       ///< end-of-sequence ids

  /// Parses config.json text; `source` names it in errors (missing or invalid fields).
  static ModelConfig from_json(const std::string& text, const std::string& source = "config.json");
  /// The config as config.json text.
  std::string to_json() const;
};

/// One pre-norm decoder block: x + attn(norm(x)), then h + mlp(norm(h)).
class DecoderLayer : public nn::Module {
 public:
  /// The block of config `c`, initialised from `gen`.
  DecoderLayer(const ModelConfig& c, Generator* gen);
  using nn::Module::forward;  ///< forward(x) stays visible (an error naming the layer: it needs the rest)
  /// x [B, T, hidden]; cos/sin: rotary tables of the T new positions; keep: optional attention
  /// mask (nn::Attention); cache: optional attention cache, `layer` being this block's index in it.
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep,
                 nn::AttentionCache* cache, int64_t layer);
  /// "DecoderLayer".
  std::string type_name() const override { return "DecoderLayer"; }
  std::shared_ptr<nn::RMSNorm> input_layernorm;           ///< the norm before attention
  std::shared_ptr<nn::RMSNorm> post_attention_layernorm;  ///< the norm before the MLP
  std::shared_ptr<nn::Attention> self_attn;                               ///< the attention
  std::shared_ptr<nn::GatedMLP> mlp;                                      ///< the MLP
};

/// The body ("model."): embeddings, layers, final norm. Its forward is the family's one
/// decoder loop, which generation, the serving engine (eager, compiled, on a chip) and training
/// all run; what differs between them is the attention cache handed in.
class DecoderModel : public nn::Module {
 public:
  /// The body of config `c`, initialised from `gen`.
  DecoderModel(const ModelConfig& c, Generator* gen);
  using nn::Module::forward;  ///< forward(x) stays visible (an error naming the module: it needs the rest)
  /// ids [B, T] -> hidden states [B, T, hidden] after the final norm. cos/sin: rotary tables
  /// of the tokens' positions (nn::rope_tables); keep and cache as DecoderLayer::forward.
  Tensor forward(const Tensor& ids, const Tensor& cos, const Tensor& sin, const Tensor& keep,
                 nn::AttentionCache* cache);
  /// "DecoderModel".
  std::string type_name() const override { return "DecoderModel"; }
  std::shared_ptr<nn::Embedding> embed_tokens;        ///< the token embedding
  std::vector<std::shared_ptr<DecoderLayer>> layers;  ///< the blocks, in order
  std::shared_ptr<nn::RMSNorm> norm;                  ///< the final norm
};

/// A decoder-only language model: DecoderModel plus the output head.
class CausalLM : public nn::Module {
 public:
  /// The model of config `c`, initialised from `gen`.
  explicit CausalLM(const ModelConfig& c, Generator* gen = nullptr);
  /// Releases what generate() keeps for this model (its compiled decode steps).
  ~CausalLM() override;
  /// ids [B, T] (i64 or i32) -> logits [B, T, vocab]. positions: B x T position ids (default:
  /// cache length + 0..T-1 for every row). keep: optional attention mask as nn::Attention (default
  /// causal). cache: optional, advanced by T after the forward.
  Tensor forward(const Tensor& ids, nn::KVCache* cache, const std::vector<int64_t>& positions = {},
                 const Tensor& keep = {});
  /// Causal logits of ids [B, T] without a cache.
  Tensor forward(const Tensor& ids) override { return forward(ids, nullptr); }
  /// The same from precomputed rotary tables (rope_tables) through any attention cache, which
  /// is not advanced: everything position-dependent is a tensor, as compiled steps need.
  Tensor forward(const Tensor& ids, const Tensor& cos, const Tensor& sin, nn::AttentionCache* cache,
                 const Tensor& keep = {});
  /// The decoder loop alone: hidden states [B, T, hidden] after the final norm (model->forward).
  Tensor hidden_states(const Tensor& ids, const Tensor& cos, const Tensor& sin, nn::AttentionCache* cache,
                       const Tensor& keep = {});
  /// The output head: logits [..., vocab] of hidden states [..., hidden] (lm_head, or the
  /// embedding matrix when tied).
  Tensor logits(const Tensor& hidden) const;
  /// Rotary tables [B, 1, T, head_dim] of B x T positions in the model's dtype and device.
  std::pair<Tensor, Tensor> rope_tables(const std::vector<int64_t>& positions, int64_t batch) const;
  /// "CausalLM".
  std::string type_name() const override { return "CausalLM"; }
  /// A cache for `batch` sequences of up to `capacity` tokens in the model's dtype and device.
  nn::KVCache make_cache(int64_t batch, int64_t capacity) const;
  /// The parameters' dtype.
  DType dtype() const;
  /// The parameters' device.
  Device device() const;

  ModelConfig config;                    ///< the configuration (head_dim and kv heads resolved)
  std::vector<double> inv_freq;          ///< rotary frequencies (rope_inv_freq of the config)
  std::shared_ptr<DecoderModel> model;   ///< the body
  std::shared_ptr<nn::Linear> lm_head;   ///< null when tied to model.embed_tokens
};

/// Loads config.json and the weights (model.safetensors, or the shards named by
/// model.safetensors.index.json) of a Hugging Face checkpoint folder. dtype: of the parameters
/// (default f32, as from_pretrained without torch_dtype). Missing or unexpected weights, shape
/// mismatches and bad files are a tpu::Error naming the file and tensor.
std::shared_ptr<CausalLM> load_causal_lm(const std::string& dir, Device device = Device(),
                                         std::optional<DType> dtype = std::nullopt);
/// Writes config.json and model.safetensors (in the parameters' dtype, tied weights once).
void save_causal_lm(CausalLM& m, const std::string& dir);

}  // namespace tpu::models
