// The serving engine's runner: executes a step plan's tokens through the model's own forward
// (models::CausalLM::hidden_states, the one decoder loop) with a paged attention cache, and
// returns the next-token logits of the rows that sample.
//
// One runner for every executor; what differs is the attention cache and whether the step is
// traced (serve/paged_attention_cache.h):
// - model on the cpu, eager: HostPagedCache (the cpu kernel over f32 host blocks), the step's
//   exact tokens;
// - model on a chip that runs generated programs (sim), eager: ChipPagedCache (the chip's ragged
//   paged attention program per layer; its work-unit table's capacity is a power of two, so the
//   program is built once per model shape and capacity); the forward runs over the tokens plus
//   tile_tokens - 1 padding tokens (a prefill tile reads whole tiles of queries);
// - compile (cpu or chip): GraphPagedCache inside tpu::compile on bucketed shapes. A step pads
//   its N tokens to a bucket Nb (on a chip a power of two at least N + tile_tokens - 1; on the
//   cpu N itself up to 16, then one of 8 buckets per octave) and passes, all as runtime
//   tensors: the token ids, the rotary tables, the step's PagedAttentionMeta (work units, page
//   lists padded to the bucket's capacity, new tokens' slots; i32) and the rows to sample. The
//   graph's shapes depend on Nb alone: one graph per bucket; warm_up() compiles each with a
//   step of no tokens, and no later step compiles. Regions are fused on chips only (on the cpu
//   the matmul + epilogue regions were slower than the plain kernels at serving sizes).
// - model on a pjrt device (eager or compile): GatherPagedCache, the paged attention in ordinary
//   ops the StableHLO exporter maps, over the step's tokens and a context of L positions (eager:
//   the step's longest context rounded up to a power of two; compile: max_model_len, with the
//   token buckets of the cpu), so no op takes the pjrt host fallback.
// The sampled rows' final hidden states are gathered by the embedding op (a chip kernel) and
// the head runs on exactly those rows, outside the graph.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "codegen/paged_attention.h"
#include "tpucore/models/causal_lm.h"
#include "tpucore/serve/paged_attention_cache.h"

namespace tpu::serve {

struct RunnerOptions {
  bool compile = false;
  std::string compile_name = "serve_step";  // the compiled function's name in tpu::jit::stats()
  // Bounds of the buckets (compile): the token budget, max_model_len and max_num_seqs.
  int64_t max_tokens = 256, max_context = 2048, max_seqs = 16;
  int64_t max_rows = 0;  // rows sampled per step at most (0: max_seqs; more with speculative decoding)
};

// The tokens of one step: ids and positions per flattened token, the ragged batch (offsets,
// context lengths, block tables) and the token rows whose next-token logits are wanted.
struct StepBatch {
  std::vector<int64_t> ids, positions;
  RaggedBatch batch;
  std::vector<int64_t> logit_rows;
};

// The paged cache's layout for a model: per-head keys and values (num_key_value_heads of
// head_dim); with multi-head latent attention one head of kv_lora_rank + qk_rope_head_dim whose
// keys and values are shared (the latent, nn/mla.h).
PagedCacheConfig paged_cache_layout(const models::ModelConfig& mc, int64_t block_size, int64_t num_blocks);

class ModelRunner {
 public:
  // The model must be f32 or bf16 on the cpu (or a chip that runs generated programs) and the
  // cache config fit it (layers, kv heads, head_dim).
  ModelRunner(models::CausalLM& m, const PagedCacheConfig& c, const RunnerOptions& o);
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;
  // f32 logits [logit_rows.size(), vocab] on the cpu. Bad step data is a tpu::Error.
  Tensor run(const StepBatch& step);
  // With compile: compiles every token bucket with steps that write nothing; returns the
  // number of graphs (0 without compile). Afterwards no step within the limits compiles.
  int64_t warm_up();
  // The token bucket of a step of n tokens (compile only).
  int64_t token_bucket(int64_t n) const;
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  // The sliding window of every layer when all layers slide with one window (Mistral; steps are
  // planned with it and read no block before it), else 0.
  int64_t kv_window() const { return spec_.window; }
  // KV cache bytes per token position over all layers (f32 rows in the host cache, the model's
  // dtype in the chip and graph caches).
  int64_t kv_bytes_per_token() const;
  // The chip or graph cache's tensors (null for the host cache; for tests).
  const SlotPagedCache* slot_cache() const { return slots_.get(); }

 private:
  void check(const StepBatch& s) const;
  // The model through `cache` over [1, np] ids; the final hidden states of `rows`.
  Tensor hidden_rows(const Tensor& ids, const Tensor& cos, const Tensor& sin, const Tensor& rows,
                     nn::AttentionCache* cache);
  Tensor host_step(const StepBatch& s);
  Tensor chip_step(const StepBatch& s);
  Tensor graph_step(int64_t nb, const StepBatch& s, const codegen::PagedAttentionMeta& meta);
  // The pjrt step over nb >= tokens rows (padding rows write nothing) and a context of ctx positions.
  Tensor gather_step(int64_t nb, int64_t ctx, const StepBatch& s);
  codegen::PagedAttentionSpec spec_for(int64_t nb) const;
  int64_t pages_capacity(int64_t nb) const;
  void make_buckets(bool chip);

  models::CausalLM& m_;
  PagedCacheConfig c_;
  RunnerOptions o_;
  codegen::PagedAttentionSpec spec_;  // tiling; max_units is set per step
  std::vector<int64_t> buckets_;      // token buckets, ascending (compile)
  std::unique_ptr<HostPagedCache> host_;
  std::unique_ptr<SlotPagedCache> slots_;
  std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&)>
      compiled_;
  GatherPagedCache* gather_ = nullptr;  // the pjrt cache (owned by slots_)
  std::function<Tensor(const std::vector<Tensor>&)> compiled_gather_;
};

}  // namespace tpu::serve
