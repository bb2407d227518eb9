// The fast path of the cpu region executor for f32 elementwise regions: the region's nodes
// become a fused program (ops/cpu/vec_math.h) run over the domain, split over the threads.
// Narrow rows (at most kVecChunk / 2 values) run several rows per call when every operand is
// contiguous across rows, a broadcast row or a single value; otherwise each call covers one
// row piece of at most kVecChunk values, strided inputs gathered through per-thread buffers
// (kVecChunkLong values when no input needs gathering).
// The program runs block by block with values between steps in registers or L1 (the Highway
// executor of every x86 target, or the portable table's one-op kernels over blocks of 256
// values), so only the region outputs are written to memory: one pass over memory per region.
#pragma once

#include <vector>

#include "graph/ir.h"

namespace tpu::graph {

inline constexpr int64_t kVecChunk = 2048;       // row piece when inputs are gathered
inline constexpr int64_t kVecChunkLong = 16384;  // row piece when every input is read in place

// True when every node of the region is an f32 elementwise op the interpreter knows.
bool vec_region_supported(const Graph& g, const Region& r);
// vals: per-value tensors; external inputs and the (allocated, contiguous) region outputs set.
void run_region_vec(const Graph& g, const Region& r, std::vector<Tensor>& vals);

}  // namespace tpu::graph
