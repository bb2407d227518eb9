#include "ops/fallback.h"

#include <spdlog/spdlog.h>

#include "tpucore/core/log.h"

#include <map>
#include <mutex>

#include "device/driver.h"

namespace tpu::ops {
namespace {
struct Counts {
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, FallbackCount> m;
  uint64_t total = 0;
};
Counts& counts() {
  static Counts* c = new Counts();
  return *c;
}
}  // namespace

// A strided view of a device tensor, brought to the host: the bytes the view spans are copied
// as they are and the view is rebuilt over them on the host. (Making it contiguous on the device
// would need a device kernel; through the fallback that would come back here.)
static Tensor strided_device_view_to_host(const Tensor& t) {
  const TensorImpl& im = t.impl();
  int64_t lo = im.offset, hi = im.offset;
  for (int d = 0; d < im.shape.ndim(); ++d) {
    const int64_t ext = im.strides[d] * (im.shape[d] - 1);
    (ext < 0 ? lo : hi) += ext;
  }
  const size_t es = t.element_size();
  const size_t span = static_cast<size_t>(hi - lo + 1) * es;
  Tensor flat = empty_tensor(Shape{hi - lo + 1}, im.dtype, Device());
  device::driver_for(im.device).copy_to_host(*im.storage, static_cast<size_t>(lo) * es, flat.storage()->data, span);
  auto v = std::make_shared<TensorImpl>(im);
  v->storage = flat.storage();
  v->device = Device();
  v->offset = im.offset - lo;
  v->autograd = nullptr;
  v->trace = nullptr;
  v->requires_grad = false;
  return Tensor(std::move(v)).contiguous();
}

Tensor copy_to_device(const Tensor& t, Device to) {
  if (t.numel() == 0) return empty_tensor(t.shape(), t.dtype(), to);
  if (!t.is_contiguous() && !t.device().is_cpu()) {
    Tensor host = strided_device_view_to_host(t);
    return to.is_cpu() ? host : copy_to_device(host, to);
  }
  Tensor src = t.contiguous();
  Tensor dst = empty_tensor(src.shape(), src.dtype(), to);
  const size_t n = src.nbytes();
  if (n == 0) return dst;
  const size_t soff = static_cast<size_t>(src.offset()) * src.element_size();
  Device from = src.device();
  if (from.type == DeviceType::cpu) {
    device::driver_for(to).copy_from_host(*dst.storage(), 0, static_cast<const char*>(src.storage()->data) + soff, n);
  } else if (to.type == DeviceType::cpu) {
    device::driver_for(from).copy_to_host(*src.storage(), soff, dst.storage()->data, n);
  } else if (from.type == to.type) {
    device::driver_for(from).copy_on_device(*src.storage(), soff, *dst.storage(), 0, n);
  } else {
    Tensor host = empty_tensor(src.shape(), src.dtype(), Device(DeviceType::cpu));
    device::driver_for(from).copy_to_host(*src.storage(), soff, host.storage()->data, n);
    device::driver_for(to).copy_from_host(*dst.storage(), 0, host.storage()->data, n);
  }
  return dst;
}

void run_on_host(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs, std::span<Tensor> outputs) {
  Device dev = outputs.empty() ? Device() : outputs[0].device();
  {
    Counts& c = counts();
    std::lock_guard<std::mutex> lk(c.mu);
    auto& e = c.m[{op.name, dev.str()}];
    if (e.calls == 0) {
      e.op = op.name;
      e.device = dev;
      tpu::log().warn("tpucore: op '{}' has no kernel for device '{}'; running it on the host (counted in fallback stats)",
                   op.name, dev.str());
    }
    ++e.calls;
    ++c.total;
  }
  std::vector<Tensor> host_in;
  host_in.reserve(inputs.size());
  for (const Tensor& t : inputs) host_in.push_back(t.device().is_cpu() ? t : copy_to_device(t, Device()));
  std::vector<Tensor> host_out;
  for (const Tensor& o : outputs) host_out.push_back(empty_tensor(o.shape(), o.dtype(), Device()));
  op.cpu(KernelArgs{op, host_in, host_out, attrs});
  for (size_t i = 0; i < outputs.size(); ++i) {
    const size_t n = host_out[i].nbytes();
    if (n) device::driver_for(dev).copy_from_host(*outputs[i].storage(), 0, host_out[i].storage()->data, n);
  }
}

std::vector<FallbackCount> fallback_counts() {
  Counts& c = counts();
  std::lock_guard<std::mutex> lk(c.mu);
  std::vector<FallbackCount> v;
  for (auto& [k, e] : c.m) v.push_back(e);
  return v;
}

uint64_t total_fallbacks() {
  Counts& c = counts();
  std::lock_guard<std::mutex> lk(c.mu);
  return c.total;
}

}  // namespace tpu::ops
