#include "tpucore/serve/model_runner.h"

#include <algorithm>
#include <cmath>

#include "codegen/launch.h"
#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/core/batch_invariant.h"

namespace tpu::serve {

namespace {
// The ragged paged attention spec of a model (heads, head_dim, 1/sqrt(head_dim) scale) with KV
// blocks of `block_size` in `dtype` (f32 or bf16; f32 multiplies exactly, as the cpu does).
codegen::PagedAttentionSpec paged_spec_of(const models::ModelConfig& mc, const PagedCacheConfig& c, DType dtype) {
  codegen::PagedAttentionSpec s;
  s.heads = mc.num_attention_heads;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.block_size = c.block_size;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));  // each layer passes its own
  const bool bf16 = dtype == DType::bf16;
  s.dtype = bf16 ? sim::DType::bf16 : sim::DType::f32;
  s.mode = bf16 ? sim::MxuMode::bf16 : sim::MxuMode::f32;
  return s;
}

Tensor i32_tensor(const std::vector<int32_t>& v, Device dev) {
  return from_vector(v, Shape{static_cast<int64_t>(v.size())}, TensorOptions(DType::i32, dev));
}
Tensor i64_tensor(const std::vector<int64_t>& v, Shape s, Device dev) {
  return from_vector(v, std::move(s), TensorOptions(DType::i64, dev));
}
// The chip program's classes by token kind (prompt: prefill units; others: decode units)
// under batch-invariant numerics, so a token is computed the same way however its step was
// cut; otherwise by count (one token: decode), which keeps speculative verification rows
// and chunks of one in a single unit.
const std::vector<int64_t>* token_classes(const RaggedBatch& rb) {
  return batch_invariant() && !rb.prompt_tokens.empty() ? &rb.prompt_tokens : nullptr;
}

}  // namespace

PagedCacheConfig paged_cache_layout(const models::ModelConfig& mc, int64_t block_size, int64_t num_blocks) {
  if (mc.mla()) return {mc.num_hidden_layers, 1, mc.kv_lora_rank + mc.qk_rope_head_dim, block_size, num_blocks, true};
  return {mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim, block_size, num_blocks, false};
}

int64_t ModelRunner::kv_bytes_per_token() const {
  const int64_t elem = host_ ? static_cast<int64_t>(sizeof(float)) : static_cast<int64_t>(dtype_size(m_.dtype()));
  return c_.bytes_per_token(elem);
}

