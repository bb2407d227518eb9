#include "tpucore/serve/compiled_step.h"

#include <algorithm>
#include <cmath>

#include "tpucore/autograd.h"
#include "codegen/launch.h"
#include "tpucore/compile.h"
#include "tpucore/serve/paged_forward.h"
#include "tpucore/serve/paged_op.h"

namespace tpu::serve {

int64_t CompiledStep::token_bucket(int64_t n) const {
  const int64_t need = n + spec_.tile_tokens - 1;
  for (int64_t b : buckets_)
    if (b >= need) return b;
  fail("serve: a step of {} tokens exceeds the compiled step's largest bucket {}", n, buckets_.back());
}

int64_t CompiledStep::num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

codegen::PagedAttentionSpec CompiledStep::spec_for(int64_t nb) const {
  codegen::PagedAttentionSpec s = spec_;
  s.max_units = nb;  // a unit holds at least one of the step's (at most nb) tokens
  return s;
}

int64_t CompiledStep::pages_capacity(int64_t nb) const {
  // Every unit lists at most the pages of a full context, in whole steps of its class (decode
  // or prefill), and each class's list ends with two more steps the kernel prefetches.
  int64_t per_unit = 0, overfetch = 0;
  for (bool decode : {true, false}) {
    const int64_t pps = codegen::paged_pages_per_step(spec_, decode);
    const int64_t keys = pps * c_.block_size;
    per_unit = std::max(per_unit, ((max_context_ + keys - 1) / keys) * pps);
    overfetch += 2 * pps;
  }
  return nb * per_unit + overfetch;
}

CompiledStep::CompiledStep(models::CausalLM& m, const PagedCacheConfig& c, const std::string& name,
                           int64_t max_tokens, int64_t max_context, int64_t max_seqs)
    : m_(m), c_(c), max_tokens_(max_tokens), max_context_(max_context), max_seqs_(max_seqs) {
  const models::ModelConfig& mc = m.config;
  const Device dev = m.device();
  TPU_CHECK(c.num_layers == mc.num_hidden_layers && c.kv_heads == mc.num_key_value_heads && c.head_dim == mc.head_dim,
            "serve: the paged cache ({} layers, {} kv heads, head_dim {}) does not fit the model", c.num_layers,
            c.kv_heads, c.head_dim);
  TPU_CHECK(max_tokens > 0 && max_context > 0 && max_seqs > 0,
            "serve: the compiled step needs a positive token budget ({}), context ({}) and sequence limit ({})",
            max_tokens, max_context, max_seqs);
  const bool chip = codegen::runs_generated_programs(dev);
  TPU_CHECK(dev.is_cpu() || chip, "serve: the compiled step runs on the cpu or a chip that runs generated programs, not {}",
            dev.str());
  TPU_CHECK(m.dtype() == DType::f32 || m.dtype() == DType::bf16, "serve: the compiled step runs f32 or bf16 models, not {}",
            dtype_name(m.dtype()));
  spec_ = paged_spec_of(mc, c.block_size, m.dtype());
  if (chip) {
    codegen::choose_paged_attention_tiling(codegen::chip_config(dev), spec_);
  } else {  // the cpu kernel walks tokens one by one: no tile read-ahead, one page per step
    spec_.tile_tokens = 1;
    spec_.pages_per_step = 1;
  }
  // Token buckets. On a chip: powers of two from the prefill tile (a one-token step reads a
  // tile of rows), one paged attention program each. On the cpu, which pays for padded rows in
  // every projection and MLP while a graph costs little: every count up to 16, then 8 buckets
  // per octave (16, 18, .., 30, 32, 36, ..: a step pads less than 1/8 of its rows).
  const int64_t need = max_tokens + spec_.tile_tokens - 1;
  if (chip) {
    int64_t p = 1;
    while (p < spec_.tile_tokens) p *= 2;
    for (buckets_.push_back(p); buckets_.back() < need;) buckets_.push_back(buckets_.back() * 2);
  } else {
    for (int64_t b = 1; buckets_.empty() || buckets_.back() < need;) {
      buckets_.push_back(b);
      int64_t oct = 1;
      while (oct * 2 <= b) oct *= 2;
      b += std::max<int64_t>(1, oct / 8);
    }
  }
  NoGradGuard ng;
  const int64_t slots = c.num_blocks * c.block_size;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    k_.push_back(zeros(Shape{slots, c.kv_heads * c.head_dim}, TensorOptions(m.dtype(), dev)));
    v_.push_back(zeros(Shape{slots, c.kv_heads * c.head_dim}, TensorOptions(m.dtype(), dev)));
  }
  auto step = [this](const Tensor& ids, const Tensor& cos, const Tensor& sin, const Tensor& units, const Tensor& pages,
                     const Tensor& slot_ids, const Tensor& rows) {
    const models::ModelConfig& mc = m_.config;
    const int64_t nb = ids.size(1), hq = mc.num_attention_heads, hkv = mc.num_key_value_heads, d = mc.head_dim;
    const codegen::PagedAttentionSpec spec = spec_for(nb);
    Tensor h = m_.model->embed_tokens->forward(ids);
    for (size_t li = 0; li < m_.model->layers.size(); ++li) {
      models::DecoderLayer& layer = *m_.model->layers[li];
      auto [q, k, v] = project_qkv(layer, mc, layer.input_layernorm->forward(h), nb, cos, sin);
      Tensor a = paged_attention(spec, reshape(q.contiguous(), Shape{nb, hq * d}),
                                 reshape(k.contiguous(), Shape{nb, hkv * d}), reshape(v.contiguous(), Shape{nb, hkv * d}),
                                 k_[li], v_[li], units, pages, slot_ids);
      h = add(h, layer.self_attn->o_proj->forward(reshape(a, Shape{1, nb, hq * d})));
      h = add(h, layer.mlp->forward(layer.post_attention_layernorm->forward(h)));
    }
    // The rows to sample, gathered by the embedding op (a chip kernel on sim), normed. The head
    // runs outside the graph on exactly the sampled rows (the graph's row count is padded).
    return m_.model->norm->forward(embedding(reshape(h, Shape{nb, mc.hidden_size}), rows));
  };
  // Fusion into regions on chips only (fewer, fused chip programs). On the cpu this step's
  // matmul + epilogue regions (residual adds, SiLU gate) ran slower than the plain kernels at
  // serving sizes: compiled/eager CPU per step 1.03-1.09 fused vs 0.95-1.06 unfused in
  // interleaved single-threaded runs of bench_serve's BM_step_interleaved (N = 8 and 32).
  fn_ = tpu::compile(step, CompileOptions{.name = name,
                                          .warn_after_recompiles = static_cast<int>(num_buckets()),
                                          .fuse = chip});
}

