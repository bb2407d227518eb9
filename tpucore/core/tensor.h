/// @file
/// Tensor: a view (shape, strides, offset, dtype) over a refcounted Storage on one device.
/// Copying a Tensor copies the handle; views share storage; contiguous()/clone() copy data.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpucore/core/device.h"
#include "tpucore/core/dtype.h"
#include "tpucore/core/error.h"
#include "tpucore/core/scalar.h"
#include "tpucore/core/shape.h"
#include "tpucore/core/storage.h"

namespace tpu {

struct AutogradMeta;  // defined by the autograd layer
struct TraceValue;    // defined by the tracer: set on proxy tensors while tracing

/// The state a Tensor handle points to. Internal to the library and its drivers: user code
/// reads it through Tensor's accessors.
struct TensorImpl {
  StoragePtr storage;  ///< null for proxy tensors made by the tracer
  /// Dimension sizes.
  Shape shape;
  Shape strides;       ///< element units
  int64_t offset = 0;  ///< element units
  /// Element type.
  DType dtype = DType::f32;
  /// Where the storage lives.
  Device device;
  /// True when the strides are row-major for the shape (kept by recompute_contiguous()).
  bool contiguous = true;
  bool wrapped_number = false;  ///< made from a Scalar: lowest priority in type promotion
  /// Whether autograd records ops on this tensor.
  bool requires_grad = false;
  /// Autograd history and gradient; null when none.
  std::shared_ptr<AutogradMeta> autograd;
  /// Set on proxy tensors while tracing.
  std::shared_ptr<TraceValue> trace;
  uint64_t version = 0;  ///< bumped by in-place ops

