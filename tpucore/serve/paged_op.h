// The ragged paged attention of one layer and serving step as one op, `serve_paged_attention`,
// so a compiled serving step (serve/model_runner.h) traces it as an ordinary graph node:
// the cache update is done in place inside the op (no functionalized copy of the cache, no
// gather of the context into the graph), and the step's shape depends only on its token
// bucket, not on the context lengths.
//
// The step's data is PagedAttentionMeta (codegen/paged_attention.h) as i32 tensors on the
// op's device: the work-unit table (header + one record per decode token or prefill tile),
// every unit's page list, the cache slot of every new token. The same data drives the cpu
// kernel (below) and, on a chip that runs generated programs, the chip's ragged paged
// attention program (codegen::run_paged_attention), so one graph serves both.
//
// cpu kernel: first the new keys and values go to their slots (slots[t] for token t < the
// header's token count), then for every unit's token (position pos0 + i) and KV head one walk
// over positions 0..pos through the unit's page list (page j covers positions j * block_size
// ..), with an online softmax for each query head sharing that KV head. Tokens past the header's count (bucket padding) are neither
// written nor computed: their output rows are 0 on the cpu and left unwritten on a chip.
// The spec's window and softcap (per layer) mask the keys at positions <= p - window and
// soft-cap the scaled scores, on the cpu and on a chip alike; positions in the unit table count
// from the first key of the unit's page list (codegen::plan_paged_attention).
// Bad step data (a slot, page or token outside its range, more units than max_units) is a
// tpu::Error naming it.
#pragma once

#include "codegen/paged_attention.h"
#include "tpucore/core/tensor.h"

namespace tpu::serve {

// q: [rows, heads * head_dim] (or any shape of rows * heads * head_dim elements; on a chip rows
// >= tokens + tile_tokens - 1); k_new, v_new: [rows, kv_heads * head_dim]; k_cache, v_cache:
// [num_blocks * block_size, kv_heads * head_dim], written in place (they may be one tensor when
// keys and values are shared, as multi-head latent attention's latent: v_new then equals
// k_new and is not written again); all of one float dtype
// (f32 or bf16) on one device. units / pages / slots: i32, as PagedAttentionMeta (units
// holding (1 + spec.max_units) records). Returns out [rows, heads * head_dim].
Tensor paged_attention(const codegen::PagedAttentionSpec& spec, const Tensor& q, const Tensor& k_new,
                       const Tensor& v_new, const Tensor& k_cache, const Tensor& v_cache, const Tensor& units,
                       const Tensor& pages, const Tensor& slots);

}  // namespace tpu::serve
