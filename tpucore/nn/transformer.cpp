#include "tpucore/nn/transformer.h"

#include <cmath>
#include <numbers>

#include "tpucore/autograd.h"

namespace tpu::nn {

GatedMLP::GatedMLP(int64_t hidden, int64_t inter, const std::string& act_name, bool bias, Generator* gen) {
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(hidden, inter, bias, gen));
  up_proj = register_module("up_proj", std::make_shared<Linear>(hidden, inter, bias, gen));
  down_proj = register_module("down_proj", std::make_shared<Linear>(inter, hidden, bias, gen));
  act = register_module("act", activation(act_name));
}
Tensor GatedMLP::forward(const Tensor& x) {
  return (*down_proj)(mul(act->forward((*gate_proj)(x)), (*up_proj)(x)));
}

std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& s) {
  TPU_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope_inv_freq: head_dim must be positive and even, got {}", head_dim);
  TPU_CHECK(theta > 0, "rope_inv_freq: rope_theta must be positive, got {}", theta);
  const int64_t half = head_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[static_cast<size_t>(i)] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  if (s.type == "default") return f;
  TPU_CHECK(s.factor > 0, "rope_scaling: factor must be positive, got {}", s.factor);
  if (s.type == "linear") {
    for (double& v : f) v /= s.factor;
    return f;
  }
  TPU_CHECK(s.type == "llama3", "rope_scaling: unsupported rope_type '{}' (supported: default, linear, llama3)", s.type);
  TPU_CHECK(s.high_freq_factor > s.low_freq_factor && s.low_freq_factor > 0 && s.original_max_position_embeddings > 0,
            "rope_scaling llama3: need 0 < low_freq_factor ({}) < high_freq_factor ({}) and a positive "
            "original_max_position_embeddings ({})",
            s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings);
  const double old_len = s.original_max_position_embeddings;
  const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
  for (double& v : f) {
    const double wavelen = 2.0 * std::numbers::pi / v;
    if (wavelen > low_wavelen) {
      v /= s.factor;  // low frequencies: fully scaled
    } else if (wavelen >= high_wavelen) {
      const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      v = (1.0 - smooth) * v / s.factor + smooth * v;
    }  // high frequencies stay
  }
  return f;
}

std::pair<Tensor, Tensor> rope_tables(const std::vector<int64_t>& pos, int64_t b, const std::vector<double>& inv_freq,
                                      DType dtype, Device device) {
  TPU_CHECK(b > 0 && !pos.empty() && pos.size() % static_cast<size_t>(b) == 0,
            "rope_tables: {} positions do not split into batch {}", pos.size(), b);
  const int64_t t = static_cast<int64_t>(pos.size()) / b, half = static_cast<int64_t>(inv_freq.size()), d = 2 * half;
  std::vector<float> c(static_cast<size_t>(b * t * d)), s(c.size());
  for (size_t r = 0; r < pos.size(); ++r)
    for (int64_t i = 0; i < half; ++i) {
      // In f32 like the reference implementations (position * inv_freq rounded once).
      const float ang = static_cast<float>(pos[r]) * static_cast<float>(inv_freq[static_cast<size_t>(i)]);
      for (int64_t k : {i, i + half}) {
        c[r * static_cast<size_t>(d) + static_cast<size_t>(k)] = std::cos(ang);
        s[r * static_cast<size_t>(d) + static_cast<size_t>(k)] = std::sin(ang);
      }
    }
  NoGradGuard ng;
  return {from_vector(c, Shape{b, 1, t, d}, TensorOptions(dtype, device)),
          from_vector(s, Shape{b, 1, t, d}, TensorOptions(dtype, device))};
}

