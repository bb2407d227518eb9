// Building blocks of decoder-only transformers in the Hugging Face layout (Llama, Qwen2/3,
// Mistral): a gated (SwiGLU) MLP, rotary position tables with llama3/linear scaling, a key/value
// cache, and attention with an explicit head_dim, grouped KV heads, optional q/k RMSNorm
// (Qwen3), position ids and a cache. Parameter names follow Hugging Face checkpoints
// (q_proj, k_proj, v_proj, o_proj, q_norm, k_norm, gate_proj, up_proj, down_proj).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tpucore/nn/layers.h"

namespace tpu::nn {

// down_proj(act(gate_proj(x)) * up_proj(x)); act is an activation name of nn::activation.
class GatedMLP : public Module {
 public:
  GatedMLP(int64_t hidden, int64_t intermediate, const std::string& act = "silu", bool bias = false,
           Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "GatedMLP"; }
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
  std::shared_ptr<Module> act;
};

// Rotary embedding frequencies: inv_freq[i] = theta^(-2i/head_dim), i < head_dim / 2, optionally
// rescaled as Hugging Face's rope_scaling: "linear" divides by factor; "llama3" divides the low
// frequencies (wavelength above original_max_position_embeddings / low_freq_factor) by factor,
// keeps the high ones (wavelength below original / high_freq_factor) and blends in between.
struct RopeScaling {
  std::string type = "default";  // "default", "linear" or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192;
};
std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling = {});

// cos and sin tables for positions [B, T] (any integer dtype, or a host vector with batch b):
// [B, 1, T, head_dim] with column k using inv_freq[k mod head_dim/2] (the rotate-half layout of
// tpu::rotary_embedding), in dtype on device.
std::pair<Tensor, Tensor> rope_tables(const std::vector<int64_t>& positions, int64_t batch,
                                      const std::vector<double>& inv_freq, DType dtype, Device device);

// Keys and values of every layer, preallocated [B, Hkv, capacity, D] per layer. A forward of T
// new tokens writes positions [length, length + T) of each layer (update) and then advances the
// shared length once.
class KVCache {
 public:
  KVCache(int64_t num_layers, int64_t batch, int64_t num_kv_heads, int64_t capacity, int64_t head_dim, DType dtype,
          Device device = Device());
  // Stores k, v [B, Hkv, T, D] of `layer` after the cached ones; returns the keys and values of
  // positions [0, length + T) (views into the cache).
  // With a write mask set (bool [1, 1, capacity, 1], true at one position; T must be 1) the
  // step is shape-static for compiled decoding: k, v go where the mask is true and the whole
  // cache [B, Hkv, capacity, D] is returned (the attention mask hides unused positions), so the
  // position is a runtime tensor, not a C++ number baked into a trace.
  std::pair<Tensor, Tensor> update(int64_t layer, const Tensor& k, const Tensor& v);
  void set_write_mask(const Tensor& mask) { write_mask_ = mask; }
  const Tensor& write_mask() const { return write_mask_; }
  // The same shape-static step with the position as a one-element integer tensor on the cache's
  // device: k, v go to that position by a slice write in place (codegen/cache_update.h: one
  // small DMA on a chip instead of rewriting the whole cache); takes precedence over a mask.
  void set_write_position(const Tensor& pos) { write_pos_ = pos; }
  const Tensor& write_position() const { return write_pos_; }
  void advance(int64_t t);
  void reset() { length_ = 0; }
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  int64_t batch() const { return batch_; }
  int64_t num_layers() const { return static_cast<int64_t>(k_.size()); }

 private:
  std::vector<Tensor> k_, v_;
  Tensor write_mask_, write_pos_;
  int64_t batch_, heads_, capacity_, head_dim_, length_ = 0;
};

struct AttentionConfig {
  int64_t hidden = 0;
  int64_t num_heads = 1;
  int64_t num_kv_heads = 0;  // 0: num_heads
  int64_t head_dim = 0;      // 0: hidden / num_heads
  bool qkv_bias = false;     // Qwen2
  bool o_bias = false;
  bool qk_norm = false;      // Qwen3: RMSNorm over head_dim of each query and key head
  double norm_eps = 1e-6;
};

class Attention : public Module {
 public:
  explicit Attention(AttentionConfig c, Generator* gen = nullptr);
  // x [B, T, hidden]; cos/sin from rope_tables for the T new positions (undefined: no rotary);
  // keep (optional) bool broadcast to [B, H, T, S], true = may attend, S = cached + T keys;
  // without keep the mask is causal (query i sees keys up to cached + i). cache (optional)
  // with the layer index: keys and values are appended to it and read back from it.
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep = {},
                 KVCache* cache = nullptr, int64_t layer = 0);
  Tensor forward(const Tensor& x) override { return forward(x, {}, {}); }
  std::string type_name() const override { return "Attention"; }

  AttentionConfig cfg;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<RMSNorm> q_norm, k_norm;  // null unless qk_norm
};

// The keep mask [B, 1, T, past + T] of a causal forward of T new tokens after `past` cached
// ones; valid (optional, B x (past + T) values, 0 = padding) hides padded keys.
Tensor causal_keep_mask(int64_t batch, int64_t t, int64_t past, const std::vector<uint8_t>& valid = {},
                        Device device = Device());

}  // namespace tpu::nn
