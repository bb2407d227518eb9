// A fused rowwise region (softmax, log_softmax, layer_norm or rms_norm with its elementwise
// producers and consumers) as one RowwiseKernel: the producers become the kernel's prologue
// (x computed per tile in VMEM), the consumers its epilogue.
#pragma once

#include <vector>

#include "graph/ir.h"

namespace tpu::codegen {

bool run_rowwise_region(const graph::Graph& g, const graph::Region& r, std::vector<Tensor>& vals);

}  // namespace tpu::codegen
