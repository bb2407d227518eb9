// A fused rowwise region (softmax, log_softmax, layer_norm or rms_norm with its elementwise
// producers and consumers) as one RowwiseKernel: the producers become the kernel's prologue
// (x computed per tile in VMEM), the consumers its epilogue.
#pragma once

#include <vector>

#include "graph/ir.h"

namespace tpu::codegen {

// `out`: the output's tensor when the caller allocated it (else allocated here).
bool run_rowwise_region(const graph::Graph& g, const graph::Region& r, std::vector<Tensor>& vals, Tensor out = {});

// Position in r.nodes of the region's row op (softmax, log_softmax, layer_norm, rms_norm), or
// -1 when it has none or several.
int rowwise_op_position(const graph::Graph& g, const graph::Region& r);

}  // namespace tpu::codegen
