#include "tpucore/nn/transformer.h"

#include <cmath>
#include <numbers>
#include <tuple>

#include "tpucore/autograd.h"
#include "tpucore/fused_ops.h"
#include "tpucore/nn/fused_path.h"
#include "tpucore/nn/quantized.h"

namespace tpu::nn {

GatedMLP::GatedMLP(int64_t hidden, int64_t inter, const std::string& act_name, bool bias, Generator* gen) {
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(hidden, inter, bias, gen));
  up_proj = register_module("up_proj", std::make_shared<Linear>(hidden, inter, bias, gen));
  down_proj = register_module("down_proj", std::make_shared<Linear>(inter, hidden, bias, gen));
  act = register_module("act", activation(act_name));
}
Tensor GatedMLP::forward(const Tensor& x) {
  // gate and up in one product when packed (the same values as the two).
  std::vector<Tensor> gu;
  if (gate_up_pack) gu = packed_forward(*gate_up_pack, {gate_proj.get(), up_proj.get()}, x);
  const Tensor g = gu.empty() ? (*gate_proj)(x) : gu[0], u = gu.empty() ? (*up_proj)(x) : gu[1];
  // silu(g) * u in one pass on the cpu (the same values as the chain: tpucore/fused_ops.h).
  if (act->type_name() == "SiLU" && !act->has_forward_hooks() && detail::fused_path_ok({&g, &u}) &&
      g.dtype() == u.dtype() && g.shape() == u.shape() && is_floating(g.dtype()))
    return (*down_proj)(silu_mul(g, u));
  return (*down_proj)(mul(act->forward(g), u));
}

UnitOffsetRMSNorm::UnitOffsetRMSNorm(Shape shape, double eps) : RMSNorm(std::move(shape), eps) {
  NoGradGuard ng;
  weight.zero_();
}
Tensor UnitOffsetRMSNorm::forward(const Tensor& x) {
  if (x.dtype() == DType::f32 && weight.dtype() == DType::f32)
    return rms_norm(x, normalized_shape, add(weight, 1.0), eps);
  // As Transformers' Gemma: normalized and scaled by (1 + w) in f32, then back to x's dtype.
  return tpu::to(rms_norm(tpu::to(x, DType::f32), normalized_shape, add(tpu::to(weight, DType::f32), 1.0), eps),
                 x.dtype());
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
  if (cfg.qk_norm && cfg.unit_offset_norm) {
    q_norm = register_module("q_norm", std::make_shared<UnitOffsetRMSNorm>(Shape{d}, cfg.norm_eps));
    k_norm = register_module("k_norm", std::make_shared<UnitOffsetRMSNorm>(Shape{d}, cfg.norm_eps));
  } else if (cfg.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(Shape{d}, cfg.norm_eps));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(Shape{d}, cfg.norm_eps));
  }
  TPU_CHECK(cfg.scaling >= 0 && cfg.variant.window >= 0 && cfg.variant.softcap >= 0,
            "Attention: scaling ({}), sliding window ({}) and soft-capping ({}) must not be negative", cfg.scaling,
            cfg.variant.window, cfg.variant.softcap);
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
  // q, k and v in one product when packed (the same values as the three).
  std::vector<Tensor> qkv;
  if (qkv_pack) qkv = packed_forward(*qkv_pack, {q_proj.get(), k_proj.get(), v_proj.get()}, x);
  Tensor q = qkv.empty() ? (*q_proj)(x) : qkv[0], k = qkv.empty() ? (*k_proj)(x) : qkv[1];
  if (q_norm) {  // per head, before the rotation (Qwen3)
    q = (*q_norm)(reshape(q, Shape{b, t, nh, d}));
    k = (*k_norm)(reshape(k, Shape{b, t, nkv, d}));
  }
  q = heads(q, nh);  // [B, H, T, d]
  k = heads(k, nkv);
  Tensor v = heads(qkv.empty() ? (*v_proj)(x) : qkv[2], nkv);
  if (cos.defined()) {
    const int64_t r = cos.size(-1);  // the rotary dimension (partial_rotary_factor < 1: the rest passes)
    TPU_CHECK(r <= d && sin.defined() && sin.size(-1) == r,
              "Attention: rotary tables of width {} for head_dim {}", r, d);
    auto rotate = [&](const Tensor& y) {
      if (r == d) return rotary_embedding(y, cos, sin);
      return cat({rotary_embedding(narrow(y, 3, 0, r), cos, sin), narrow(y, 3, r, d - r)}, 3);
    };
    if (r == d && detail::fused_path_ok({&q, &k, &cos, &sin})) {
      std::tie(q, k) = rotary_embedding_qk(q, k, cos, sin);  // one call, the same values
    } else {
      q = rotate(q);
      k = rotate(k);
    }
  }
  const double scale = cfg.scaling > 0 ? cfg.scaling : 1.0 / std::sqrt(static_cast<double>(d));
  Tensor attn;
  if (cfg.variant.plain())
    attn = cache ? cache->update_and_attend(layer, q, k, v, keep, scale) : dense_attention(q, k, v, keep, scale);
  else
    attn = cache ? cache->update_and_attend_variant(layer, q, k, v, keep, scale, cfg.variant)
                 : dense_attention(q, k, v, keep, scale, cfg.variant);
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
