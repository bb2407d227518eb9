// The serving step with the model on a chip that runs generated programs (`sim`): the same
// ragged forward as serve/paged_forward.h, with every layer's attention and cache update done
// by the chip's ragged paged attention program (codegen/paged_attention.h). The paged cache
// lives on the chip, one tensor per layer and K/V, [num_blocks * block_size, kv_heads *
// head_dim] in the model's dtype; block tables, lengths and cache slots go to the chip as i32
// data each step, so the program is built once per model shape (and work-unit capacity, a
// power of two) and never per step.
#pragma once

#include <vector>

#include "codegen/paged_attention.h"
#include "tpucore/models/causal_lm.h"
#include "tpucore/serve/paged_cache.h"

namespace tpu::serve {

class SimPagedStep {
 public:
  SimPagedStep(models::CausalLM& m, const PagedCacheConfig& c);
  // As ragged_forward(): f32 logits [logit_rows.size(), vocab] (on the cpu).
  Tensor run(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const RaggedBatch& batch,
             const std::vector<int64_t>& logit_rows);
  const codegen::PagedAttentionSpec& spec() const { return spec_; }
  // The caches of one layer (for tests).
  const Tensor& key_cache(int64_t layer) const { return k_[static_cast<size_t>(layer)]; }
  const Tensor& value_cache(int64_t layer) const { return v_[static_cast<size_t>(layer)]; }

 private:
  models::CausalLM& m_;
  PagedCacheConfig cfg_;
  codegen::PagedAttentionSpec spec_;
  std::vector<Tensor> k_, v_;
};

}  // namespace tpu::serve
