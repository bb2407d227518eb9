// MatmulPlan: a matmul or linear call on sim tensors turned into a MatmulSpec and its operands
// (A row-major; B row-major or read as the transpose of a contiguous matrix; batch dims folded
// into M when B is shared), with the epilogue holding the accumulator (input 0) and the bias of
// linear. Shared by the eager kernels and the compiled matmul+epilogue regions.
#pragma once

#include <optional>
#include <vector>

#include "codegen/matmul_kernel.h"
#include "ops/attrs.h"
#include "tpucore/core/tensor.h"

namespace tpu::codegen {

struct MatmulPlan {
  MatmulSpec spec;
  Tensor a, b;                         // device operands
  std::vector<Tensor> epilogue_args;   // device tensors of spec.epilogue_inputs
  VecRef value;                        // the matmul (+ bias) value in spec.epilogue
  Shape out_shape;
};

// `op` is "matmul" (inputs a, b) or "linear" (x, w, bias with attr has_bias). nullopt when the
// call does not lower (dtypes, broadcast batch dims, empty K).
std::optional<MatmulPlan> plan_matmul(const std::string& op, std::span<const Tensor> inputs, const ops::Attrs& attrs,
                                      const Shape& out_shape, DType out_dtype);

// Builds (or finds) and runs the plan's program writing `out`.
void run_matmul_plan(MatmulPlan& p, const Tensor& out, const char* kernel);

}  // namespace tpu::codegen
