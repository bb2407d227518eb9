// The sim kernel of the fused mixture-of-experts node moe_ffn (graph pass fuse_moe): one chip
// program over all experts (codegen/moe_ffn_kernel.cpp). What the program does not cover runs
// the node's chain op by op on the chip; this counts those calls.
#pragma once

#include <cstdint>

namespace tpu::codegen {

// moe_ffn calls on chip devices that ran the chain op by op instead of the fused program
// (f16, a strided inner dim, shapes whose buffers do not fit VMEM), since the process started.
uint64_t moe_ffn_chain_fallbacks();

}  // namespace tpu::codegen