  /// Recomputes `contiguous` from shape and strides.
  void recompute_contiguous();
  /// Marks an in-place write: this tensor's version and its storage's (shared by every view).
  void bump_version() {
    ++version;
    if (storage) ++storage->version;
  }
};

/// An n-dimensional array on one device: a handle (cheap to copy) to a view, with shape,
/// strides, offset and dtype, of a shared Storage. Views (reshape, permute, slice, ...) share
/// the storage; contiguous() and clone() copy. Ops are the free functions of tpucore/ops.h and
/// the methods below; semantics follow PyTorch. A default-constructed tensor is undefined; using
/// it is a tpu::Error. Tensors print with fmt ("{}" formats str()), as do Shape, DType and Device.
class Tensor {
 public:
  Tensor() = default;
  /// A handle to an existing implementation (used by ops and drivers).
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  /// False for a default-constructed tensor.
  bool defined() const { return impl_ != nullptr; }
  /// Dimension sizes.
  const Shape& shape() const { return impl().shape; }
  /// Strides, in elements.
  const Shape& strides() const { return impl().strides; }
  /// Number of dimensions.
  int dim() const { return impl().shape.ndim(); }
  /// Size of dimension `d` (negative counts from the end; out of range is a tpu::Error).
  int64_t size(int64_t d) const;
  /// Stride of dimension `d` in elements (negative counts from the end).
  int64_t stride(int64_t d) const;
  /// Number of elements (1 for a 0-d tensor).
  int64_t numel() const { return impl().shape.numel(); }
  /// Offset of the first element in the storage, in elements.
  int64_t offset() const { return impl().offset; }
  /// Element type.
  DType dtype() const { return impl().dtype; }
  /// Bytes per element.
  size_t element_size() const { return dtype_size(impl().dtype); }
  /// numel() * element_size().
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  /// The device holding the data.
  Device device() const { return impl().device; }
  /// True when the elements are dense in row-major order.
  bool is_contiguous() const { return impl().contiguous; }
  /// True for a proxy tensor of the tracer (inside a tpu::compile trace): it has no data.
  bool is_proxy() const { return impl_ && impl_->trace != nullptr; }
  /// The storage viewed (null for a proxy tensor).
  const StoragePtr& storage() const { return impl().storage; }
  /// The implementation; a tpu::Error on an undefined tensor.
  TensorImpl& impl() const {
    if (!impl_) [[unlikely]] fail("Tensor: use of an undefined (default-constructed) tensor");
    return *impl_;
  }
  /// The implementation handle (null when undefined).
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  /// True when both handles point to the same tensor (not just equal values).
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  /// Host pointer to the first element; only for cpu tensors (a tpu::Error otherwise).
  void* raw_data() const;
  /// Typed host pointer to the first element: T must match dtype() and the tensor must be on
  /// cpu (a tpu::Error otherwise). Mind the strides of a non-contiguous tensor.
  template <class T>
  T* data() const {
    if (dtype_of<T>::value != dtype()) [[unlikely]]
      fail("Tensor::data: requested {} but the tensor is {}", dtype_name(dtype_of<T>::value), dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }

  /// The single value of a one-element tensor, copied to the host (a graph break while tracing).
  Scalar item() const;
  /// item() converted to T.
  template <class T>
  T item() const {
    Scalar s = item();
    if constexpr (std::is_floating_point_v<T>) return static_cast<T>(s.to_double());
    else if constexpr (std::is_same_v<T, bool>) return s.to_bool();
    else return static_cast<T>(s.to_int());
  }
  /// All elements as a host vector of T (converted), in row-major order.
  template <class T>
  std::vector<T> to_vector() const;

  // ---- methods that forward to the ops in tpucore/ops.h ----
  /// Methods that forward to the ops of tpucore/ops.h of the same name (x.f(args) is f(x, args)).
  ///@{
  Tensor to(DType t) const;
  Tensor to(Device d) const;
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor reshape(const Shape& s) const;
  Tensor view(const Shape& s) const;
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor t() const;
  Tensor squeeze(std::optional<int64_t> dim = std::nullopt) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor expand(const Shape& s) const;
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor sum(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor mean(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  ///@}

  /// In-place ops (the result is cast to this tensor's dtype; returns *this), as the free
  /// functions of the same name in tpucore/ops.h.
  ///@{
  Tensor& add_(const Tensor& o);
  Tensor& add_(Scalar s);
  Tensor& sub_(const Tensor& o);
  Tensor& mul_(const Tensor& o);
  Tensor& mul_(Scalar s);
  Tensor& div_(const Tensor& o);
  Tensor& fill_(Scalar s);
  Tensor& copy_(const Tensor& src);
  Tensor& zero_();
  ///@}

  // ---- autograd (tpucore/autograd.h; semantics as PyTorch) ----
  /// Whether autograd records ops on this tensor.
  bool requires_grad() const { return impl().requires_grad; }
  Tensor& requires_grad_(bool on = true);  ///< only for floating point leaves
  bool is_leaf() const;                    ///< no recorded history (made by the user or under no-grad)
  Tensor grad() const;                     ///< accumulated gradient; undefined when none yet
  void set_grad(const Tensor& g);          ///< replaces it (an undefined tensor clears it)
  void zero_grad();                        ///< zeroes the accumulated gradient in place, if any
  void retain_grad() const;                ///< keep .grad() of a non-leaf after backward
  /// Reverse-mode gradient of this tensor with respect to the leaves that require grad;
  /// gradient defaults to 1 for a one-element tensor.
  void backward(const Tensor& gradient = {}, bool retain_graph = false, bool create_graph = false) const;
  Tensor detach() const;  ///< same storage, no history

  std::string str() const;  ///< PyTorch-like printout

 private:
  std::shared_ptr<TensorImpl> impl_;
};

/// A new contiguous tensor of `shape` and `dtype` on `device`, its memory uninitialized (the
/// allocation every op result and creation function goes through). Errors: a shape past
/// kMaxNumel elements, a device without a driver, out of device memory.
Tensor empty_tensor(const Shape& shape, DType dtype, Device device);

}  // namespace tpu

/// @cond
template <>
struct fmt::formatter<tpu::Tensor> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(const tpu::Tensor& t, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(t.str(), ctx);
  }
};
template <>
struct fmt::formatter<tpu::Shape> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(const tpu::Shape& s, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(s.str(), ctx);
  }
};
template <>
struct fmt::formatter<tpu::DType> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(tpu::DType t, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(tpu::dtype_name(t), ctx);
  }
};
template <>
struct fmt::formatter<tpu::Device> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(const tpu::Device& d, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(d.str(), ctx);
  }
};
/// @endcond
