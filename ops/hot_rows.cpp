#include "ops/hot_rows.h"

#include <vector>

#include "tpucore/core/error.h"
#include "tpucore/ops.h"

namespace tpu::ops {

Tensor f32_iota(int64_t n, Device dev) {
  TPU_CHECK(n >= 0 && n <= (int64_t{1} << 24), "an f32 iota of {} values (exact up to 2^24 = 16777216)", n);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
  return from_vector(v, Shape{n}).to(dev);
}

Tensor hot_rows(const Tensor& ids, int64_t n) {
  return eq(unsqueeze(tpu::to(ids, DType::f32), -1), f32_iota(n, ids.device()));
}

}  // namespace tpu::ops
