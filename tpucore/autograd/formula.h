// Helpers for the derivative formulas (tpucore/autograd/grad_*.cpp): registration and the
// shape plumbing shared by reductions and views. Formulas are written with public tpu ops.
#pragma once

#include <algorithm>
#include <vector>

#include "ops/meta_util.h"
#include "ops/registry.h"
#include "tpucore/autograd/node.h"
#include "tpucore/ops.h"

namespace tpu::autograd::formula {

using ops::BackwardArgs;
using Grads = std::span<Tensor>;

inline constexpr uint32_t kIn0 = 1u, kIn1 = 2u, kIn2 = 4u, kOut0 = 1u, kOut1 = 2u;

inline bool define(const char* op, ops::BackwardFn fn, uint32_t save_inputs = 0, uint32_t save_outputs = 0,
                   ops::SavesFn saves = nullptr) {
  ops::set_backward(op, ops::BackwardDef{fn, save_inputs, save_outputs, saves});
  return true;
}

// The normalized dims of a reduction's "dims" attribute (empty = all).
inline std::vector<int> reduce_dims(const ops::Attrs& a, int ndim, const char* op) {
  return ops::normalize_dims(a.get_ints("dims"), ndim, op);
}

// A reduced tensor (or its gradient) broadcast back to the input's shape.
inline Tensor unreduce(const Tensor& g, const Shape& in_shape, const std::vector<int>& dims, bool keepdim) {
  Tensor r = g;
  if (!keepdim && in_shape.ndim() > 0) {
    Shape s = in_shape;
    for (int d : dims) s[d] = 1;
    r = reshape(r, s);
  }
  return expand(r, in_shape);
}

inline int64_t reduced_count(const Shape& in_shape, const std::vector<int>& dims) {
  int64_t n = 1;
  for (int d : dims) n *= in_shape[d];
  return n;
}

inline TensorOptions opts(const ops::TensorMeta& m) { return TensorOptions(m.dtype, m.device); }

}  // namespace tpu::autograd::formula
