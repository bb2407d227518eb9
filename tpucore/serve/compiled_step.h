// The serving step through tpu::compile: the same ragged forward as serve/paged_forward.h,
// traced, on bucketed shapes so it compiles a bounded number of times and never after warm-up.
//
// The paged cache is one tensor per layer and K/V, [num_blocks * block_size, kv_heads *
// head_dim] (a slot per token position of every block), on the model's device. A step pads
// its N tokens to a bucket Nb (on a chip a power of two at least N + tile_tokens - 1, the
// prefill tile's read-ahead; on the cpu N itself up to 16, then one of 8 buckets per octave)
// and passes, all as runtime tensors: the token ids, the rotary tables, the step's
// PagedAttentionMeta (work units, page lists padded to the bucket's capacity, the new tokens'
// slots; i32) and the rows to sample. Every layer's attention and cache update is one
// serve_paged_attention node (serve/paged_op.h): in place, reading only the pages in use, so
// the graph's shapes depend on Nb alone: one graph per token bucket. The graph returns the
// sampled rows' final hidden states; the head then runs on exactly those rows. On the cpu the
// attention node is the cpu kernel; with the model on a chip (sim) it is the chip's ragged
// paged attention program, and the rest of the step (embedding and row selection by the
// embedding kernel, norms, projections, rotary, MLP, head) runs as chip programs too: no host
// fallback.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "codegen/paged_attention.h"
#include "tpucore/models/causal_lm.h"
#include "tpucore/serve/paged_cache.h"

namespace tpu::serve {

class CompiledStep {
 public:
  // `name` is the compiled function's name in tpu::jit::stats(); max_tokens (the token budget)
  // and max_context (max_model_len) bound the buckets, so the jit's recompile warning only
  // fires past the expected number of graphs; max_seqs (max_num_seqs) bounds the rows sampled
  // per step. The model must be f32 or bf16, on the cpu or a chip that runs generated programs.
  CompiledStep(models::CausalLM& m, const PagedCacheConfig& c, const std::string& name, int64_t max_tokens,
               int64_t max_context, int64_t max_seqs);
  // As ragged_forward(): f32 logits [logit_rows.size(), vocab].
  Tensor run(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const RaggedBatch& batch,
             const std::vector<int64_t>& logit_rows);
  // Compiles every token bucket up to the token budget with steps that write nothing; returns
  // the number of buckets (graphs). Afterwards no step within the limits compiles.
  int64_t warm_up();
  // The token bucket of a step of n tokens (see above).
  int64_t token_bucket(int64_t n) const;
  int64_t num_buckets() const;

 private:
  // Runs the graph of bucket nb on this step's data (n = 0: a step of no tokens).
  Tensor run_bucket(int64_t nb, const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
                    const codegen::PagedAttentionMeta& meta, const std::vector<int64_t>& logit_rows);
  codegen::PagedAttentionSpec spec_for(int64_t nb) const;
  int64_t pages_capacity(int64_t nb) const;

  models::CausalLM& m_;
  PagedCacheConfig c_;
  int64_t max_tokens_, max_context_, max_seqs_;
  codegen::PagedAttentionSpec spec_;  // tiling; max_units is set per bucket
  std::vector<int64_t> buckets_;      // token buckets, ascending
  std::vector<Tensor> k_, v_;
  std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&)>
      fn_;
};

}  // namespace tpu::serve
