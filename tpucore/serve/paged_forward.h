// A CausalLM forward over one ragged serving step: the tokens of every scheduled sequence
// (prefill chunks and single decode tokens) flattened into one [1, num_tokens] row, each with
// its own position; attention goes through the paged cache (ragged_paged_attention), the rest
// (embeddings, norms, projections, MLPs) runs as ordinary tpucore ops on the whole row.
#pragma once

#include <vector>

#include "codegen/paged_attention.h"
#include "tpucore/models/causal_lm.h"
#include "tpucore/serve/paged_cache.h"

namespace tpu::serve {

// One decoder layer's attention inputs for n flattened tokens: q [1, n, hq, d], k and v
// [1, n, hkv, d] (token-major), after the q/k norms where the model has them and with the
// rotary embedding applied to q and k (cos/sin from nn::rope_tables over the tokens' positions).
struct LayerQKV {
  Tensor q, k, v;
};
// The ragged paged attention spec of a model (heads, head_dim, 1/sqrt(head_dim) scale) with
// KV blocks of `block_size` in `dtype` (f32 or bf16; f32 multiplies exactly, as the cpu does).
// Tile sizes are left at their defaults (codegen::choose_paged_attention_tiling sets them).
codegen::PagedAttentionSpec paged_spec_of(const models::ModelConfig& mc, int64_t block_size, DType dtype);

LayerQKV project_qkv(models::DecoderLayer& layer, const models::ModelConfig& mc, const Tensor& x, int64_t n,
                     const Tensor& cos, const Tensor& sin);

// ids and positions: one per flattened token (batch.num_tokens()). logit_rows: the token rows
// whose next-token logits are wanted (the last token of each sequence that samples this step).
// Returns f32 logits [logit_rows.size(), vocab]. The model must be on the cpu (the kernel reads
// host memory) and the cache shaped for it (layers, kv heads, head_dim).
Tensor ragged_forward(models::CausalLM& m, PagedKVCache& cache, const std::vector<int64_t>& ids,
                      const std::vector<int64_t>& positions, const RaggedBatch& batch,
                      const std::vector<int64_t>& logit_rows);

}  // namespace tpu::serve
