#include "ops/cpu/loops.h"

namespace tpu::ops::cpu {

Shape broadcast_byte_strides(const Tensor& t, const Shape& out_shape) {
  const Shape& s = t.shape();
  const Shape& st = t.strides();
  const int n = out_shape.ndim();
  Shape r = Shape::filled(n, 0);
  const int64_t es = static_cast<int64_t>(t.element_size());
  for (int i = 0; i < n; ++i) {
    int j = s.ndim() - n + i;
    if (j < 0) continue;
    r[i] = (s[j] == 1 && out_shape[i] != 1) ? 0 : st[j] * es;
  }
  return r;
}

}  // namespace tpu::ops::cpu
