#include "tpucore/core/tensor.h"

#include <cmath>
#include <cstring>

#include "tpucore/core/hooks.h"
#include "tpucore/core/storage.h"

namespace tpu {

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

void* Tensor::raw_data() const {
  const TensorImpl& im = impl();
  detail::before_host_access(*this);  // deferred eager mode: flushes what writes or reads it
  TPU_CHECK(im.storage != nullptr, "Tensor::data: a traced (proxy) tensor has no data");
  TPU_CHECK(im.device.is_cpu(), "Tensor::data: the tensor is on device {}; move it with .to(\"cpu\") first",
            im.device.str());
  return static_cast<char*>(im.storage->data) + im.offset * static_cast<int64_t>(dtype_size(im.dtype));
}

std::string Scalar::str() const {
  switch (kind_) {
    case Kind::floating: return fmt::format("{}", d_);
    case Kind::integer: return std::to_string(i_);
    case Kind::boolean: return i_ ? "true" : "false";
  }
  return "?";
}

Tensor empty_tensor(const Shape& shape, DType dtype, Device device) {
  const int64_t n = checked_numel(shape, "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  impl->storage = allocate_storage(device, static_cast<size_t>(n) * dtype_size(dtype));
  impl->contiguous = true;
  return Tensor(std::move(impl));
}

}  // namespace tpu
