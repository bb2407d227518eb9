// An f32 iota and one-hot rows built from ops a chip runs: the simulated chip's vector unit has
// no integer arithmetic, so arange / one_hot and their integer sums would take the host
// fallback there. Exact for indices below 2^24 (checked).
#pragma once

#include <cstdint>

#include "tpucore/core/tensor.h"

namespace tpu::ops {

// 0, 1, ..., n - 1 as f32 [n] on `dev` (made on the host and copied: a constant in a trace).
Tensor f32_iota(int64_t n, Device dev);
// The one-hot rows of integer (or integer-valued) ids [..] over n classes, as bool [.., n]: a
// comparison of the ids, in f32, with f32_iota(n).
Tensor hot_rows(const Tensor& ids, int64_t n);

}  // namespace tpu::ops
