// RowwiseKernel: programs that work on whole rows of a row-major rows x cols input in VMEM:
// reductions of each row (sum, mean, max, min on the cross-lane unit; logsumexp), softmax / log_softmax,
// layer_norm and rms_norm (with optional per-column weight and bias). Rows are tiled to fit
// VMEM; each tile is loaded, reduced on the XLU with its epilogue on the vector unit and EUP,
// and stored while the next tile loads.
//
// Arguments: r0 the input's HBM address (or the prologue's inputs), then weight and bias (when
// present), then the epilogue's inputs, then the output.
#pragma once

#include <cstdint>
#include <string>

#include "codegen/elementwise_kernel.h"
#include "codegen/vector_expr.h"
#include "sim/config.h"
#include "sim/program.h"

namespace tpu::codegen {

enum class RowOp : uint8_t { sum, mean, max, min, softmax, log_softmax, layer_norm, rms_norm, logsumexp };

struct RowwiseSpec {
  RowOp op = RowOp::sum;
  int64_t rows = 1, cols = 1;
  sim::DType in_dtype = sim::DType::f32, out_dtype = sim::DType::f32;
  bool has_weight = false, has_bias = false;
  sim::DType param_dtype = sim::DType::f32;
  float eps = 1e-5f;
  float scale = 1.0f;  // mean: 1 / count (may differ from 1 / cols in a two-stage reduction)
  // Fused regions (softmax / norms only): x = prologue(pro_inputs) computed per tile instead of
  // loaded, and out = epilogue(y, epi_inputs) with y (input 0) the row op's result; inputs are
  // laid out against [rows, cols].
  bool has_prologue = false, has_epilogue = false;
  std::vector<EwInput> pro_inputs{}, epi_inputs{};
  VecExpr prologue{}, epilogue{};
};

bool is_reduction(RowOp op);
// Rows per VMEM tile; 0 when a single row does not fit.
int64_t rowwise_tile_rows(const sim::ChipConfig& cfg, const RowwiseSpec& s);
// Scalar registers the program needs: one address per operand and the output, row and column
// counters.
int rowwise_registers(const RowwiseSpec& s);
sim::Program make_rowwise_program(const sim::ChipConfig& cfg, const RowwiseSpec& s);
std::string rowwise_key(const RowwiseSpec& s);

}  // namespace tpu::codegen