ModelRunner::ModelRunner(models::CausalLM& m, const PagedCacheConfig& c, const RunnerOptions& o)
    : m_(m), c_(c), o_(o) {
  if (o_.max_rows <= 0) o_.max_rows = o_.max_seqs;
  const models::ModelConfig& mc = m.config;
  const Device dev = m.device();
  const PagedCacheConfig want = paged_cache_layout(mc, c.block_size, c.num_blocks);
  TPU_CHECK(c.num_layers == want.num_layers && c.kv_heads == want.kv_heads && c.head_dim == want.head_dim &&
                c.shared_kv == want.shared_kv,
            "serve: the paged cache ({} layers, {} kv heads, head_dim {}{}) does not fit the model ({}, {}, {}{})",
            c.num_layers, c.kv_heads, c.head_dim, c.shared_kv ? ", shared keys and values" : "", want.num_layers,
            want.kv_heads, want.head_dim, want.shared_kv ? ", shared keys and values (MLA latent)" : "");
  TPU_CHECK(o.max_tokens > 0 && o.max_context > 0 && o.max_seqs > 0,
            "serve: the runner needs a positive token budget ({}), context ({}) and sequence limit ({})", o.max_tokens,
            o.max_context, o.max_seqs);
  const bool chip = codegen::runs_generated_programs(dev);
  const bool pjrt = dev.type == DeviceType::pjrt;
  if (!dev.is_cpu() || o.compile) {
    TPU_CHECK(dev.is_cpu() || chip || pjrt, "serve: the paged attention step runs on the cpu, a chip that runs "
              "generated programs or a pjrt device, not {}", dev.str());
    TPU_CHECK(m.dtype() == DType::f32 || m.dtype() == DType::bf16,
              "serve: the paged attention step on {} runs f32 or bf16 models, not {}", dev.str(), dtype_name(m.dtype()));
  }
  if (c.quantized()) {  // the host cache and its cpu kernel read quantized rows; the device paths do not
    const char* path = pjrt ? "the gather paged cache (pjrt devices)"
                       : o.compile ? "the compiled step's paged attention graph node (serve --compile)"
                       : chip ? "the chip's ragged paged attention program" : nullptr;
    TPU_CHECK(path == nullptr, "serve: kv cache dtype {} is not implemented by {}; use kv cache dtype auto there, "
              "or the eager step on the cpu", nn::kv_cache_dtype_name(c.kv_dtype), path ? path : "");
    TPU_CHECK(!mc.mla(), "serve: kv cache dtype {} is not implemented for multi-head latent attention (MLA)",
              nn::kv_cache_dtype_name(c.kv_dtype));
  }
  spec_ = paged_spec_of(mc, c, m.dtype());
  // Every layer sliding (Mistral): the steps are planned with the window, so no layer reads the
  // pages before it. Mixed local / global layers (Gemma 2 / 3) plan the full context and mask.
  bool all_sliding = mc.sliding_window > 0;
  for (int64_t i = 0; i < mc.num_hidden_layers && all_sliding; ++i) all_sliding = mc.is_sliding(i);
  if (all_sliding) spec_.window = mc.sliding_window;
  if (chip) {
    codegen::choose_paged_attention_tiling(codegen::chip_config(dev), spec_);
  } else {  // the cpu kernel walks tokens one by one: no tile read-ahead, one page per step
    spec_.tile_tokens = 1;
    spec_.pages_per_step = 1;
  }
  if (pjrt) {
    auto cache = std::make_unique<GatherPagedCache>(c, m.dtype(), dev);
    gather_ = cache.get();
    slots_ = std::move(cache);
    if (!o.compile) return;
    make_buckets(false);
    GatherPagedCache* g = gather_;
    // a: ids, cos, sin, write slots, write mask, context slots, distances, rows.
    auto step = [this, g](const std::vector<Tensor>& a) {
      g->set_gather(a[3], a[4], a[5], a[6]);
      return hidden_rows(a[0], a[1], a[2], a[7], g);
    };
    compiled_gather_ = tpu::compile(step, CompileOptions{.name = o.compile_name,
                                                         .warn_after_recompiles = static_cast<int>(num_buckets()),
                                                         .fuse = false});
    return;
  }
  if (!o.compile) {
    if (chip) slots_ = std::make_unique<ChipPagedCache>(c, m.dtype(), dev);
    else host_ = std::make_unique<HostPagedCache>(c);
    return;
  }
  make_buckets(chip);
  auto graph = std::make_unique<GraphPagedCache>(c, m.dtype(), dev);
  GraphPagedCache* cache = graph.get();
  slots_ = std::move(graph);
  auto step = [this, cache](const Tensor& ids, const Tensor& cos, const Tensor& sin, const Tensor& units,
                            const Tensor& pages, const Tensor& slot_ids, const Tensor& rows) {
    const int64_t nb = ids.size(1);
    cache->set_step(spec_for(nb), nb, units, pages, slot_ids);
    return hidden_rows(ids, cos, sin, rows, cache);
  };
  compiled_ = tpu::compile(step, CompileOptions{.name = o.compile_name,
                                                .warn_after_recompiles = static_cast<int>(num_buckets()),
                                                .fuse = chip});
}

void ModelRunner::make_buckets(bool chip) {
  // On a chip: powers of two from the prefill tile (a one-token step reads a tile of rows), one
  // paged attention program each. On the cpu, which pays for padded rows in every projection and
  // MLP while a graph costs little: every count up to 16, then 8 buckets per octave (16, 18, ..,
  // 30, 32, 36, ..: a step pads less than 1/8 of its rows).
  const int64_t need = o_.max_tokens + spec_.tile_tokens - 1;
  if (chip) {
    int64_t p = 1;
    while (p < spec_.tile_tokens) p *= 2;
    for (buckets_.push_back(p); buckets_.back() < need;) buckets_.push_back(buckets_.back() * 2);
    return;
  }
  for (int64_t b = 1; buckets_.empty() || buckets_.back() < need;) {
    buckets_.push_back(b);
    int64_t oct = 1;
    while (oct * 2 <= b) oct *= 2;
    b += std::max<int64_t>(1, oct / 8);
  }
}