Tensor CompiledStep::run_bucket(int64_t nb, const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
                                const codegen::PagedAttentionMeta& meta, const std::vector<int64_t>& logit_rows) {
  const Device dev = m_.device();
  const int64_t rows_cap = std::min(nb, max_seqs_);
  std::vector<int64_t> tok(static_cast<size_t>(nb), 0), pos(static_cast<size_t>(nb), 0),
      rows(static_cast<size_t>(rows_cap), 0);
  std::copy(ids.begin(), ids.end(), tok.begin());
  std::copy(positions.begin(), positions.end(), pos.begin());
  std::copy(logit_rows.begin(), logit_rows.end(), rows.begin());
  TPU_CHECK(static_cast<int64_t>(meta.pages.size()) <= pages_capacity(nb),
            "serve: the step's page list ({} entries) exceeds the compiled step's capacity {}", meta.pages.size(),
            pages_capacity(nb));
  std::vector<int32_t> pages(meta.pages), slots(meta.slots);
  pages.resize(static_cast<size_t>(pages_capacity(nb)), 0);
  slots.resize(static_cast<size_t>(nb), 0);
  auto i32 = [&](const std::vector<int32_t>& v) {
    return from_vector(v, Shape{static_cast<int64_t>(v.size())}, TensorOptions(DType::i32, dev));
  };
  NoGradGuard ng;
  auto [cos, sin] = nn::rope_tables(pos, 1, m_.inv_freq, m_.dtype(), dev);
  return fn_(from_vector(tok, Shape{1, nb}, TensorOptions(DType::i64, dev)), cos, sin, i32(meta.units), i32(pages),
             i32(slots), from_vector(rows, Shape{rows_cap}, TensorOptions(DType::i64, dev)));
}

int64_t CompiledStep::warm_up() {
  int64_t graphs = 0;
  for (int64_t nb : buckets_) {
    // A step of no tokens: the unit table's header counts 0 tokens, so nothing is written.
    const codegen::PagedAttentionMeta meta = codegen::plan_paged_attention(spec_for(nb), c_.num_blocks, {0}, {}, {});
    run_bucket(nb, {}, {}, meta, {});
    ++graphs;
  }
  return graphs;
}

Tensor CompiledStep::run(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
                         const RaggedBatch& rb, const std::vector<int64_t>& logit_rows) {
  rb.validate(c_);
  const auto n = static_cast<int64_t>(ids.size());
  TPU_CHECK(n > 0 && static_cast<int64_t>(positions.size()) == n && rb.num_tokens() == n,
            "serve: {} token ids, {} positions and a batch of {} tokens must agree (and be non-empty)", n,
            positions.size(), rb.num_tokens());
  TPU_CHECK(n <= max_tokens_, "serve: a step of {} tokens exceeds the compiled step's budget of {}", n, max_tokens_);
  for (int64_t c : rb.context_len)
    TPU_CHECK(c <= max_context_, "serve: a context of {} exceeds the compiled step's {}", c, max_context_);
  const auto nrows = static_cast<int64_t>(logit_rows.size());
  TPU_CHECK(nrows <= std::min(rb.num_seqs(), max_seqs_), "serve: {} rows to sample from {} sequences (limit {})", nrows,
            rb.num_seqs(), max_seqs_);
  for (int64_t r : logit_rows) TPU_CHECK(r >= 0 && r < n, "serve: logit row {} outside the {} tokens", r, n);
  const int64_t nb = token_bucket(n);
  const codegen::PagedAttentionMeta meta =
      codegen::plan_paged_attention(spec_for(nb), c_.num_blocks, rb.query_start, rb.context_len, rb.block_tables);
  const Tensor h = run_bucket(nb, ids, positions, meta, logit_rows);  // [min(nb, max_seqs), hidden]
  NoGradGuard ng;
  if (nrows == 0) return zeros(Shape{0, m_.config.vocab_size}, TensorOptions(DType::f32, Device()));
  const Tensor logits = linear(narrow(h, 0, 0, nrows), m_.lm_head ? m_.lm_head->weight : m_.model->embed_tokens->weight);
  return logits.to(DType::f32).to(Device()).contiguous();
}

}  // namespace tpu::serve
