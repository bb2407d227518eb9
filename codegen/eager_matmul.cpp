// Eager matmul and linear on sim tensors: a MatmulPlan run as one MatmulKernel program (f32
// accumulation on the MXUs; bf16 inputs in bf16 mode, f32 inputs in the exact f32 mode).
#include "codegen/lowering.h"
#include "codegen/matmul_plan.h"

namespace tpu::codegen {
namespace {

bool matmul_eager(const ops::KernelArgs& k) {
  const Tensor& out = k.outputs[0];
  if (out.numel() == 0) return out.dtype() == DType::f32 || out.dtype() == DType::bf16;
  auto p = plan_matmul(k.op.name, k.inputs, k.attrs, out.shape(), out.dtype());
  if (!p) return false;
  run_matmul_plan(*p, out, k.op.name.c_str());
  return true;
}

const Lowering kMatmulRule{.eager = &matmul_eager};

[[maybe_unused]] const bool g_matmul_rules_installed =
    (install_lowering("linear", &kMatmulRule), install_lowering("matmul", &kMatmulRule), true);

}  // namespace
}  // namespace tpu::codegen