int64_t ModelRunner::token_bucket(int64_t n) const {
  TPU_CHECK(!buckets_.empty(), "serve: token buckets exist only for a compiled runner");
  const int64_t need = n + spec_.tile_tokens - 1;
  for (int64_t b : buckets_)
    if (b >= need) return b;
  fail("serve: a step of {} tokens exceeds the compiled step's largest bucket {}", n, buckets_.back());
}

codegen::PagedAttentionSpec ModelRunner::spec_for(int64_t nb) const {
  codegen::PagedAttentionSpec s = spec_;
  s.max_units = nb;  // a unit holds at least one of the step's (at most nb) tokens
  return s;
}

int64_t ModelRunner::pages_capacity(int64_t nb) const {
  // Every unit lists at most the pages of a full context, in whole steps of its class (decode
  // or prefill), and each class's list ends with two more steps (of -1) where the kernel looks ahead.
  int64_t per_unit = 0, overfetch = 0;
  for (bool decode : {true, false}) {
    const int64_t pps = codegen::paged_pages_per_step(spec_, decode);
    const int64_t keys = pps * c_.block_size;
    per_unit = std::max(per_unit, ((o_.max_context + keys - 1) / keys) * pps);
    overfetch += 2 * pps;
  }
  return nb * per_unit + overfetch;
}

Tensor ModelRunner::hidden_rows(const Tensor& ids, const Tensor& cos, const Tensor& sin, const Tensor& rows,
                                nn::AttentionCache* cache) {
  const Tensor h = m_.hidden_states(ids, cos, sin, cache);
  // The rows to sample, gathered by the embedding op (a chip kernel on sim).
  return embedding(reshape(h, Shape{ids.size(1), m_.config.hidden_size}), rows);
}

void ModelRunner::check(const StepBatch& s) const {
  s.batch.validate(c_);
  const auto n = static_cast<int64_t>(s.ids.size());
  TPU_CHECK(n > 0 && static_cast<int64_t>(s.positions.size()) == n && s.batch.num_tokens() == n,
            "serve: {} token ids, {} positions and a batch of {} tokens must agree (and be non-empty)", n,
            s.positions.size(), s.batch.num_tokens());
  for (int64_t r : s.logit_rows) TPU_CHECK(r >= 0 && r < n, "serve: logit row {} outside the {} tokens", r, n);
  if (!o_.compile) return;
  TPU_CHECK(n <= o_.max_tokens, "serve: a step of {} tokens exceeds the compiled step's budget of {}", n, o_.max_tokens);
  for (int64_t c : s.batch.context_len)
    TPU_CHECK(c <= o_.max_context, "serve: a context of {} exceeds the compiled step's {}", c, o_.max_context);
  const auto nrows = static_cast<int64_t>(s.logit_rows.size());
  TPU_CHECK(nrows <= std::min(n, o_.max_rows), "serve: {} rows to sample from {} tokens (limit {})", nrows, n,
            o_.max_rows);
}

Tensor ModelRunner::run(const StepBatch& s) {
  check(s);
  NoGradGuard ng;
  Tensor h;  // [>= rows, hidden]: the sampled rows' final hidden states first
  if (gather_) {
    const auto n = static_cast<int64_t>(s.ids.size());
    int64_t ctx = o_.max_context;
    if (!o_.compile) {
      const int64_t longest = *std::max_element(s.batch.context_len.begin(), s.batch.context_len.end());
      for (ctx = std::max<int64_t>(1, c_.block_size); ctx < longest;) ctx *= 2;
    }
    h = gather_step(o_.compile ? token_bucket(n) : n, ctx, s);
  } else if (o_.compile) {
    const int64_t nb = token_bucket(static_cast<int64_t>(s.ids.size()));
    const codegen::PagedAttentionMeta meta =
        codegen::plan_paged_attention(spec_for(nb), c_.num_blocks, s.batch.query_start, s.batch.context_len,
                                      s.batch.block_tables, token_classes(s.batch));
    h = graph_step(nb, s, meta);
  } else {
    h = host_ ? host_step(s) : chip_step(s);
  }
  const auto nrows = static_cast<int64_t>(s.logit_rows.size());
  if (nrows == 0) return zeros(Shape{0, m_.config.vocab_size}, TensorOptions(DType::f32, Device()));
  return m_.logits(narrow(h, 0, 0, nrows)).to(DType::f32).to(Device()).contiguous();
}

