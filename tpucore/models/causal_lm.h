// A decoder-only transformer family configured from a Hugging Face config.json and loaded from
// Hugging Face safetensors names: Llama 2/3, Mistral (sliding window), Qwen2 (q/k/v bias, optional
// sliding window), Qwen3 (q/k RMSNorm), Gemma 2 and Gemma 3 text ((1 + w) sandwich norms,
// GELU-tanh, scaled embeddings, soft-capping, local / global layers), the mixtures of experts
// Mixtral and Qwen3-MoE (nn::SparseMoE: top-k routing over stacked SwiGLU experts), with every
// rope type of Transformers (nn/rope.h) and tied or untied embeddings. Checkpoints are one model.safetensors or
// shards listed in model.safetensors.index.json; weights may be bf16, f16 or f32 and are converted
// to the dtype asked for. Parameter names: model.embed_tokens.weight, model.layers.N.{input_layernorm,
// post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm}.weight,
// model.layers.N.self_attn.{q,k,v,o}_proj.{weight,bias}, model.layers.N.self_attn.{q,k}_norm.weight,
// model.layers.N.mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight (absent when
// tied); a sparse layer's model.layers.N.{block_sparse_moe (Mixtral), mlp (Qwen3-MoE)}.gate.weight
// and per-expert experts.I.{w1,w3,w2 | gate_proj,up_proj,down_proj}.weight, which fill the stacked
// parameters experts.gate_up_proj and experts.down_proj (expert_slices()). Config fields that change the computation and are not implemented are refused by name
// (config.cpp); the support table is support_table_markdown().
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpucore/nn/mla.h"
#include "tpucore/nn/moe.h"
#include "tpucore/nn/quantized.h"
#include "tpucore/nn/transformer.h"

namespace tpu::models {

/// The fields of a Hugging Face config.json that the family reads.
struct ModelConfig {
  std::string model_type = "llama";  ///< one of supported_model_types()
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
  nn::RopeScaling rope_scaling;                      ///< rope_scaling / rope_parameters (of full-attention layers)
  double rope_local_base_freq = 0;  ///< Gemma 3: rope base of sliding-window layers (default rope; 0: as the others)
  int64_t sliding_window = 0;       ///< the window of sliding-attention layers (0: none)
  std::vector<bool> sliding_layers;  ///< per layer: sliding-window attention (layer_types resolved)
  double query_pre_attn_scalar = 0;   ///< Gemma: softmax scale query_pre_attn_scalar^-0.5 (0: 1 / sqrt(head_dim))
  double attn_logit_softcapping = 0;  ///< Gemma: attention scores soft-capped (0: none)
  double final_logit_softcapping = 0;  ///< Gemma 2: logits soft-capped (0: none)
  bool gemma = false;  ///< Gemma 2 / 3 blocks: (1 + w) norms, sandwich norms, sqrt(hidden)-scaled embeddings
  bool tie_word_embeddings = false;                  ///< the head reuses the embedding matrix
  bool attention_bias = false;  ///< bias on q/k/v (Qwen2 always; Llama's attention_bias also on o_proj)
  bool o_bias = false;    ///< bias on o_proj
  bool mlp_bias = false;  ///< bias on the MLP's projections
  bool qk_norm = false;   ///< Qwen3's q/k RMSNorm
  std::string hidden_act = "silu";                          ///< the MLP's activation
  std::string torch_dtype = "float32";                      ///< the checkpoint's dtype
  // Mixture of experts (mixtral, qwen3_moe; tpucore/nn/moe.h).
  int64_t num_experts = 0;            ///< experts of a sparse layer (num_local_experts / num_experts; 0: dense)
  int64_t num_experts_per_tok = 0;    ///< experts each token is routed to (top-k)
  int64_t moe_intermediate_size = 0;  ///< each expert's MLP width (Mixtral: intermediate_size)
  bool norm_topk_prob = false;        ///< renormalize the top-k routing weights (Mixtral: always)
  int64_t decoder_sparse_step = 1;    ///< Qwen3-MoE: layer i is sparse when (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  ///< ... and i is not listed here (those keep the dense MLP)
  std::vector<bool> sparse_layers;    ///< per layer: an MoE block instead of the dense MLP (resolved)
  double router_aux_loss_coef = 0;    ///< weight of the load-balancing loss (used with output_router_logits)
  bool output_router_logits = false;  ///< training adds router_aux_loss_coef x the load-balancing loss
  double router_jitter_noise = 0;     ///< Mixtral: training-time router jitter (refused when training)
  double router_z_loss_coef = 0;      ///< weight of the router z-loss in router_aux_loss (0: none)
  // DeepSeek-V3 (deepseek_v3): routed plus shared experts, sigmoid group-limited routing, and
  // multi-head latent attention (tpucore/nn/mla.h).
  int64_t n_shared_experts = 0;         ///< shared experts beside the routed ones (one MLP of n x moe width)
  int64_t n_group = 1;                  ///< expert groups of group-limited routing
  int64_t topk_group = 1;               ///< groups kept per token
  double routed_scaling_factor = 1.0;   ///< multiplies the routing weights
  int64_t first_k_dense_replace = 0;    ///< the first k layers keep the dense MLP of intermediate_size
  int64_t kv_lora_rank = 0;             ///< MLA: the compressed key/value width (0: standard attention)
  int64_t q_lora_rank = 0;              ///< MLA: the compressed query width (0: a plain q_proj)
  int64_t qk_nope_head_dim = 0;         ///< MLA: per-head query/key width without rotary embeddings
  int64_t qk_rope_head_dim = 0;         ///< MLA: per-head rotated width (the key part shared by heads)
  int64_t v_head_dim = 0;               ///< MLA: per-head value width
  bool rope_interleave = false;         ///< MLA: the rotated part is de-interleaved before rotation
  /// Whether the attention is multi-head latent attention (DeepSeek-V3).
  bool mla() const { return kv_lora_rank > 0; }
  /// Training-time capacity-factor routing of the sparse layers (nn::MoEConfig::capacity_factor;
  /// 0: dropless). Not a config.json field: set it on the config before building the model.
  double capacity_factor = 0;
  std::optional<int64_t> bos_token_id;                      ///< beginning-of-sequence id
  std::vector<int64_t> eos_token_ids;                       ///< end-of-sequence ids

