// Multi-head self-attention with a causal mask option, grouped key/value heads (GQA: fewer
// K/V heads than query heads, each shared by a group of query heads) and rotary position
// embeddings (RoPE, rotate-half form).
#pragma once

#include "tpucore/nn/layers.h"

namespace tpu::nn {

// Rotates pairs (x[i], x[i + d/2]) of the last dim by angle pos * base^(-2i/d), pos being the
// index along dim -2. x: [..., T, d] with d even.
Tensor apply_rotary(const Tensor& x, double base = 10000.0, int64_t offset = 0);

struct AttentionOptions {
  int64_t num_heads = 1;
  int64_t num_kv_heads = 0;  // 0: same as num_heads
  bool bias = false;
  bool rotary = false;
  double rope_base = 10000.0;
  double dropout = 0.0;
};

class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, AttentionOptions o, Generator* gen = nullptr);
  // x: [B, T, E]. mask (optional): bool, broadcastable to [B, H, T, T], true = masked out.
  Tensor forward(const Tensor& x, bool causal, const Tensor& mask = {});
  Tensor forward(const Tensor& x) override { return forward(x, false); }
  std::string type_name() const override { return "MultiheadAttention"; }

  int64_t embed_dim, head_dim;
  AttentionOptions opts;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj;
  std::shared_ptr<Dropout> attn_dropout;
};

}  // namespace tpu::nn
