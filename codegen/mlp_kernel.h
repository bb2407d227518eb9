// MlpKernel: two chained linears whose intermediate never leaves VMEM,
//   out = epilogue2(epilogue1(A W1^T) W2^T)        (A [m, k1], W1 [n1, k1], W2 [n2, n1])
// for an MLP block (epilogue1: bias + activation; epilogue2: bias + residual + cast). All m rows
// of A stay in VMEM with an f32 accumulator of the whole [m, n2] output; the hidden dim is walked
// in chunks of th columns: the MXUs compute H = A W1c^T for chunk c+1 while the vector unit
// applies epilogue1 to chunk c and the MXUs accumulate H_c W2c^T, and the DMA engines prefetch
// the next W1 and W2 chunks. Each weight is read from HBM once, so HBM traffic is the minimum
// (inputs, weights, output). Needs the whole of A and the accumulator to fit in VMEM.
//
// Arguments: r0 A, r1 W1, r2 W2, then epilogue1's extra inputs, epilogue2's, then the output.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "codegen/elementwise_kernel.h"
#include "codegen/vector_expr.h"
#include "sim/config.h"
#include "sim/isa.h"
#include "sim/program.h"

namespace tpu::codegen {

struct MlpSpec {
  int64_t m = 1, k1 = 1, n1 = 1, n2 = 1;
  sim::DType dtype = sim::DType::bf16;  // A, W1, W2 and the hidden activations
  sim::DType out_dtype = sim::DType::bf16;
  sim::MxuMode mode = sim::MxuMode::bf16;
  // Input 0 of each is its accumulator; epilogue1's inputs are row vectors or scalars against
  // [m, n1] (a bias), epilogue2's any layout against [m, n2].
  std::vector<EwInput> epi1_inputs, epi2_inputs;
  VecExpr epi1, epi2;
};

struct MlpTiling {
  int64_t th = 0;   // hidden columns per chunk
  int64_t rc = 0;   // rows per chunk of the final epilogue
  int64_t vmem_bytes = 0;
};
// nullopt when A and the accumulator do not fit in VMEM.
std::optional<MlpTiling> choose_mlp_tiling(const sim::ChipConfig& cfg, const MlpSpec& s);

// Scalar registers the program needs: x, w1, w2, both epilogues' operands, the output, a counter.
int mlp_registers(const MlpSpec& s);
sim::Program make_mlp_program(const sim::ChipConfig& cfg, const MlpSpec& s, const MlpTiling& t);
std::string mlp_key(const MlpSpec& s);

}  // namespace tpu::codegen
