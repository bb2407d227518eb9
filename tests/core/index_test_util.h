// Helpers shared by the indexing, joining and view tests: every dtype, a small "params"
// tensor that carries an op's integer arguments (dim, diagonal, ...) through an OpInfo
// sample (the runner passes only tensors), and an error check that names the message parts.
#pragma once

#include <source_location>
#include <string>
#include <vector>

#include "opinfo.h"

namespace tpu::testing {

inline int wrap(int64_t d, int n) { return static_cast<int>(d < 0 ? d + n : d); }

// Data movement is exact.
inline Tol exact_tol(DType) { return {0, 0}; }

// A tensor handle that claims to live on another device (metadata only): the front half
// must reject it before any kernel reads its memory.
inline Tensor on_fake_device(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>(t.impl());
  impl->device = Device(DeviceType::sim, 0);
  return Tensor(std::move(impl));
}

}  // namespace tpu::testing
