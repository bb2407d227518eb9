/// @file
/// Multi-head latent attention (MLA) of DeepSeek-V3 in the Hugging Face layout. Queries come
/// from q_proj, or from the low-rank q_a_proj -> q_a_layernorm -> q_b_proj; each query head is
/// [nope | rope] (qk_nope_head_dim + qk_rope_head_dim). Keys and values come from one compressed
/// latent per token: kv_a_proj_with_mqa gives [c | k_pe] (kv_lora_rank + qk_rope_head_dim),
/// kv_a_layernorm normalizes c, kv_b_proj expands it into every head's [k_nope | v]; the rotated
/// k_pe is shared by all heads. Rotary embeddings apply to the rope parts only (with
/// rope_interleave, the pairs (x[2i], x[2i+1]) are first gathered into rotate-half order, as
/// Transformers does). The softmax scale is 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim), times
/// the config's yarn mscale squared (set by the model).
///
/// Cache: what is stored per token and layer is the latent only, normalized c and rotated k_pe,
/// kv_lora_rank + qk_rope_head_dim values, not per-head keys and values. It lives in an
/// nn::KVCache of one head whose head_dim is half the latent (rounded up): the keys hold the
/// latent's first half, the values its second half, so generation's contiguous cache with its
/// shape-static compiled steps serves MLA unchanged. A forward of several tokens expands the
/// cached latents through kv_b_proj into per-head keys and values; decoding one token (eval)
/// uses the absorbed form instead: the query's nope part times kv_b_proj's key rows scores
/// against the latents directly, and kv_b_proj's value rows apply to the attention-weighted
/// latent (equal results, no per-position expansion).
///
/// Any other attention cache (the serving engine's paged caches) is driven through the plain
/// update_and_attend() call in the absorbed form for every token: the queries are
/// [q_nope W_uk | q_pe] per head, the keys and values one head holding the latent [c | k_pe], so
/// such a cache stores kv_lora_rank + qk_rope_head_dim values per token and layer (one head of
/// that width whose keys and values may share storage), and the first kv_lora_rank values of
/// each head's output go through kv_b_proj's value rows. A cache laid out for per-head keys and
/// values rejects these shapes with its own error.
#pragma once

#include <string>

#include "tpucore/nn/transformer.h"

namespace tpu::nn {

/// The shape and options of an MLAttention layer (DeepSeek-V3 config names).
struct MLAConfig {
  int64_t hidden = 0;            ///< model width
  int64_t num_heads = 1;         ///< attention heads
  int64_t q_lora_rank = 0;       ///< compressed query width (0: a plain q_proj)
  int64_t kv_lora_rank = 0;      ///< compressed key/value width
  int64_t qk_nope_head_dim = 0;  ///< per-head query/key width without rotation
  int64_t qk_rope_head_dim = 0;  ///< per-head rotated width
  int64_t v_head_dim = 0;        ///< per-head value width
  bool bias = false;             ///< attention_bias: biases on q_a_proj, kv_a_proj_with_mqa and o_proj
  bool rope_interleave = true;   ///< de-interleave the rope parts before rotating them
  double scaling = 0;            ///< the softmax scale (0: 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim))
  double latent_norm_eps = 1e-6;  ///< epsilon of q_a_layernorm and kv_a_layernorm (Transformers' default)
};

/// The head_dim of the one-head KVCache that holds MLA latents: ceil((kv_lora_rank +
/// qk_rope_head_dim) / 2) (keys: the first half, values: the second).
int64_t mla_cache_head_dim(int64_t kv_lora_rank, int64_t qk_rope_head_dim);

/// Multi-head latent attention with a compressed latent cache (see the file comment).
class MLAttention : public Module {
 public:
  /// Creates the projections and norms of `c`, initialised from `gen`.
  explicit MLAttention(MLAConfig c, Generator* gen = nullptr);
  /// x [B, T, hidden]; cos/sin: rotary tables [B, 1, T, qk_rope_head_dim] of the T new positions
  /// (undefined: no rotation); keep (optional) bool broadcast to [B, H, T, S] over the cache's
  /// positions (default causal); cache (optional): an nn::KVCache laid out by
  /// mla_cache_head_dim, `layer` this layer's index in it. Returns [B, T, hidden].
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep = {},
                 AttentionCache* cache = nullptr, int64_t layer = 0);
  /// Causal self-attention of x without rotary embeddings or a cache.
  Tensor forward(const Tensor& x) override { return forward(x, {}, {}); }
  /// "MLAttention".
  std::string type_name() const override { return "MLAttention"; }

  MLAConfig cfg;                                ///< the configuration
  std::shared_ptr<Linear> q_proj;               ///< hidden -> H (nope + rope) (null with q_lora_rank)
  std::shared_ptr<Linear> q_a_proj;             ///< hidden -> q_lora_rank (null without it)
  std::shared_ptr<RMSNorm> q_a_layernorm;       ///< over q_lora_rank (null without it)
  std::shared_ptr<Linear> q_b_proj;             ///< q_lora_rank -> H (nope + rope) (null without it)
  std::shared_ptr<Linear> kv_a_proj_with_mqa;   ///< hidden -> kv_lora_rank + rope
  std::shared_ptr<RMSNorm> kv_a_layernorm;      ///< over kv_lora_rank
  std::shared_ptr<Linear> kv_b_proj;            ///< kv_lora_rank -> H (nope + v)
  std::shared_ptr<Linear> o_proj;               ///< H v -> hidden
};

}  // namespace tpu::nn