  /// Whether layer `i` attends over a sliding window.
  bool is_sliding(int64_t i) const {
    return sliding_window > 0 && i >= 0 && static_cast<size_t>(i) < sliding_layers.size() &&
           sliding_layers[static_cast<size_t>(i)];
  }
  /// Whether layer `i` has a mixture-of-experts block instead of the dense MLP.
  bool is_sparse(int64_t i) const {
    return i >= 0 && static_cast<size_t>(i) < sparse_layers.size() && sparse_layers[static_cast<size_t>(i)];
  }
  /// Parses config.json text; `source` names it in errors (missing or invalid fields).
  static ModelConfig from_json(const std::string& text, const std::string& source = "config.json");
  /// The config as config.json text.
  std::string to_json() const;
};

/// The model_type values load_causal_lm accepts.
const std::vector<std::string>& supported_model_types();
/// The support table of the family (architecture x feature) as Markdown, from the code's lists.
std::string support_table_markdown();

/// One pre-norm decoder block: x + attn(norm(x)), then h + mlp(norm(h)); Gemma's sandwich form
/// normalizes the outputs too: h = x + norm(attn(norm(x))), then h + norm(mlp(norm(h))).
class DecoderLayer : public nn::Module {
 public:
  /// Block `index` of config `c`, initialised from `gen`.
  DecoderLayer(const ModelConfig& c, Generator* gen, int64_t index = 0);
  using nn::Module::forward;  ///< forward(x) stays visible (an error naming the layer: it needs the rest)
  /// x [B, T, hidden]; cos/sin: rotary tables of the T new positions; keep: optional attention
  /// mask (nn::Attention); cache: optional attention cache, `layer` being this block's index in it.
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep,
                 nn::AttentionCache* cache, int64_t layer);
  /// "DecoderLayer".
  std::string type_name() const override { return "DecoderLayer"; }
  std::shared_ptr<nn::RMSNorm> input_layernorm;           ///< the norm before attention
  std::shared_ptr<nn::RMSNorm> post_attention_layernorm;  ///< the norm before the MLP (Gemma: after attention)
  std::shared_ptr<nn::RMSNorm> pre_feedforward_layernorm;   ///< Gemma: the norm before the MLP (else null)
  std::shared_ptr<nn::RMSNorm> post_feedforward_layernorm;  ///< Gemma: the norm after the MLP (else null)
  bool packed_rope = false;  ///< the model's rotary tables are [global | local] (Gemma 3)
  bool local_rope = false;   ///< uses the local half of packed rotary tables (Gemma 3's sliding layers)
  std::shared_ptr<nn::Attention> self_attn;  ///< the attention (null with latent attention)
  /// DeepSeek-V3's multi-head latent attention, named self_attn as in the checkpoints (else null).
  std::shared_ptr<nn::MLAttention> mla;
  std::shared_ptr<nn::GatedMLP> mlp;  ///< the dense MLP (null in a sparse layer)
  /// A sparse layer's mixture-of-experts block instead of the MLP (else null), named
  /// block_sparse_moe (Mixtral) or mlp (Qwen3-MoE) as in the checkpoints.
  std::shared_ptr<nn::SparseMoE> moe;
  /// The feed-forward part: the MLP or the MoE block.
  nn::Module& feed_forward() { return mlp ? static_cast<nn::Module&>(*mlp) : *moe; }
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
  double embed_scale = 1.0;                           ///< Gemma: embeddings times sqrt(hidden_size)
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
  /// Rotary tables [B, 1, T, rotary_dim] of B x T positions in the model's dtype and device
  /// (scaled by the rope type's attention factor; dynamic and longrope frequencies follow the
  /// largest position). A model with local rope (Gemma 3) packs [global | local] tables along the
  /// last dim, [B, 1, T, 2 * rotary_dim]; each layer takes its half.
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
  std::vector<double> inv_freq;          ///< rotary frequencies of the config's context (nn::rope_frequencies)
  double rope_attention_scaling = 1.0;   ///< the rope type's scale of cos and sin
  std::vector<double> local_inv_freq;    ///< Gemma 3's sliding layers (rope_local_base_freq; empty: none)
  std::shared_ptr<DecoderModel> model;   ///< the body
  std::shared_ptr<nn::Linear> lm_head;   ///< null when tied to model.embed_tokens
  /// make_cache()'s storage: auto (the model's dtype), int8 or fp8_e4m3 (quantized rows with
  /// scales, nn::KVCacheDType); generate() decodes through it.
  nn::KVCacheDType kv_cache_dtype = nn::KVCacheDType::auto_dtype;
  bool int8_kv_cache = false;            ///< shorthand for kv_cache_dtype = int8
  /// The cache storage in effect (int8_kv_cache counts as int8).
  nn::KVCacheDType kv_dtype() const { return int8_kv_cache ? nn::KVCacheDType::int8 : kv_cache_dtype; }
};

