// Shared by the kernel examples: how far a result is from the library's.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "tpucore/ops.h"

namespace kernel_examples {

// Norm-wise relative error: the largest difference over the largest reference magnitude.
inline double max_rel_error(const tpu::Tensor& got, const tpu::Tensor& want) {
  const std::vector<float> a = got.to(tpu::Device()).to(tpu::DType::f32).to_vector<float>(),
                           b = want.to(tpu::Device()).to(tpu::DType::f32).to_vector<float>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace kernel_examples
