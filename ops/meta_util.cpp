#include "ops/meta_util.h"

#include <fmt/format.h>

#include <algorithm>

namespace tpu::ops {

Shape broadcast_inputs(const OpDef& op, std::span<const Tensor> inputs) {
  Shape s = inputs.empty() ? Shape{} : inputs[0].shape();
  for (size_t i = 1; i < inputs.size(); ++i) s = broadcast_shapes(s, inputs[i].shape(), op.name.c_str());
  return s;
}

DType result_type(std::span<const Tensor> inputs) {
  ResultTypeState st;
  for (const Tensor& t : inputs) {
    const TensorImpl& im = t.impl();
    st.update(im.dtype, im.shape.ndim() == 0, im.wrapped_number);
  }
  return st.result();
}

Device common_device(std::span<const Tensor> inputs) {
  for (const Tensor& t : inputs)
    if (!t.impl().wrapped_number) return t.device();
  return inputs.empty() ? Device() : inputs[0].device();
}

std::vector<int> normalize_dims(const std::vector<int64_t>& dims, int ndim, const char* op) {
  std::vector<int> r;
  if (dims.empty()) {
    for (int i = 0; i < ndim; ++i) r.push_back(i);
    return r;
  }
  uint32_t seen = 0;
  for (int64_t d : dims) {
    int w = wrap_dim(d, ndim, op);
    if (ndim == 0) continue;
    TPU_CHECK(!((seen >> w) & 1u), "{}: dim {} appears more than once in the dim list", op, d);
    seen |= 1u << w;
    r.push_back(w);
  }
  std::sort(r.begin(), r.end());
  return r;
}

Shape reduced_shape(const Shape& in, const std::vector<int>& dims, bool keepdim) {
  Shape out;
  size_t j = 0;
  for (int i = 0; i < in.ndim(); ++i) {
    bool red = j < dims.size() && dims[j] == i;
    if (red) {
      ++j;
      if (keepdim) out.push_back(1);
    } else {
      out.push_back(in[i]);
    }
  }
  return out;
}

std::string describe(const Tensor& t) {
  return fmt::format("{} {} on {}", dtype_name(t.dtype()), t.shape().str(), t.device().str());
}

}  // namespace tpu::ops
