// Lowering rules: what codegen knows about an op, stored in its OpDef::lowering slot (the
// registry holds it as void*; only codegen reads it). An elementwise rule appends the op to a
// VecExpr (so eager kernels and fused regions share it); other ops have an eager kernel that
// builds its own program. Either may decline (an unsupported dtype, attribute or layout): the
// call then runs on the host through the counted, logged fallback.
#pragma once

#include <span>

#include "codegen/vector_expr.h"
#include "ops/registry.h"

namespace tpu::codegen {

struct Lowering {
  // Elementwise: out = f(in...) on f32 values; false to decline these attrs/dtypes.
  // `in_dtype` is the dtype of the op's (promoted) inputs.
  bool (*elementwise)(VecExpr& e, std::span<const VecRef> in, const ops::Attrs& attrs, DType in_dtype,
                      VecRef& out) = nullptr;
  // Integer inputs are exact in f32 for this op's purpose (casts from ints); otherwise only
  // f32/bf16 (and bool) inputs lower.
  bool int_inputs_ok = false;
  // Non-elementwise eager kernel on sim tensors; false to decline.
  bool (*eager)(const ops::KernelArgs& k) = nullptr;
};

inline const Lowering* lowering_of(const ops::OpDef& op) { return static_cast<const Lowering*>(op.lowering); }

// Installs `rule` as op's lowering and the codegen kernel as its sim kernel.
void install_lowering(const char* op, const Lowering* rule);

// The sim kernel of every lowered op: runs the rule, or the host fallback when it declines.
void sim_kernel(const ops::KernelArgs& k);

// Eager elementwise on sim tensors with the op's rule (false: not lowerable).
bool eager_elementwise(const ops::KernelArgs& k, const Lowering& rule);

}  // namespace tpu::codegen
