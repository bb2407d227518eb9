// The rotary embedding's argument checks and row loop, shared by rotary_embedding and the fused
// rotary_embedding_qk (ops/fused_decode.cpp), so both compute the same values.
#pragma once

#include "tpucore/core/tensor.h"

namespace tpu::ops {

// x [..., D] (D even), cos / sin of x's floating dtype broadcasting to x; errors name `op`.
void rotary_check(const char* op, const Tensor& x, const Tensor& cos, const Tensor& sin);
// out (contiguous, x's shape and dtype) = x cos + rotate_half(x) sin, row by row in f32.
void rotary_rows(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out);

}  // namespace tpu::ops
