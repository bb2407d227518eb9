// Sim tensors as codegen sees them: chip dtypes of tensor dtypes, and contiguous copies of
// strided views made on the device (by the StridedCopy program).
#pragma once

#include <optional>

#include "sim/types.h"
#include "tpucore/core/tensor.h"

namespace tpu::codegen {

// f32, bf16, i32, i8 map to themselves, bool to i8 (0/1 bytes); others have no chip dtype.
std::optional<sim::DType> chip_dtype(DType t);

// The float dtypes the chip's kernels compute in (f32, bf16), and the chip dtype of one of them.
inline bool float_chip(DType t) { return t == DType::f32 || t == DType::bf16; }
inline sim::DType cd(DType t) { return t == DType::bf16 ? sim::DType::bf16 : sim::DType::f32; }

// A contiguous copy of `t` (any strides, broadcast dims included) on its sim device, made by a
// DMA program; nullopt when the view has too many non-mergeable dims.
std::optional<Tensor> materialize_on_device(const Tensor& t);

// Copies the view `src` (any strides) into the contiguous `dst` of the same shape and device
// (false: too many non-mergeable dims).
bool copy_into(const Tensor& src, const Tensor& dst);

// `t` as a contiguous tensor on `dev`: wrapped numbers and cpu scalars are copied over.
std::optional<Tensor> device_operand(const Tensor& t, Device dev);

}  // namespace tpu::codegen
