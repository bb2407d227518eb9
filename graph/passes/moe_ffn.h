// The moe_ffn node (graph pass fuse_moe) as the chain it replaced, run op by op on the inputs'
// device: moe_sort, moe_permute, grouped_matmul, silu(gate) * up, grouped_matmul, moe_unpermute.
// The sim kernel of moe_ffn (codegen/moe_ffn_kernel.cpp) runs it for what its chip program does
// not cover.
#pragma once

#include "ops/registry.h"

namespace tpu::graph {

void moe_ffn_chain(const ops::KernelArgs& a);

}  // namespace tpu::graph
