#include "tpucore/serve/sim_step.h"

#include <cmath>

#include "codegen/launch.h"
#include "tpucore/autograd.h"
#include "tpucore/serve/paged_forward.h"

namespace tpu::serve {

SimPagedStep::SimPagedStep(models::CausalLM& m, const PagedCacheConfig& c) : m_(m), cfg_(c) {
  const models::ModelConfig& mc = m.config;
  const Device dev = m.device();
  TPU_CHECK(codegen::runs_generated_programs(dev), "serve: the chip paged attention step needs a chip device, not {}",
            dev.str());
  TPU_CHECK(m.dtype() == DType::f32 || m.dtype() == DType::bf16,
            "serve: the chip paged attention step runs f32 or bf16 models, not {}", dtype_name(m.dtype()));
  TPU_CHECK(c.num_layers == mc.num_hidden_layers && c.kv_heads == mc.num_key_value_heads && c.head_dim == mc.head_dim,
            "serve: the paged cache ({} layers, {} kv heads, head_dim {}) does not fit the model ({}, {}, {})",
            c.num_layers, c.kv_heads, c.head_dim, mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim);
  spec_ = paged_spec_of(mc, c.block_size, m.dtype());
  codegen::choose_paged_attention_tiling(codegen::chip_config(dev), spec_);
  const TensorOptions o(m.dtype(), dev);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    k_.push_back(zeros(Shape{c.num_blocks * c.block_size, c.kv_heads * c.head_dim}, o));
    v_.push_back(zeros(Shape{c.num_blocks * c.block_size, c.kv_heads * c.head_dim}, o));
  }
}

Tensor SimPagedStep::run(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
                         const RaggedBatch& batch, const std::vector<int64_t>& logit_rows) {
  const models::ModelConfig& mc = m_.config;
  const auto n = static_cast<int64_t>(ids.size());
  TPU_CHECK(n > 0 && static_cast<int64_t>(positions.size()) == n && batch.num_tokens() == n,
            "serve: {} token ids, {} positions and a batch of {} tokens must agree (and be non-empty)", n,
            positions.size(), batch.num_tokens());
  for (int64_t r : logit_rows) TPU_CHECK(r >= 0 && r < n, "serve: logit row {} outside the {} tokens", r, n);
  batch.validate(cfg_);
  // The work-unit table's capacity is a power of two (>= 8): one program per capacity.
  codegen::PagedAttentionSpec spec = spec_;
  const int64_t units = codegen::paged_attention_units(spec, batch.query_start);
  while (spec.max_units < units) spec.max_units *= 2;
  const codegen::PagedAttentionMeta meta =
      codegen::plan_paged_attention(spec, cfg_.num_blocks, batch.query_start, batch.context_len, batch.block_tables);
  const Device dev = m_.device();
  auto i32 = [&](const std::vector<int32_t>& v) {
    return from_vector(v, Shape{static_cast<int64_t>(v.size())}, TensorOptions(DType::i32, dev));
  };
  const Tensor t_units = i32(meta.units), t_pages = i32(meta.pages), t_slots = i32(meta.slots);
  // The forward runs over the tokens plus tile padding (a prefill tile reads tile_tokens query
  // rows from its first token); the padding tokens' results are never used.
  const int64_t np = n + spec.tile_tokens - 1;
  std::vector<int64_t> ids_p(ids), pos_p(positions);
  ids_p.resize(static_cast<size_t>(np), 0);
  pos_p.resize(static_cast<size_t>(np), 0);
  NoGradGuard ng;
  const int64_t hq = mc.num_attention_heads, d = mc.head_dim;
  auto [cos, sin] = nn::rope_tables(pos_p, 1, m_.inv_freq, m_.dtype(), dev);
  Tensor h = m_.model->embed_tokens->forward(from_vector(ids_p, Shape{1, np}, TensorOptions(DType::i64, dev)));
  for (size_t li = 0; li < m_.model->layers.size(); ++li) {
    models::DecoderLayer& layer = *m_.model->layers[li];
    nn::Attention& at = *layer.self_attn;
    auto [q, k, v] = project_qkv(layer, mc, layer.input_layernorm->forward(h), np, cos, sin);
    q = q.contiguous();
    k = k.contiguous();
    v = v.contiguous();
    Tensor out = empty(Shape{1, np, hq * d}, TensorOptions(m_.dtype(), dev));
    codegen::run_paged_attention(spec, n, q, k, v, k_[li], v_[li], out, t_units, t_pages, t_slots);
    h = add(h, at.o_proj->forward(out));
    h = add(h, layer.mlp->forward(layer.post_attention_layernorm->forward(h)));
  }
  h = m_.model->norm->forward(h);
  const auto rows = static_cast<int64_t>(logit_rows.size());
  const TensorOptions host_f32(DType::f32, Device());
  if (rows == 0) return zeros(Shape{0, mc.vocab_size}, host_f32);
  // The sampled rows, gathered by the embedding op (a chip kernel; index_select has none).
  h = embedding(reshape(h, Shape{np, mc.hidden_size}), from_vector(logit_rows, Shape{rows}, TensorOptions(DType::i64, dev)));
  Tensor logits = linear(h, m_.lm_head ? m_.lm_head->weight : m_.model->embed_tokens->weight);
  return reshape(logits, Shape{rows, mc.vocab_size}).to(DType::f32).to(Device()).contiguous();
}

}  // namespace tpu::serve
