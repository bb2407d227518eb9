// The fast path of the cpu region executor for f32 elementwise regions: a small vectorized
// interpreter. The domain is walked in chunks of one row (the innermost dim, at most
// kVecChunk elements); each node of the region runs on the chunk with the vectorized f32 math
// table (AVX-512 when available), intermediates stay in per-thread chunk buffers (L1/L2), and
// only the region outputs are written to memory: one pass over memory per region.
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