Attention::Attention(AttentionConfig c, Generator* gen) : cfg(c) {
  if (cfg.num_kv_heads == 0) cfg.num_kv_heads = cfg.num_heads;
  TPU_CHECK(cfg.hidden > 0 && cfg.num_heads > 0, "Attention: hidden ({}) and num_heads ({}) must be positive",
            cfg.hidden, cfg.num_heads);
  if (cfg.head_dim == 0) {
    TPU_CHECK(cfg.hidden % cfg.num_heads == 0,
              "Attention: hidden {} is not a multiple of num_heads {} (give head_dim explicitly)", cfg.hidden,
              cfg.num_heads);
    cfg.head_dim = cfg.hidden / cfg.num_heads;
  }
  TPU_CHECK(cfg.num_kv_heads > 0 && cfg.num_heads % cfg.num_kv_heads == 0,
            "Attention: num_heads {} must be a multiple of num_kv_heads {}", cfg.num_heads, cfg.num_kv_heads);
  const int64_t d = cfg.head_dim;
  q_proj = register_module("q_proj", std::make_shared<Linear>(cfg.hidden, cfg.num_heads * d, cfg.qkv_bias, gen));
  k_proj = register_module("k_proj", std::make_shared<Linear>(cfg.hidden, cfg.num_kv_heads * d, cfg.qkv_bias, gen));
  v_proj = register_module("v_proj", std::make_shared<Linear>(cfg.hidden, cfg.num_kv_heads * d, cfg.qkv_bias, gen));
  o_proj = register_module("o_proj", std::make_shared<Linear>(cfg.num_heads * d, cfg.hidden, cfg.o_bias, gen));
  if (cfg.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(Shape{d}, cfg.norm_eps));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(Shape{d}, cfg.norm_eps));
  }
}

Tensor Attention::forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep,
                          AttentionCache* cache, int64_t layer) {
  TPU_CHECK(x.defined() && x.dim() == 3 && x.size(2) == cfg.hidden,
            "Attention: expected input [batch, seq, {}], got shape {}", cfg.hidden,
            x.defined() ? x.shape().str() : std::string("undefined"));
  const int64_t b = x.size(0), t = x.size(1), d = cfg.head_dim;
  // The head counts from the projections' shapes: a tensor-parallel rank holds some heads only.
  const int64_t nh = q_proj->weight.size(0) / d, nkv = k_proj->weight.size(0) / d;
  auto heads = [&](const Tensor& y, int64_t n) { return transpose(reshape(y, Shape{b, t, n, d}), 1, 2); };
  // The projections and norms through their hooks (parallelism applied from outside).
  Tensor q = (*q_proj)(x), k = (*k_proj)(x);
  if (q_norm) {  // per head, before the rotation (Qwen3)
    q = (*q_norm)(reshape(q, Shape{b, t, nh, d}));
    k = (*k_norm)(reshape(k, Shape{b, t, nkv, d}));
  }
  q = heads(q, nh);  // [B, H, T, d]
  k = heads(k, nkv);
  Tensor v = heads((*v_proj)(x), nkv);
  if (cos.defined()) {
    q = rotary_embedding(q, cos, sin);
    k = rotary_embedding(k, cos, sin);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const Tensor attn = cache ? cache->update_and_attend(layer, q, k, v, keep, scale) : dense_attention(q, k, v, keep, scale);
  return (*o_proj)(attn);
}

Tensor causal_keep_mask(int64_t b, int64_t t, int64_t past, const std::vector<uint8_t>& valid, Device device) {
  const int64_t s = past + t;
  TPU_CHECK(valid.empty() || static_cast<int64_t>(valid.size()) == b * s,
            "causal_keep_mask: {} validity flags given for batch {} x {} keys", valid.size(), b, s);
  std::vector<uint8_t> keep(static_cast<size_t>(b * t * s), 0);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j <= past + i; ++j) {
        // A padded query still sees itself, so no row of the softmax is empty.
        const bool ok = valid.empty() || valid[static_cast<size_t>(r * s + j)] != 0 || j == past + i;
        keep[static_cast<size_t>((r * t + i) * s + j)] = ok ? 1 : 0;
      }
  std::vector<bool> kb(keep.begin(), keep.end());
  NoGradGuard ng;
  return from_vector(kb, Shape{b, 1, t, s}, TensorOptions(DType::boolean, device));
}

}  // namespace tpu::nn
