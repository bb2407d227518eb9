// Parameter initialization shared by the nn/ layers (internal; not installed).
#pragma once

#include "tpucore/core/tensor.h"

namespace tpu::nn::detail {
// U(-bound, bound) of shape `s` (PyTorch's default Linear init with bound 1/sqrt(fan_in)), or an
// uninitialized tensor while a SkipInitGuard is active (a checkpoint will overwrite it).
Tensor uniform_init(const Shape& s, double bound, Generator* gen);
}  // namespace tpu::nn::detail
