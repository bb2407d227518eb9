// MLP fusion across two regions: a linear + epilogue region whose only consumer is the linear of
// a second matmul region runs with it as one MlpKernel (the hidden activations stay in VMEM).
// The second region's output is set at once; the runner skips that region when it comes.
#pragma once

#include <vector>

#include "graph/ir.h"

namespace tpu::codegen {

bool run_mlp_pair(const graph::Graph& g, const graph::Region& r1, std::vector<Tensor>& vals);

}  // namespace tpu::codegen