Tensor ModelRunner::host_step(const StepBatch& s) {
  const auto n = static_cast<int64_t>(s.ids.size());
  const Device dev = m_.device();
  auto [cos, sin] = m_.rope_tables(s.positions, 1);  // [1, 1, n, d]
  host_->set_batch(&s.batch);
  const Tensor ids = i64_tensor(s.ids, Shape{1, n}, dev);
  if (s.logit_rows.empty()) {
    m_.hidden_states(ids, cos, sin, host_.get());
    return {};
  }
  const auto rows = static_cast<int64_t>(s.logit_rows.size());
  return hidden_rows(ids, cos, sin, i64_tensor(s.logit_rows, Shape{rows}, dev), host_.get());
}

Tensor ModelRunner::chip_step(const StepBatch& s) {
  const RaggedBatch& rb = s.batch;
  // The work-unit table's capacity is a power of two (>= 8): one program per capacity.
  codegen::PagedAttentionSpec spec = spec_;
  const int64_t units = codegen::paged_attention_units(spec, rb.query_start, token_classes(rb));
  while (spec.max_units < units) spec.max_units *= 2;
  const codegen::PagedAttentionMeta meta = codegen::plan_paged_attention(spec, c_.num_blocks, rb.query_start,
                                                                         rb.context_len, rb.block_tables, token_classes(rb));
  const Device dev = m_.device();
  const auto n = static_cast<int64_t>(s.ids.size());
  slots_->set_step(spec, n, i32_tensor(meta.units, dev), i32_tensor(meta.pages, dev), i32_tensor(meta.slots, dev));
  // The forward runs over the tokens plus tile padding (a prefill tile reads tile_tokens query
  // rows from its first token); the padding tokens' results are never used.
  const int64_t np = n + spec.tile_tokens - 1;
  std::vector<int64_t> ids(s.ids), pos(s.positions);
  ids.resize(static_cast<size_t>(np), 0);
  pos.resize(static_cast<size_t>(np), 0);
  auto [cos, sin] = m_.rope_tables(pos, 1);
  const Tensor ids_t = i64_tensor(ids, Shape{1, np}, dev);
  if (s.logit_rows.empty()) {
    m_.hidden_states(ids_t, cos, sin, slots_.get());
    return {};
  }
  const auto rows = static_cast<int64_t>(s.logit_rows.size());
  return hidden_rows(ids_t, cos, sin, i64_tensor(s.logit_rows, Shape{rows}, dev), slots_.get());
}

Tensor ModelRunner::graph_step(int64_t nb, const StepBatch& s, const codegen::PagedAttentionMeta& meta) {
  const Device dev = m_.device();
  const int64_t rows_cap = std::min(nb, o_.max_rows);
  std::vector<int64_t> tok(static_cast<size_t>(nb), 0), pos(static_cast<size_t>(nb), 0),
      rows(static_cast<size_t>(rows_cap), 0);
  std::copy(s.ids.begin(), s.ids.end(), tok.begin());
  std::copy(s.positions.begin(), s.positions.end(), pos.begin());
  std::copy(s.logit_rows.begin(), s.logit_rows.end(), rows.begin());
  TPU_CHECK(static_cast<int64_t>(meta.pages.size()) <= pages_capacity(nb),
            "serve: the step's page list ({} entries) exceeds the compiled step's capacity {}", meta.pages.size(),
            pages_capacity(nb));
  std::vector<int32_t> pages(meta.pages), slots(meta.slots);
  pages.resize(static_cast<size_t>(pages_capacity(nb)), 0);
  slots.resize(static_cast<size_t>(nb), 0);
  auto [cos, sin] = m_.rope_tables(pos, 1);
  return compiled_(i64_tensor(tok, Shape{1, nb}, dev), cos, sin, i32_tensor(meta.units, dev), i32_tensor(pages, dev),
                   i32_tensor(slots, dev), i64_tensor(rows, Shape{rows_cap}, dev));
}

