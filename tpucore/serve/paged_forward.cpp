#include "tpucore/serve/paged_forward.h"

#include <cmath>

#include "tpucore/autograd.h"

namespace tpu::serve {

codegen::PagedAttentionSpec paged_spec_of(const models::ModelConfig& mc, int64_t block_size, DType dtype) {
  codegen::PagedAttentionSpec s;
  s.heads = mc.num_attention_heads;
  s.kv_heads = mc.num_key_value_heads;
  s.head_dim = mc.head_dim;
  s.block_size = block_size;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(mc.head_dim)));
  const bool bf16 = dtype == DType::bf16;
  s.dtype = bf16 ? sim::DType::bf16 : sim::DType::f32;
  s.mode = bf16 ? sim::MxuMode::bf16 : sim::MxuMode::f32;
  return s;
}

LayerQKV project_qkv(models::DecoderLayer& layer, const models::ModelConfig& mc, const Tensor& x, int64_t n,
                     const Tensor& cos, const Tensor& sin) {
  const int64_t hq = mc.num_attention_heads, hkv = mc.num_key_value_heads, d = mc.head_dim;
  nn::Attention& at = *layer.self_attn;
  Tensor q = reshape(at.q_proj->forward(x), Shape{1, n, hq, d});
  Tensor k = reshape(at.k_proj->forward(x), Shape{1, n, hkv, d});
  Tensor v = reshape(at.v_proj->forward(x), Shape{1, n, hkv, d});
  if (at.q_norm) {
    q = at.q_norm->forward(q);
    k = at.k_norm->forward(k);
  }
  // Rotary tables are laid out for [B, H, T, d]; rotate there and come back to token-major.
  q = transpose(rotary_embedding(transpose(q, 1, 2), cos, sin), 1, 2);
  k = transpose(rotary_embedding(transpose(k, 1, 2), cos, sin), 1, 2);
  return {q, k, v};
}

Tensor ragged_forward(models::CausalLM& m, PagedKVCache& cache, const std::vector<int64_t>& ids,
                      const std::vector<int64_t>& positions, const RaggedBatch& batch,
                      const std::vector<int64_t>& logit_rows) {
  const models::ModelConfig& mc = m.config;
  const PagedCacheConfig& cc = cache.config();
  const auto n = static_cast<int64_t>(ids.size());
  TPU_CHECK(m.device().is_cpu(), "serve: the paged attention kernel runs on the cpu, the model is on {}",
            m.device().str());
  TPU_CHECK(cc.num_layers == mc.num_hidden_layers && cc.kv_heads == mc.num_key_value_heads &&
                cc.head_dim == mc.head_dim,
            "serve: the paged cache ({} layers, {} kv heads, head_dim {}) does not fit the model ({}, {}, {})",
            cc.num_layers, cc.kv_heads, cc.head_dim, mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim);
  TPU_CHECK(n > 0 && static_cast<int64_t>(positions.size()) == n && batch.num_tokens() == n,
            "serve: {} token ids, {} positions and a batch of {} tokens must agree (and be non-empty)", n,
            positions.size(), batch.num_tokens());
  for (int64_t r : logit_rows) TPU_CHECK(r >= 0 && r < n, "serve: logit row {} outside the {} tokens", r, n);
  NoGradGuard ng;
  const int64_t hq = mc.num_attention_heads, d = mc.head_dim;
  const TensorOptions host_f32(DType::f32, m.device());
  auto [cos, sin] = nn::rope_tables(positions, 1, m.inv_freq, m.dtype(), m.device());  // [1, 1, n, d]
  Tensor h = m.model->embed_tokens->forward(from_vector(ids, Shape{1, n}, TensorOptions(DType::i64, m.device())));
  std::vector<float> out(static_cast<size_t>(n * hq * d));
  for (size_t li = 0; li < m.model->layers.size(); ++li) {
    models::DecoderLayer& layer = *m.model->layers[li];
    nn::Attention& at = *layer.self_attn;
    auto [q, k, v] = project_qkv(layer, mc, layer.input_layernorm->forward(h), n, cos, sin);
    q = q.to(DType::f32).contiguous();
    k = k.to(DType::f32).contiguous();
    v = v.to(DType::f32).contiguous();
    ragged_paged_attention(cache, static_cast<int64_t>(li), batch, q.data<float>(), k.data<float>(),
                           v.data<float>(), out.data(), hq, 1.0 / std::sqrt(static_cast<double>(d)));
    Tensor attn = from_vector(out, Shape{1, n, hq * d}, host_f32).to(m.dtype());
    h = add(h, at.o_proj->forward(attn));
    h = add(h, layer.mlp->forward(layer.post_attention_layernorm->forward(h)));
  }
  h = m.model->norm->forward(h);
  const auto rows = static_cast<int64_t>(logit_rows.size());
  if (rows == 0) return zeros(Shape{0, mc.vocab_size}, host_f32);
  h = index_select(h, 1, from_vector(logit_rows, Shape{rows}, TensorOptions(DType::i64, m.device())));
  Tensor logits = linear(h, m.lm_head ? m.lm_head->weight : m.model->embed_tokens->weight);
  return reshape(logits, Shape{rows, mc.vocab_size}).to(DType::f32).contiguous();
}

}  // namespace tpu::serve
