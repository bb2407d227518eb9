// Compiled regions on sim: the fused regions of the JIT's graph (graph/passes fuse) become one
// chip program each — an elementwise chain is one ElementwiseKernel, a matmul/linear with its
// elementwise consumers one MatmulKernel whose epilogue applies them on the vector unit before
// write-back. Regions that do not lower (rowwise regions with producers, several outputs,
// integer math) decline and run node by node through the eager kernels.
#pragma once

#include <vector>

#include "graph/ir.h"

namespace tpu::codegen {

// graph::RegionRunner for the tpu::compile driver; declines off sim.
bool run_region_on_chip(const graph::Graph& g, const graph::Region& r, std::vector<Tensor>& vals);

}  // namespace tpu::codegen