Tensor ModelRunner::gather_step(int64_t nb, int64_t ctx, const StepBatch& s) {
  const Device dev = m_.device();
  const auto n = static_cast<int64_t>(s.ids.size());
  const int64_t rows_cap = o_.compile ? std::min(nb, o_.max_rows) : static_cast<int64_t>(s.logit_rows.size());
  std::vector<int64_t> tok(static_cast<size_t>(nb), 0), pos(static_cast<size_t>(nb), 0),
      rows(static_cast<size_t>(rows_cap), 0), write(static_cast<size_t>(nb), 0),
      context(static_cast<size_t>(nb * ctx), 0);
  std::vector<float> mask(static_cast<size_t>(nb), 0.0f), dist(static_cast<size_t>(nb * ctx), -1.0f);
  std::copy(s.ids.begin(), s.ids.end(), tok.begin());
  std::copy(s.positions.begin(), s.positions.end(), pos.begin());
  std::copy(s.logit_rows.begin(), s.logit_rows.end(), rows.begin());
  const RaggedBatch& rb = s.batch;
  const int64_t bs = c_.block_size;
  for (int64_t i = 0; i < rb.num_seqs(); ++i) {
    const std::vector<int32_t>& table = *rb.block_tables[static_cast<size_t>(i)];
    const int64_t q0 = rb.query_start[static_cast<size_t>(i)], q1 = rb.query_start[static_cast<size_t>(i) + 1];
    const int64_t first = rb.context_len[static_cast<size_t>(i)] - (q1 - q0);  // position of its first new token
    TPU_CHECK(rb.context_len[static_cast<size_t>(i)] <= ctx, "serve: a context of {} exceeds the step's {} positions",
              rb.context_len[static_cast<size_t>(i)], ctx);
    auto slot = [&](int64_t j) {
      const auto b = static_cast<size_t>(j / bs);
      return b < table.size() && table[b] >= 0 ? static_cast<int64_t>(table[b]) * bs + j % bs : 0;
    };
    for (int64_t t = q0; t < q1; ++t) {
      const int64_t p = first + (t - q0);
      write[static_cast<size_t>(t)] = slot(p);
      mask[static_cast<size_t>(t)] = 1.0f;
      for (int64_t j = 0; j <= p; ++j) {
        context[static_cast<size_t>(t * ctx + j)] = slot(j);
        dist[static_cast<size_t>(t * ctx + j)] = static_cast<float>(p - j);
      }
    }
  }
  for (int64_t t = n; t < nb; ++t) dist[static_cast<size_t>(t * ctx)] = 0.0f;  // padding sees slot 0: no empty softmax
  auto [cos, sin] = m_.rope_tables(pos, 1);
  const std::vector<Tensor> args{i64_tensor(tok, Shape{1, nb}, dev),
                                 cos,
                                 sin,
                                 i64_tensor(write, Shape{nb}, dev),
                                 from_vector(mask, Shape{nb}, TensorOptions(DType::f32, dev)).to(m_.dtype()),
                                 i64_tensor(context, Shape{nb * ctx}, dev),
                                 from_vector(dist, Shape{nb, ctx}, TensorOptions(DType::f32, dev)),
                                 i64_tensor(rows, Shape{rows_cap}, dev)};
  if (o_.compile) return compiled_gather_(args);
  gather_->set_gather(args[3], args[4], args[5], args[6]);
  if (rows_cap == 0) {
    m_.hidden_states(args[0], cos, sin, gather_);
    return {};
  }
  return hidden_rows(args[0], cos, sin, args[7], gather_);
}

int64_t ModelRunner::warm_up() {
  if (!o_.compile) return 0;
  NoGradGuard ng;
  if (gather_) {
    for (int64_t nb : buckets_) gather_step(nb, o_.max_context, StepBatch{});
    return num_buckets();
  }
  for (int64_t nb : buckets_) {
    // A step of no tokens: the unit table's header counts 0 tokens, so nothing is written.
    const codegen::PagedAttentionMeta meta = codegen::plan_paged_attention(spec_for(nb), c_.num_blocks, {0}, {}, {});
    graph_step(nb, StepBatch{}, meta);
  }
  return num_buckets();
}

}  // namespace tpu::serve
