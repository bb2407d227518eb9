// The size limit of one tensor, checked where shapes are made (creation, every op's result,
// views): a larger element count, or one that overflows 64 bits, is a tpu::Error naming the op.
#pragma once

#include <cstdint>

#include "tpucore/shape.h"

namespace tpu::ops {

// 2^46 elements: 256 TiB of f32, far past the memory of any device here.
inline constexpr int64_t kMaxNumel = int64_t{1} << 46;

// The element count of a shape `op` is about to make; an error naming `op`, the shape and the
// limit when a dim is negative or the count passes kMaxNumel (or overflows).
int64_t checked_numel(const Shape& shape, const char* op);

}  // namespace tpu::ops
