#include "tpucore/nn/attention.h"

#include <cmath>

#include "tpucore/autograd.h"

namespace tpu::nn {

Tensor apply_rotary(const Tensor& x, double base, int64_t offset) {
  TPU_CHECK(x.dim() >= 2 && x.size(-1) % 2 == 0, "apply_rotary: expected [..., T, d] with an even d, got shape {}",
            x.shape().str());
  const int64_t t = x.size(-2), d = x.size(-1), half = d / 2;
  Tensor cos_t, sin_t;
  {
    NoGradGuard ng;
    std::vector<float> c(static_cast<size_t>(t * d)), s(c.size());
    for (int64_t p = 0; p < t; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const double ang = static_cast<double>(p + offset) * std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        for (int64_t k : {i, i + half}) {
          c[static_cast<size_t>(p * d + k)] = static_cast<float>(std::cos(ang));
          s[static_cast<size_t>(p * d + k)] = static_cast<float>(std::sin(ang));
        }
      }
    cos_t = from_vector(c, Shape{t, d}, TensorOptions(x.dtype(), x.device()));
    sin_t = from_vector(s, Shape{t, d}, TensorOptions(x.dtype(), x.device()));
  }
  return rotary_embedding(x, cos_t, sin_t);  // x cos + cat(-x2, x1) sin, one op (one program on sim)
}

MultiheadAttention::MultiheadAttention(int64_t e, AttentionOptions o, Generator* gen) : embed_dim(e), opts(o) {
  if (opts.num_kv_heads == 0) opts.num_kv_heads = opts.num_heads;
  TPU_CHECK(opts.num_heads > 0 && e % opts.num_heads == 0,
            "MultiheadAttention: embed_dim {} must be a positive multiple of num_heads {}", e, opts.num_heads);
  TPU_CHECK(opts.num_kv_heads > 0 && opts.num_heads % opts.num_kv_heads == 0,
            "MultiheadAttention: num_heads {} must be a multiple of num_kv_heads {}", opts.num_heads, opts.num_kv_heads);
  head_dim = e / opts.num_heads;
  TPU_CHECK(!opts.rotary || head_dim % 2 == 0, "MultiheadAttention: rotary embeddings need an even head_dim, got {}",
            head_dim);
  const int64_t kv = opts.num_kv_heads * head_dim;
  q_proj = register_module("q_proj", std::make_shared<Linear>(e, e, opts.bias, gen));
  k_proj = register_module("k_proj", std::make_shared<Linear>(e, kv, opts.bias, gen));
  v_proj = register_module("v_proj", std::make_shared<Linear>(e, kv, opts.bias, gen));
  out_proj = register_module("out_proj", std::make_shared<Linear>(e, e, opts.bias, gen));
  attn_dropout = register_module("attn_dropout", std::make_shared<Dropout>(opts.dropout, gen));
}

Tensor MultiheadAttention::forward(const Tensor& x, bool causal, const Tensor& mask) {
  TPU_CHECK(x.defined() && x.dim() == 3 && x.size(2) == embed_dim,
            "MultiheadAttention: expected input [batch, seq, {}], got shape {}", embed_dim,
            x.defined() ? x.shape().str() : std::string("undefined"));
  const int64_t b = x.size(0), t = x.size(1), h = opts.num_heads, hk = opts.num_kv_heads, d = head_dim;
  auto heads = [&](const Tensor& y, int64_t n) { return transpose(reshape(y, Shape{b, t, n, d}), 1, 2); };
  Tensor q = heads(q_proj->forward(x), h);   // [B, H, T, d]
  Tensor k = heads(k_proj->forward(x), hk);  // [B, Hk, T, d]
  Tensor v = heads(v_proj->forward(x), hk);
  if (opts.rotary) {
    q = apply_rotary(q, opts.rope_base);
    k = apply_rotary(k, opts.rope_base);
  }
  if (mask.defined())
    TPU_CHECK(mask.dtype() == DType::boolean, "MultiheadAttention: the mask must be bool (true = masked), got {}",
              dtype_name(mask.dtype()));
  Tensor attn;
  if (!(attn_dropout->is_training() && attn_dropout->p > 0)) {
    // One fused op (grouped KV heads natively; on sim one kernel whose scores stay on chip).
    Tensor keep;
    if (mask.defined()) {
      keep = logical_not(mask);
      if (causal) {
        NoGradGuard ng;
        const Tensor past = tril(ones(Shape{t, t}, TensorOptions(DType::boolean, x.device())));
        keep = logical_and(keep, past);
      }
    }
    attn = scaled_dot_product_attention(q, k, v, keep, causal && !mask.defined(), 1.0 / std::sqrt(double(d)));
  } else {
    // Dropout on the probabilities needs them materialized: the unfused formula.
    if (hk != h) {  // each K/V head serves h / hk query heads
      auto repeat = [&](const Tensor& y) {
        return reshape(expand(unsqueeze(y, 2), Shape{b, hk, h / hk, t, d}), Shape{b, h, t, d});
      };
      k = repeat(k);
      v = repeat(v);
    }
    Tensor scores = mul(matmul(q, transpose(k, -1, -2)), 1.0 / std::sqrt(static_cast<double>(d)));
    if (causal) {
      Tensor future;
      {
        NoGradGuard ng;
        future = triu(ones(Shape{t, t}, TensorOptions(DType::boolean, x.device())), 1);
      }
      scores = masked_fill(scores, future, -INFINITY);
    }
    if (mask.defined()) scores = masked_fill(scores, mask, -INFINITY);
    attn = matmul(attn_dropout->forward(softmax(scores, -1)), v);
  }
  Tensor out = reshape(transpose(attn, 1, 2), Shape{b, t, embed_dim});
  return out_proj->forward(out);
}

}  // namespace tpu::nn
