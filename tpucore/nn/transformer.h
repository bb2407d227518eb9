// Building blocks of decoder-only transformers in the Hugging Face layout (Llama, Qwen2/3,
// Mistral, Gemma 2/3): a gated MLP, the attention-cache interface with its contiguous key/value
// cache, and attention with an explicit head_dim, grouped KV heads, optional q/k RMSNorm (Qwen3,
// Gemma 3), partial rotary dims, a sliding window and soft-capped scores. Rotary tables:
// tpucore/nn/rope.h. Parameter names follow Hugging Face checkpoints (q_proj, k_proj, v_proj,
// o_proj, q_norm, k_norm, gate_proj, up_proj, down_proj).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tpucore/nn/layers.h"
#include "tpucore/nn/rope.h"

namespace tpu::nn {

struct PackedProjections;  // tpucore/nn/quantized.h

/// The gated (SwiGLU) MLP: down_proj(act(gate_proj(x)) * up_proj(x)).
class GatedMLP : public Module {
 public:
  /// act: an activation name of nn::activation ("silu", "gelu", ...).
  GatedMLP(int64_t hidden, int64_t intermediate, const std::string& act = "silu", bool bias = false,
           Generator* gen = nullptr);
  /// x [..., hidden] -> [..., hidden].
  Tensor forward(const Tensor& x) override;
  /// "GatedMLP".
  std::string type_name() const override { return "GatedMLP"; }
  std::shared_ptr<Linear> gate_proj;  ///< hidden -> intermediate, through the activation
  std::shared_ptr<Linear> up_proj;    ///< hidden -> intermediate
  std::shared_ptr<Linear> down_proj;  ///< intermediate -> hidden
  std::shared_ptr<Module> act;                            ///< the activation of the gate
  /// gate_proj and up_proj packed into one product (nn::pack_projections; null: separate).
  std::shared_ptr<PackedProjections> gate_up_pack;
};

/// Per-layer variations of the attention math (defaults: none).
struct AttentionVariant {
  int64_t window = 0;  ///< sliding window: the query at position p sees keys at (p - window, p]; 0: unbounded
  double softcap = 0;  ///< soft-capping: scores -> softcap * tanh(scores / softcap) before the mask; 0: none
  /// Whether the variant changes nothing.
  bool plain() const { return window == 0 && softcap == 0; }
};

/// The memory of an attention layer across forwards: the keys and values of earlier tokens and
/// the attention over them, behind one call (update-and-attend). nn::Attention computes the new
/// tokens' queries, keys and values (projections, q/k norms, rotary) and hands them to the cache;
/// the cache stores the new keys and values of that layer in its own layout and returns the
/// attention of every new token over the positions it may see. One implementation per kind of
/// memory: the contiguous KVCache below (generation), the serving engine's paged caches (the
/// cpu kernel, the chip's ragged paged attention program, the in-place graph node of a compiled
/// step; tpucore/serve/paged_attention_cache.h). A sliding-window cache (a ring of the last W
/// positions), a quantized cache (integer keys and values with scales, dequantized while
/// attending) or a compressed latent cache (MLA: what the attention module hands over as keys
/// and values is its latent, expanded inside) fit the same call without touching the model.
class AttentionCache {
 public:
  virtual ~AttentionCache() = default;
  /// update_and_attend() with a sliding window or soft-capped scores (AttentionVariant). The
  /// default implementation forwards a plain variant and refuses the rest with a tpu::Error
  /// naming the feature (a cache kind that does not implement it).
  virtual Tensor update_and_attend_variant(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& keep, double scale, const AttentionVariant& variant);
  /// Stores the new tokens' keys and values of `layer` and attends over them and the cached
  /// positions each new token may see (causal within its own sequence).
  /// @param layer index of the decoder layer, in [0, num_layers())
  /// @param q queries [B, H, T, d], rotated
  /// @param k keys [B, Hkv, T, d] (H a multiple of Hkv), rotated
  /// @param v values [B, Hkv, T, d]
  /// @param keep optional bool mask broadcast to [B, H, T, S] (true = may attend) over the
  ///        cache's key axis S; a cache without a dense key axis rejects it with a tpu::Error
  /// @param scale the softmax scale (1 / sqrt(d) for the standard attention)
  /// @return the attention output [B, T, H * d] (token-major, as the output projection reads it)
  virtual Tensor update_and_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& keep, double scale) = 0;
  /// Number of decoder layers the cache holds.
  virtual int64_t num_layers() const = 0;
};

