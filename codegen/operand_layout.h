// How an operand of an elementwise computation (eager op, fused region, matmul epilogue) is read
// against the output shape: as a full matrix, a row vector, a column vector or a scalar (see
// EwLayout); other broadcasts and strided views are gathered contiguous on the device first.
#pragma once

#include <optional>

#include "codegen/elementwise_kernel.h"
#include "tpucore/core/tensor.h"

namespace tpu::codegen {

// The layout of `t` broadcast to `out` (row-major, last dim = columns); nullopt when none fits.
std::optional<EwLayout> layout_against(const Tensor& t, const Shape& out);

struct LaidOutOperand {
  Tensor t;  // on the device, readable with `in.layout`
  EwInput in;
};
// `t` on `dev` in a layout against `out` (copied to the device / gathered when needed);
// nullopt when its dtype has no chip dtype or the gather is not supported.
std::optional<LaidOutOperand> lay_out(const Tensor& t, const Shape& out, Device dev);

}  // namespace tpu::codegen
