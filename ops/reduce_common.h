// Pieces shared by the reduction ops' meta functions and kernels: reading the dim list and
// keepdim attrs, the reduced output shape, and the "reduced dim is empty" check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/meta_util.h"
#include "ops/registry.h"

namespace tpu::ops::reduce {

// Normalized (sorted, wrapped) reduced dims of input 0 from the "dims" attr.
inline std::vector<int> attr_dims(const Tensor& x, const Attrs& attrs, const std::string& op) {
  return normalize_dims(attrs.get_ints("dims"), x.dim(), op.c_str());
}

// Output shape of a reduction of x over the "dims" attr with the "keepdim" attr.
inline Shape attr_reduced_shape(const Tensor& x, const Attrs& attrs, const std::string& op) {
  return reduced_shape(x.shape(), attr_dims(x, attrs, op), attrs.get_bool("keepdim"));
}

// Identity-less reductions (amax, argmax, ...) reject reducing over a zero-size dim.
inline void check_nonempty_reduction(const Tensor& x, const std::vector<int>& dims, const std::string& op) {
  for (int d : dims)
    TPU_CHECK(x.shape()[d] != 0,
              "{}: cannot reduce over dim {} of size 0 (input shape {}): the operation has no identity", op, d,
              x.shape().str());
}

/// The attributes of a reduction over `dims`.
inline Attrs reduce_attrs(const std::vector<int64_t>& dims, bool keepdim) { return Attrs{{"dims", dims}, {"keepdim", keepdim}}; }

/// True for the float element types (f32, bf16, f16).
template <class T>
constexpr bool is_float_v = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

/// An element of a float tensor (f32, bf16, f16) as f32.
template <class T>
inline float to_f(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return v.to_f32();
}

inline std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace tpu::ops::reduce
