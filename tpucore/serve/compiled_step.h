// The serving step through tpu::compile: the same ragged forward as serve/paged_forward.h,
// expressed with tensor ops so it traces, on bucketed shapes so it compiles a bounded number
// of times and never after warm-up.
//
// The paged cache is one tensor per layer and K/V, [num_blocks * block_size, kv_heads *
// head_dim] (a slot per token position of every block). A step pads its N tokens to a bucket
// Nb (power of two, at least 8) and the longest context to a bucket Lb (power of two, at least
// 16) and passes, all as runtime tensors: the token ids and rotary tables; for every cache slot
// the token row that writes it and a write flag (the fused cache update: where(flag,
// index_select(new keys, rows), cache)); and for every token the Lb slot ids of its context
// read through its sequence's block table (index_select of cache rows) with a mask. Attention
// is then dense over [Nb, heads, 1, Lb]. Graph count: one per (Nb, Lb) bucket pair used.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tpucore/models/causal_lm.h"
#include "tpucore/serve/paged_cache.h"

namespace tpu::serve {

class CompiledStep {
 public:
  // `name` is the compiled function's name in tpu::jit::stats(); max_tokens (the token budget)
  // and max_context (max_model_len) bound the buckets, so the jit's recompile warning only
  // fires past the expected number of graphs.
  CompiledStep(models::CausalLM& m, const PagedCacheConfig& c, const std::string& name, int64_t max_tokens,
               int64_t max_context);
  // As ragged_forward(): f32 logits [logit_rows.size(), vocab].
  Tensor run(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const RaggedBatch& batch,
             const std::vector<int64_t>& logit_rows);
  // Compiles every (token bucket, context bucket) pair up to these sizes with steps that write
  // nothing; returns the number of pairs. Afterwards no step within the limits compiles.
  int64_t warm_up();
  static int64_t token_bucket(int64_t n);
  static int64_t context_bucket(int64_t n);

 private:
  models::CausalLM& m_;
  PagedCacheConfig c_;
  int64_t max_tokens_, max_context_;
  std::vector<Tensor> k_, v_;
  std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&)>
      fn_;
};

}  // namespace tpu::serve