/// Attention without a cache: softmax(scale q k^T) v over the T new tokens only, causal unless
/// `keep` (bool, broadcast to [B, H, T, T], true = may attend) is given. q [B, H, T, d], k and v
/// [B, Hkv, T, d]; returns [B, T, H * d].
Tensor dense_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep, double scale);
/// The same with a sliding window or soft-capped scores (AttentionVariant).
Tensor dense_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep, double scale,
                       const AttentionVariant& variant);
/// softmax(scale q k^T, soft-capped, masked by keep) v over grouped KV heads: q [B, H, T, d], k
/// and v [B, Hkv, S, d], keep bool broadcast to [B, H, T, S] (true = may attend); [B, H, T, d].
Tensor masked_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep, double scale,
                        double softcap = 0);
/// The sliding-window band [1, 1, T, past + T] of T new tokens after `past` cached ones: key j
/// visible to new token i when (past + i) - j < window.
Tensor sliding_window_keep(int64_t t, int64_t past, int64_t window, Device device = Device());

/// The storage type of a key/value cache (vLLM's --kv-cache-dtype): `auto` keeps keys and values
/// in the model's float dtype; `int8` and `fp8_e4m3` keep each row (head_dim values of one
/// token and kv head) as one byte per value with one f32 scale per row, written when the row is
/// written (int8: round-half-even(x / s) with s = max |x| / 127; fp8_e4m3: x / s with s = max
/// |x| / 448 in OCP E4M3, tpucore/core/float8.h; s = 1 for a zero row) and dequantized (q * s)
/// while attention reads it. A step's own new keys and values are read back quantized as well,
/// exactly as a later step sees them.
enum class KVCacheDType { auto_dtype, int8, fp8_e4m3 };
/// "auto", "int8", "fp8_e4m3".
const char* kv_cache_dtype_name(KVCacheDType t);
/// Parses "auto", "int8", "fp8_e4m3" (also "fp8" and "fp8_e4m3fn"); anything else is a tpu::Error.
KVCacheDType parse_kv_cache_dtype(const std::string& name);
/// The tensor dtype of a quantized cache's rows (i8 or f8e4m3); `fallback` for auto.
DType kv_cache_storage_dtype(KVCacheDType t, DType fallback);

