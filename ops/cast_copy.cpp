// Cast, contiguous copy, clone and the strided copy_ behind every in-place op.
#include <cstring>

#include "device/driver.h"
#include "ops/cpu/loops.h"
#include "ops/fallback.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "tpucore/core/hooks.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;

// One element conversion. 16- and 8-bit floats go through f32 first so that their conversion to an
// integer gets the same saturation (NaN -> 0) as f32's instead of an undefined float->int cast.
template <class TD, class TS>
inline TD cast_element(TS v) {
  if constexpr (cpu::is_narrow_float_v<TS> && std::is_integral_v<TD> &&
                !std::is_same_v<TD, bool>)
    return cpu::convert<TD>(static_cast<float>(v));
  else
    return cpu::convert<TD>(v);
}

// Strided, converting copy of src (broadcast to dst's shape) into dst; both on the cpu.
void strided_copy_cpu(const Tensor& dst, const Tensor& src) {
  dispatch_any_dtype(dst.dtype(), [&](auto d) {
    using TD = decltype(d);
    dispatch_any_dtype(src.dtype(), [&](auto s) {
      using TS = decltype(s);
      std::array<char*, 2> base{cpu::byte_ptr(dst), cpu::byte_ptr(src)};
      std::array<Shape, 2> st{cpu::broadcast_byte_strides(dst, dst.shape()), cpu::broadcast_byte_strides(src, dst.shape())};
      cpu::for_each_run<2>(dst.shape(), base, st, [&](std::array<char*, 2> p, std::array<int64_t, 2> s2, int64_t n) {
        if constexpr (std::is_same_v<TD, TS>) {
          if (s2[0] == sizeof(TD) && s2[1] == sizeof(TS)) {
            std::memcpy(p[0], p[1], static_cast<size_t>(n) * sizeof(TD));
            return;
          }
        }
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<TD*>(p[0] + i * s2[0]) = cast_element<TD>(*reinterpret_cast<const TS*>(p[1] + i * s2[1]));
      });
    });
  });
}

// copy_ into a non-contiguous view on a device that has no strided-store kernel: the span of
// storage the view covers comes to the host, the view's elements are written there through its
// strides, and the span goes back (the elements in between are written back unchanged).
void copy_into_device_view(const Tensor& self, const Tensor& src) {
  int64_t extent = 1;  // elements from the view's first to its last, inclusive
  for (int i = 0; i < self.dim(); ++i) {
    if (self.shape()[i] == 0) return;
    TPU_CHECK(self.strides()[i] >= 0, "copy_: destination with a negative stride on device {}", self.device().str());
    extent += (self.shape()[i] - 1) * self.strides()[i];
  }
  const size_t es = self.element_size(), at = static_cast<size_t>(self.offset()) * es;
  auto span = std::make_shared<TensorImpl>(empty_tensor(Shape{extent}, self.dtype(), Device()).impl());
  device::Driver& drv = device::driver_for(self.device());
  drv.copy_to_host(*self.storage(), at, span->storage->data, static_cast<size_t>(extent) * es);
  span->shape = self.shape();
  span->strides = self.strides();
  span->recompute_contiguous();
  strided_copy_cpu(Tensor(span), src.device().is_cpu() ? src : to(src, Device()));
  drv.copy_from_host(*self.storage(), at, span->storage->data, static_cast<size_t>(extent) * es);
}

void cast_meta(const MetaArgs& a, MetaResult& m) {
  m.out() = {a.inputs[0].shape(), a.attrs.get_dtype("dtype"), a.inputs[0].device()};
}
void cast_cpu(const KernelArgs& a) { strided_copy_cpu(a.outputs[0], a.inputs[0]); }
// Conversions to f8e4m3 / f8e5m2 overflow as PyTorch's float8 casts (tpucore/core/float8.h).
TPU_DEFINE_OP(cast_op, {.name = "to_dtype", .num_inputs = 1, .flags = kElementwise | kFloat8, .meta = &cast_meta,
                        .cpu = &cast_cpu, .doc = "converts elements to another dtype (round to nearest even)"});

void same_meta(const MetaArgs& a, MetaResult& m) {
  m.out() = {a.inputs[0].shape(), a.inputs[0].dtype(), a.inputs[0].device()};
}
void copy_cpu(const KernelArgs& a) { strided_copy_cpu(a.outputs[0], a.inputs[0]); }
TPU_DEFINE_OP(contiguous_op, {.name = "contiguous", .num_inputs = 1, .flags = kElementwise | kFloat8, .meta = &same_meta,
                              .cpu = &copy_cpu, .doc = "copies a view into a new row-major tensor"});

}  // namespace

Tensor to(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return ops::call(cast_op(), {x}, {{"dtype", dtype}});
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous() && (!x.is_proxy() || detail::proxy_eager_contiguous(x))) return x;
  return ops::call(contiguous_op(), {x});
}

Tensor clone(const Tensor& x) { return ops::call(contiguous_op(), {x}); }

Tensor to(const Tensor& x, Device device) {
  if (x.is_proxy() && detail::proxy_deferred(x)) return to(detail::materialize_proxy(x, "to(device)"), device);
  if (x.device() == device) return x;
  TPU_CHECK(!x.is_proxy(), "to: moving a traced tensor between devices ({} -> {}) is not supported inside compile",
            x.device().str(), device.str());
  device::driver_for(device);  // clear error for a missing driver or bad index
  detail::before_host_access(x);  // deferred eager mode: pending writes into x land first
  Tensor r;
  {
    ops::EagerScope eager;  // the copy's own ops (contiguous()) run now, also while tracing
    r = ops::copy_to_device(x, device);
  }
  if (x.impl().requires_grad) detail::on_device_copy(x, r);  // autograd: the gradient moves back
  return r;
}

Tensor& copy_(Tensor& self, const Tensor& src_in) {
  TPU_CHECK(self.defined() && src_in.defined(), "copy_: undefined tensor");
  if (InplaceHook h = inplace_hook()) {
    const Tensor ins[1] = {src_in};
    if (h("copy_", nullptr, self, std::span<const Tensor>(ins, 1), ops::Attrs{})) return self;
  }
  if (self.is_proxy() || src_in.is_proxy() || ops::interceptor()) {  // tracing: functionalized
    detail::traced_copy(self, src_in);
    return self;
  }
  broadcast_shapes(self.shape(), src_in.shape(), "copy_");
  Shape b = broadcast_shapes(self.shape(), src_in.shape(), "copy_");
  TPU_CHECK(b == self.shape(), "copy_: source of shape {} cannot be broadcast to the destination's shape {}",
            src_in.shape().str(), self.shape().str());
  Tensor src = src_in;
  if (src.device() != self.device()) src = to(src, self.device());
  if (self.device().is_cpu()) {
    strided_copy_cpu(self, src);
  } else {
    // Other devices: convert/broadcast on the device, then copy bytes into place.
    if (!self.is_contiguous()) {
      copy_into_device_view(self, src);
      self.impl().bump_version();
      return self;
    }
    Tensor s2 = contiguous(to(expand(src, self.shape()), self.dtype()));
    const size_t es = self.element_size();
    device::driver_for(self.device())
        .copy_on_device(*s2.storage(), static_cast<size_t>(s2.offset()) * es, *self.storage(),
                        static_cast<size_t>(self.offset()) * es, self.nbytes());
  }
  self.impl().bump_version();
  return self;
}

}  // namespace tpu
