// MatmulKernel: C[b] = epilogue(A[b] B[b]) on the MXUs. MatmulTiling cuts M into blocks of tm
// rows, N into panels of tn columns (one column tile of the array width per MXU) and K into
// chunks of tk (whole K when it fits); every (tile, chunk) step is emitted statically with its
// true extents, so ragged edges need neither padding nor masks. A blocks and B panels are
// double-buffered in VMEM and the next step's DMAs are issued before the current step's matmuls;
// each MXU walks the K tiles accumulating in f32 into a double-buffered accumulator. The epilogue
// (a VecExpr whose input 0 is the accumulator: bias, activation, residual, cast...) runs on the
// vector unit before the tile is stored, while the next tile computes.
//
// Arguments: r0 A, r1 B, r2.. the epilogue's extra inputs, then C (HBM addresses).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/elementwise_kernel.h"
#include "codegen/vector_expr.h"
#include "sim/config.h"
#include "sim/isa.h"
#include "sim/program.h"

namespace tpu::codegen {

struct MatmulSpec {
  std::string name = "matmul";
  int64_t batch = 1, m = 1, n = 1, k = 1;
  bool b_transposed = false;              // B is stored as [N, K] (linear weights)
  int64_t a_batch_stride = 0, b_batch_stride = 0;  // elements; 0 = shared by every batch
  sim::DType a_dtype = sim::DType::f32, b_dtype = sim::DType::f32, out_dtype = sim::DType::f32;
  sim::MxuMode mode = sim::MxuMode::f32;
  // Epilogue: input 0 is the f32 accumulator tile; inputs 1.. are `epilogue_inputs` laid out
  // against the [m, n] output of each batch. Empty expression (no steps, result input 0): store.
  std::vector<EwInput> epilogue_inputs{};
  VecExpr epilogue{};
  int64_t tm = 0, tn = 0, tk = 0;  // 0: chosen by MatmulTiling
  // A's rows are multiplied by a per-row f32 factor as their chunks arrive in VMEM, before the
  // MXUs read them (f32 / bf16 A): an f32 vector of batch * m factors in HBM, its address in
  // register matmul_registers(ne, true) - 1 (the register before it, the K counter, takes no
  // argument). The quantized linears scale activations into the i8 / fp8 range so.
  bool a_row_scale = false;
  // > 0 (Q): A's rows are quantized inside the kernel, with no factors from HBM: per row
  // m = max(max_k |A|, 1e-30) over the whole row (a block of whole rows is held in VMEM, B
  // panels may still be cut along K; its max taken on the vector unit as its chunks arrive), each chunk times (1 / m) Q in
  // place before the MXUs read it, and the epilogue gets m / Q as its input after
  // `epilogue_inputs` (a column vector). Excludes `a_row_scale`.
  float a_row_quant = 0;
  // > 0 (the group size, a multiple of 32): B is a packed int4 weight [N, K / 2] (b_transposed,
  // b_dtype i8 naming its bytes; layout of ops/cpu/kernels/gemv_int4.h) with f32 scales
  // [N, K / group] in HBM at register matmul_registers(ne, true) - 1 (f16 scales, IEEE half bits,
  // with `b_int4_scale_f16`). Each B panel streams in packed (half a byte per weight) with its
  // scales; the vector unit unpacks the nibbles with integer ops, either (more than group / 2 rows
  // of A per block) multiplied by their group's scale into a bf16 panel which the MXUs read, or as
  // i8 values 16 q which the MXUs read group by group, each group's product scaled into the
  // accumulator by the vector unit. batch 1 only.
  int64_t b_int4_group = 0;
  bool b_int4_scale_f16 = false;
};

struct MatmulTiling {
  int64_t tm = 0, tn = 0, tk = 0;
  int64_t vmem_bytes = 0;
};
// Tile sizes that fit VMEM (tn = MXUs x array width when N allows, tm <= 512, tk = K if it fits).
MatmulTiling choose_matmul_tiling(const sim::ChipConfig& cfg, const MatmulSpec& s);

// Whether `s` (with a_row_quant) has a tiling: a block of whole rows of A fits VMEM.
bool matmul_row_quant_fits(const sim::ChipConfig& cfg, const MatmulSpec& s);

// Scalar registers the program needs: A, B, the epilogue operands, the output, a counter and,
// with `a_row_scale`, the row factors.
int matmul_registers(int epilogue_inputs, bool a_row_scale = false);
sim::Program make_matmul_program(const sim::ChipConfig& cfg, const MatmulSpec& s);
std::string matmul_key(const MatmulSpec& s);

}  // namespace tpu::codegen
