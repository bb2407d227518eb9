// Multi-head self-attention with a causal mask option, grouped key/value heads (GQA: fewer
// K/V heads than query heads, each shared by a group of query heads) and rotary position
// embeddings (RoPE, rotate-half form).
#pragma once

#include "tpucore/nn/layers.h"

namespace tpu::nn {

/// Rotates pairs (x[i], x[i + d/2]) of the last dim by angle pos * base^(-2i/d), pos being the
/// index along dim -2 plus `offset`. x: [..., T, d] with d even.
Tensor apply_rotary(const Tensor& x, double base = 10000.0, int64_t offset = 0);

/// The options of MultiheadAttention.
struct AttentionOptions {
  int64_t num_heads = 1;     ///< query heads
  int64_t num_kv_heads = 0;  ///< key/value heads (0: same as num_heads)
  bool bias = false;         ///< biases on the four projections
  bool rotary = false;       ///< rotary position embeddings on q and k
  double rope_base = 10000.0;  ///< rotary base
  double dropout = 0.0;        ///< dropout on the attention probabilities (training)
};

/// Multi-head self-attention over [B, T, E] with fused projections per role (q, k, v, out).
class MultiheadAttention : public Module {
 public:
  /// embed_dim must be a multiple of num_heads, num_heads of num_kv_heads.
  MultiheadAttention(int64_t embed_dim, AttentionOptions o, Generator* gen = nullptr);
  /// x: [B, T, E]. mask (optional): bool, broadcastable to [B, H, T, T], true = masked out.
  Tensor forward(const Tensor& x, bool causal, const Tensor& mask = {});
  /// Attention without a mask, not causal.
  Tensor forward(const Tensor& x) override { return forward(x, false); }
  /// "MultiheadAttention".
  std::string type_name() const override { return "MultiheadAttention"; }

  int64_t embed_dim;                 ///< E
  int64_t head_dim;                  ///< E / num_heads
  AttentionOptions opts;             ///< the resolved options
  std::shared_ptr<Linear> q_proj;    ///< E -> E
  std::shared_ptr<Linear> k_proj;    ///< E -> num_kv_heads * head_dim
  std::shared_ptr<Linear> v_proj;    ///< E -> num_kv_heads * head_dim
  std::shared_ptr<Linear> out_proj;  ///< E -> E
  std::shared_ptr<Dropout> attn_dropout;  ///< on the probabilities
};

}  // namespace tpu::nn
