#include "tpucore/nn/mla.h"

#include <cmath>

namespace tpu::nn {

int64_t mla_cache_head_dim(int64_t kv_lora_rank, int64_t qk_rope_head_dim) {
  return (kv_lora_rank + qk_rope_head_dim + 1) / 2;
}

MLAttention::MLAttention(MLAConfig c, Generator* gen) : cfg(c) {
  TPU_CHECK(c.hidden > 0 && c.num_heads > 0 && c.kv_lora_rank > 0 && c.qk_nope_head_dim >= 0 &&
                c.qk_rope_head_dim > 0 && c.qk_rope_head_dim % 2 == 0 && c.v_head_dim > 0 && c.q_lora_rank >= 0,
            "MLAttention: hidden ({}), num_heads ({}), kv_lora_rank ({}) and v_head_dim ({}) must be positive, "
            "qk_rope_head_dim ({}) positive and even, qk_nope_head_dim ({}) and q_lora_rank ({}) not negative",
            c.hidden, c.num_heads, c.kv_lora_rank, c.v_head_dim, c.qk_rope_head_dim, c.qk_nope_head_dim,
            c.q_lora_rank);
  const int64_t h = c.num_heads, dq = c.qk_nope_head_dim + c.qk_rope_head_dim;
  if (c.q_lora_rank == 0) {
    q_proj = register_module("q_proj", std::make_shared<Linear>(c.hidden, h * dq, false, gen));
  } else {
    q_a_proj = register_module("q_a_proj", std::make_shared<Linear>(c.hidden, c.q_lora_rank, c.bias, gen));
    q_a_layernorm = register_module("q_a_layernorm", std::make_shared<RMSNorm>(Shape{c.q_lora_rank}, c.latent_norm_eps));
    q_b_proj = register_module("q_b_proj", std::make_shared<Linear>(c.q_lora_rank, h * dq, false, gen));
  }
  kv_a_proj_with_mqa = register_module(
      "kv_a_proj_with_mqa", std::make_shared<Linear>(c.hidden, c.kv_lora_rank + c.qk_rope_head_dim, c.bias, gen));
  kv_a_layernorm = register_module("kv_a_layernorm", std::make_shared<RMSNorm>(Shape{c.kv_lora_rank}, c.latent_norm_eps));
  kv_b_proj = register_module(
      "kv_b_proj", std::make_shared<Linear>(c.kv_lora_rank, h * (c.qk_nope_head_dim + c.v_head_dim), false, gen));
  o_proj = register_module("o_proj", std::make_shared<Linear>(h * c.v_head_dim, c.hidden, c.bias, gen));
}

namespace {

// Rotates the rope part y [..., T, d] (d even) with tables [B, 1, T, d]; with `interleave` the
// pairs (y[2i], y[2i + 1]) are first regrouped as (y[i], y[i + d/2]) (rotate-half order).
Tensor mla_rotate(const Tensor& y, const Tensor& cos, const Tensor& sin, bool interleave) {
  Tensor z = y;
  if (interleave) {
    Shape pairs = y.shape();
    pairs[pairs.ndim() - 1] = pairs.back() / 2;
    pairs.push_back(2);
    z = reshape(contiguous(transpose(reshape(y, pairs), -1, -2)), y.shape());
  }
  return rotary_embedding(z, cos, sin);
}

// x [B, H, T, k] times one matrix per head w [H, k, n] -> [B, H, T, n], with batch dims of
// equal sizes on both sides (as a chip's batched matmul takes them: no broadcast batch dims).
Tensor mla_per_head_matmul(const Tensor& x, const Tensor& w) {
  const Tensor w4 = unsqueeze(w, 0);
  return matmul(x, x.size(0) == 1 ? w4 : contiguous(expand(w4, Shape{x.size(0), w.size(0), w.size(1), w.size(2)})));
}

}  // namespace

Tensor MLAttention::forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep,
                            AttentionCache* cache, int64_t layer) {
  TPU_CHECK(x.defined() && x.dim() == 3 && x.size(2) == cfg.hidden,
            "MLAttention: expected input [batch, seq, {}], got shape {}", cfg.hidden,
            x.defined() ? x.shape().str() : std::string("undefined"));
  const int64_t dn = cfg.qk_nope_head_dim, dr = cfg.qk_rope_head_dim, dv = cfg.v_head_dim, r = cfg.kv_lora_rank;
  // The head count from the projections' shapes: a tensor-parallel rank holds some heads only
  // (q_proj / q_b_proj and kv_b_proj split by rows, o_proj by columns, per head).
  const int64_t b = x.size(0), t = x.size(1), h = (q_proj ? q_proj : q_b_proj)->weight.size(0) / (dn + dr);
  TPU_CHECK(h > 0 && kv_b_proj->weight.size(0) == h * (dn + dv) && o_proj->weight.size(1) == h * dv,
            "MLAttention: the query projection holds {} heads, kv_b_proj {} rows (want {}) and o_proj {} columns "
            "(want {})", h, kv_b_proj->weight.size(0), h * (dn + dv), o_proj->weight.size(1), h * dv);
  if (cos.defined())
    TPU_CHECK(cos.size(-1) == dr && sin.defined() && sin.size(-1) == dr,
              "MLAttention: rotary tables of width {} for qk_rope_head_dim {}", cos.size(-1), dr);
  // The contiguous KVCache holds the latents split in halves; any other cache (the serving
  // engine's paged caches) receives the latent as the one key and value head of an absorbed
  // attention.
  KVCache* latent_cache = cache ? dynamic_cast<KVCache*>(cache) : nullptr;
  // Queries [B, H, T, nope + rope].
  Tensor q = q_proj ? (*q_proj)(x) : (*q_b_proj)((*q_a_layernorm)((*q_a_proj)(x)));
  q = transpose(reshape(q, Shape{b, t, h, dn + dr}), 1, 2);
  Tensor q_pe = narrow(q, 3, dn, dr);
  // The latent of the new tokens: normalized c and the rotated, head-shared k_pe.
  const Tensor ckv = (*kv_a_proj_with_mqa)(x);  // [B, T, r + dr]
  const Tensor c = (*kv_a_layernorm)(narrow(ckv, 2, 0, r));
  Tensor k_pe = unsqueeze(narrow(ckv, 2, r, dr), 1);  // [B, 1, T, dr]
  if (cos.defined()) {
    q_pe = mla_rotate(q_pe, cos, sin, cfg.rope_interleave);
    k_pe = mla_rotate(k_pe, cos, sin, cfg.rope_interleave);
  }
  Tensor latent = cat({c, reshape(k_pe, Shape{b, t, dr})}, 2);  // [B, T, r + dr]
  if (latent_cache) {
    const int64_t half = mla_cache_head_dim(r, dr), pad = 2 * half - (r + dr);
    Tensor l = latent;
    if (pad > 0) l = cat({l, zeros(Shape{b, t, pad}, TensorOptions(l.dtype(), l.device()))}, 2);
    l = unsqueeze(l, 1);  // [B, 1, T, 2 half]
    auto [ka, va] = latent_cache->update(layer, contiguous(narrow(l, 3, 0, half)), contiguous(narrow(l, 3, half, half)));
    const int64_t s = ka.size(2);
    latent = narrow(reshape(cat({ka, va}, 3), Shape{b, s, 2 * half}), 2, 0, r + dr);  // [B, S, r + dr]
  }
  const double scale = cfg.scaling > 0 ? cfg.scaling : 1.0 / std::sqrt(static_cast<double>(dn + dr));
  const Tensor wkv = reshape(kv_b_proj->weight, Shape{h, dn + dv, r});
  if (cache && !latent_cache) {
    // A cache that keeps per-token rows of its own layout: the absorbed form for every token.
    // Queries [q_nope W_uk | q_pe] and one key/value head holding the latent [c | k_pe] make
    // standard attention compute softmax(scale (q_nope W_uk c + q_pe k_pe)) [c | k_pe] per
    // head; the first r values of that output times W_uv are the heads' attention outputs.
    const Tensor q_lat = cat({mla_per_head_matmul(narrow(q, 3, 0, dn), narrow(wkv, 1, 0, dn)), q_pe}, 3);  // [B, H, T, r + dr]
    const Tensor kv_lat = unsqueeze(latent, 1);                                                // [B, 1, T, r + dr]
    const Tensor a = cache->update_and_attend(layer, q_lat, kv_lat, kv_lat, keep, scale);    // [B, T, H (r + dr)]
    TPU_CHECK(a.dim() == 3 && a.size(2) == h * (r + dr),
              "MLAttention: the attention cache returned {} for {} heads of latent width {}", a.shape().str(), h, r + dr);
    const Tensor o_lat = transpose(narrow(reshape(a, Shape{b, t, h, r + dr}), 3, 0, r), 1, 2);  // [B, H, T, r]
    const Tensor o = mla_per_head_matmul(o_lat, transpose(narrow(wkv, 1, dn, dv), 1, 2));       // [B, H, T, dv]
    return (*o_proj)(reshape(transpose(o, 1, 2), Shape{b, t, h * dv}));
  }
  const int64_t s = latent.size(1);
  const Tensor mask = keep.defined() ? keep : causal_keep_mask(b, t, s - t, {}, x.device());
  if (latent_cache && t == 1 && !is_training()) {
    // Decoding one token: the absorbed form. kv_b_proj's key rows fold into the query (q_nope
    // W_uk scores against the latent c directly) and its value rows apply after the attention
    // over the latents, so no cached position is expanded to per-head keys and values.
    const Tensor q_lat = mla_per_head_matmul(narrow(q, 3, 0, dn), narrow(wkv, 1, 0, dn));  // [B, H, 1, r]
    const Tensor lat = unsqueeze(latent, 1);                                       // [B, 1, S, r + dr]
    const Tensor o_lat = masked_attention(cat({q_lat, q_pe}, 3), lat, narrow(lat, 3, 0, r), mask, scale);
    const Tensor o = mla_per_head_matmul(o_lat, transpose(narrow(wkv, 1, dn, dv), 1, 2));  // [B, H, 1, dv]
    return (*o_proj)(reshape(transpose(o, 1, 2), Shape{b, t, h * dv}));
  }
  // Every head's keys and values from the latents of the S visible positions.
  const Tensor kv = transpose(reshape((*kv_b_proj)(narrow(latent, 2, 0, r)), Shape{b, s, h, dn + dv}), 1, 2);
  const Tensor k_rot = expand(unsqueeze(narrow(latent, 2, r, dr), 1), Shape{b, h, s, dr});
  const Tensor k = cat({narrow(kv, 3, 0, dn), k_rot}, 3);  // [B, H, S, nope + rope]
  const Tensor v = narrow(kv, 3, dn, dv);
  const Tensor qq = cat({narrow(q, 3, 0, dn), q_pe}, 3);
  const Tensor attn = masked_attention(qq, k, v, mask, scale);  // [B, H, T, dv]
  return (*o_proj)(reshape(transpose(attn, 1, 2), Shape{b, t, h * dv}));
}

}  // namespace tpu::nn