/// The contiguous key/value cache of generation: every layer's keys and values preallocated as
/// [B, Hkv, capacity, D]. A forward of T new tokens writes positions [length, length + T) of
/// each layer (update) and the caller then advances the shared length once (advance).
///
/// With dtype i8 or f8e4m3 the cache is quantized (KVCacheDType): each key and value vector
/// (one row, head and position) is stored as int8 round-to-nearest-even(x / scale) with scale =
/// max |x| / 127 over head_dim, or as e4m3 x / scale with scale = max |x| / 448 (1 for a zero
/// vector), the f32 scales in [B, Hkv, capacity, 1] beside it; update() returns the dequantized
/// keys and values (q * scale) in the new keys' dtype, the new ones included. That is 1 + 4 / D
/// bytes per element instead of 2 (bf16) or 4 (f32). The shape-static steps (write mask or
/// position) and sliding-window rings are float only (a tpu::Error naming the dtype).
class KVCache : public AttentionCache {
 public:
  /// A zeroed cache of `num_layers` layers for `batch` rows of up to `capacity` positions; dtype
  /// f32, bf16, f16, or i8 / f8e4m3 for the quantized cache.
  /// `rings` (empty, or one entry per layer): a layer with rings[l] = W > 0 (its sliding window)
  /// is a ring of its last W positions: position p lives in slot p % W,
  /// update_and_attend_variant() attends over the cached window and the new keys before storing
  /// only the last W of them (a step longer than the window attends within itself first); the
  /// other layers hold `capacity` positions. When every layer is a ring of capacity positions
  /// (ring()), the length is unbounded and a shape-static step writes slot (write position) and
  /// attends over the whole ring with the given mask [B, 1, 1, W] (slots outside it hidden).
  /// Rings: f32 / bf16 / f16.
  KVCache(int64_t num_layers, int64_t batch, int64_t num_kv_heads, int64_t capacity, int64_t head_dim, DType dtype,
          Device device = Device(), std::vector<int64_t> rings = {});
  /// Stores k, v [B, Hkv, T, D] of `layer` after the cached ones; returns the keys and values of
  /// positions [0, length + T) (views into the cache).
  /// With a write mask set (bool [1, 1, capacity, 1], true at one position; T must be 1) the
  /// step is shape-static for compiled decoding: k, v go where the mask is true and the whole
  /// cache [B, Hkv, capacity, D] is returned (the attention mask hides unused positions), so the
  /// position is a runtime tensor, not a C++ number baked into a trace.
  std::pair<Tensor, Tensor> update(int64_t layer, const Tensor& k, const Tensor& v);
  /// update(), then attention of the new tokens over positions [0, length + T): causal after the
  /// cached positions unless `keep` ([B, 1, T, length + T], or over the whole capacity for a
  /// shape-static step) is given; with a write position set and one new token, attention over
  /// the live keys [0, position + 1) only, however large the cache (codegen/cached_attention.h).
  Tensor update_and_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep,
                           double scale) override;
  /// update_and_attend() with a sliding window (the band on top of the causal or given mask;
  /// positions are cache slots) or soft-capped scores; a shape-static step takes the band from the
  /// write position tensor. The write-mask step refuses a variant.
  Tensor update_and_attend_variant(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& keep, double scale, const AttentionVariant& variant) override;
  /// Sets (or, with an undefined tensor, clears) the write mask of shape-static steps.
  void set_write_mask(const Tensor& mask) { write_mask_ = mask; }
  /// The write mask (undefined when unset).
  const Tensor& write_mask() const { return write_mask_; }
  /// The same shape-static step with the position as a one-element integer tensor on the cache's
  /// device: k, v go to that position by a slice write in place (codegen/cache_update.h: one
  /// small DMA on a chip instead of rewriting the whole cache); takes precedence over a mask.
  void set_write_position(const Tensor& pos) { write_pos_ = pos; }
  /// The write position (undefined when unset).
  const Tensor& write_position() const { return write_pos_; }
  /// Advances the shared length by t positions (after a forward of t tokens).
  void advance(int64_t t);
  /// Forgets every cached position (the storage is kept).
  void reset() { length_ = 0; }
  /// Positions cached so far.
  int64_t length() const { return length_; }
  /// Positions the cache can hold (the ring: the window).
  int64_t capacity() const { return capacity_; }
  /// Whether every layer is a ring of the last capacity() positions.
  bool ring() const { return all_ring_; }
  /// Positions layer `l` keeps when it is a ring (0: not a ring).
  int64_t ring_size(int64_t l) const { return rings_.empty() ? 0 : rings_[static_cast<size_t>(l)]; }
  /// Rows (sequences) of the cache.
  int64_t batch() const { return batch_; }
  int64_t num_layers() const override { return static_cast<int64_t>(k_.size()); }
  /// Whether keys and values are stored as int8 or fp8 e4m3 with scales.
  bool quantized() const { return !k_scale_.empty(); }
  /// Bytes of storage of the cache: keys, values and (quantized) their scales.
  int64_t nbytes() const;

 private:
  std::vector<Tensor> k_, v_, k_scale_, v_scale_;
  Tensor write_mask_, write_pos_;
  int64_t batch_, heads_, capacity_, head_dim_, length_ = 0;
  std::vector<int64_t> rings_;
  bool all_ring_ = false;
  Tensor ring_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep,
                     double scale, const AttentionVariant& variant);
  void check_rows(int64_t layer, const Tensor& k, const Tensor& v) const;  // layer and k, v shapes
  void check_room(int64_t t) const;                                       // t more positions fit
  void store_quantized(int64_t layer, const Tensor& k, const Tensor& v);
  Tensor quantized_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep,
                          double scale, const AttentionVariant& variant);
};