/// Where a per-expert checkpoint tensor goes in a sparse layer's stacked expert weights.
struct ExpertSlice {
  std::string name;   ///< the checkpoint's name, e.g. model.layers.0.block_sparse_moe.experts.3.w1.weight
  std::string param;  ///< the stacked parameter, e.g. model.layers.0.block_sparse_moe.experts.gate_up_proj
  int64_t expert = 0;          ///< index along the stacked parameter's first dim
  int64_t row = 0;   ///< the first row of that expert's matrix the tensor fills
  int64_t rows = 0;  ///< how many rows of that expert's matrix the tensor fills
};
/// The per-expert checkpoint tensors of a model's sparse layers (empty for a dense model); the
/// loader reads them into, and save_causal_lm writes them from, the stacked parameters.
std::vector<ExpertSlice> expert_slices(const CausalLM& m);
/// The auxiliary loss Transformers adds to the training loss of Mixtral and Qwen3-MoE:
/// router_aux_loss_coef x nn::load_balancing_loss over the router logits of every sparse layer
/// in the model's last forward, plus router_z_loss_coef x nn::router_z_loss when that is set (call it after the forward, in the same compiled function if any).
/// A model without sparse layers is an error.
Tensor router_aux_loss(const CausalLM& m);

/// Loads config.json and the weights (model.safetensors, or the shards named by
/// model.safetensors.index.json) of a Hugging Face checkpoint folder. dtype: of the parameters
/// (default f32, as from_pretrained without torch_dtype). Missing or unexpected weights, shape
/// mismatches and bad files are a tpu::Error naming the file and tensor.
std::shared_ptr<CausalLM> load_causal_lm(const std::string& dir, Device device = Device(),
                                         std::optional<DType> dtype = std::nullopt);
/// The options of load_causal_lm.
struct LoadOptions {
  Device device;                 ///< where the parameters go
  std::optional<DType> dtype;    ///< of the float parameters (default f32)
  /// Weight-only quantization of every Linear of the decoder layers (attention and dense MLP
  /// projections; not the embeddings, the norms, the experts of sparse layers or, unless
  /// quantize_lm_head, the output head), made from the loaded float weights on the host.
  nn::WeightQuant quantize = nn::WeightQuant::none;  ///< none, int8, int4 or fp8
  int64_t group = 32;             ///< int4: columns per scale (32 or 128)
  bool quantize_lm_head = false;  ///< also quantize an untied lm_head
  bool int8_kv_cache = false;     ///< make_cache() keeps keys and values as int8 (CausalLM::int8_kv_cache)
  /// make_cache()'s storage (CausalLM::kv_cache_dtype): auto, int8 or fp8_e4m3.
  nn::KVCacheDType kv_cache_dtype = nn::KVCacheDType::auto_dtype;
};
/// load_causal_lm with options, e.g. load_causal_lm(dir, {.quantize = nn::WeightQuant::int8}).
std::shared_ptr<CausalLM> load_causal_lm(const std::string& dir, const LoadOptions& options);
/// Quantizes the Linears of a model's decoder layers (and, with `lm_head`, an untied output head)
/// in place (LoadOptions::quantize); the model must be on the cpu.
void quantize_causal_lm(CausalLM& m, nn::WeightQuant kind, int64_t group = 32, bool lm_head = false);
/// Packs each decoder layer's quantized q / k / v projections, and its quantized gate / up
/// projections, into one buffer each (nn::pack_projections), so that eager cpu forwards compute
/// each set in one product. The checkpoint names and values are unchanged; sets that are not
/// quantized alike are left as they are. quantize_causal_lm and load_causal_lm call it.
void pack_quantized_projections(CausalLM& m);

/// Writes config.json and model.safetensors (in the parameters' dtype, tied weights once).
void save_causal_lm(CausalLM& m, const std::string& dir);

}  // namespace tpu::models
