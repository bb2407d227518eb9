// The fast path of the cpu region executor for f32 elementwise regions: a small vectorized
// interpreter. The domain is walked in chunks of one row (the innermost dim, at most
// kVecChunk elements), split over the threads. When the vectorized f32 math table has a fused
// program executor (AVX2), the whole region runs on the chunk block by block (every step on a
// block of 256 values in L1, the next block's inputs prefetched meanwhile, outputs written as
// they are computed); otherwise each node runs on the whole chunk with the table's one-op
// kernels, intermediates in per-thread chunk buffers. Either way only the region outputs are
// written to memory: one pass over memory per region.
#pragma once

#include <vector>

#include "graph/ir.h"

namespace tpu::graph {

inline constexpr int64_t kVecChunk = 2048;

// True when every node of the region is an f32 elementwise op the interpreter knows.
bool vec_region_supported(const Graph& g, const Region& r);
// vals: per-value tensors; external inputs and the (allocated, contiguous) region outputs set.
void run_region_vec(const Graph& g, const Region& r, std::vector<Tensor>& vals);

}  // namespace tpu::graph