/// The shape and options of an Attention layer.
struct AttentionConfig {
  int64_t hidden = 0;        ///< model width
  int64_t num_heads = 1;     ///< query heads
  int64_t num_kv_heads = 0;  ///< key/value heads (0: num_heads)
  int64_t head_dim = 0;      ///< 0: hidden / num_heads
  bool qkv_bias = false;     ///< bias on q/k/v (Qwen2)
  bool o_bias = false;       ///< bias on the output projection
  bool qk_norm = false;      ///< Qwen3: RMSNorm over head_dim of each query and key head
  double norm_eps = 1e-6;    ///< epsilon of the q/k norms
  bool unit_offset_norm = false;  ///< Gemma: the q/k norms scale by (1 + weight)
  double scaling = 0;        ///< the softmax scale (0: 1 / sqrt(head_dim); Gemma: query_pre_attn_scalar^-0.5)
  AttentionVariant variant;  ///< sliding window, soft-capping
};

/// Gemma's RMSNorm: x / rms(x) * (1 + weight) (the stored weight is the offset from one).
class UnitOffsetRMSNorm : public RMSNorm {
 public:
  /// A norm over `normalized_shape` with epsilon `eps`, weight zero (the identity scale).
  UnitOffsetRMSNorm(Shape normalized_shape, double eps);
  /// rms_norm(x, normalized_shape, 1 + weight, eps).
  Tensor forward(const Tensor& x) override;
  /// "GemmaRMSNorm".
  std::string type_name() const override { return "GemmaRMSNorm"; }
};

/// Grouped-query self-attention of the decoder family: q/k/v projections with an explicit
/// head_dim, optional q/k RMSNorm (Qwen3), rotary embeddings from precomputed tables, and the
/// attention itself through an AttentionCache (or, without one, over the new tokens only).
class Attention : public Module {
 public:
  /// Creates the projections (and q/k norms) of `c`, initialised from `gen`.
  explicit Attention(AttentionConfig c, Generator* gen = nullptr);
  /// x [B, T, hidden]; cos/sin from rope_tables for the T new positions (undefined: no rotary);
  /// keep (optional) bool broadcast to [B, H, T, S], true = may attend, S = the cache's key axis
  /// (cached + T keys for KVCache); without keep the mask is causal (query i sees keys up to
  /// cached + i). cache (optional) with the layer index: the new keys and values go to it and
  /// the attention is its update_and_attend().
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep = {},
                 AttentionCache* cache = nullptr, int64_t layer = 0);
  /// Causal self-attention of x without rotary embeddings or a cache.
  Tensor forward(const Tensor& x) override { return forward(x, {}, {}); }
  /// "Attention".
  std::string type_name() const override { return "Attention"; }

  AttentionConfig cfg;              ///< the resolved configuration
  std::shared_ptr<Linear> q_proj;   ///< hidden -> num_heads * head_dim
  std::shared_ptr<Linear> k_proj;   ///< hidden -> num_kv_heads * head_dim
  std::shared_ptr<Linear> v_proj;   ///< hidden -> num_kv_heads * head_dim
  std::shared_ptr<Linear> o_proj;   ///< num_heads * head_dim -> hidden
  std::shared_ptr<RMSNorm> q_norm;  ///< per query head (null unless qk_norm; UnitOffsetRMSNorm for Gemma)
  std::shared_ptr<RMSNorm> k_norm;  ///< per key head (null unless qk_norm; UnitOffsetRMSNorm for Gemma)
  /// q_proj, k_proj and v_proj packed into one product (nn::pack_projections; null: separate).
  std::shared_ptr<PackedProjections> qkv_pack;
};

/// The keep mask [B, 1, T, past + T] of a causal forward of T new tokens after `past` cached
/// ones; valid (optional, B x (past + T) values, 0 = padding) hides padded keys.
Tensor causal_keep_mask(int64_t batch, int64_t t, int64_t past, const std::vector<uint8_t>& valid = {},
                        Device device = Device());

}  // namespace tpu::nn
