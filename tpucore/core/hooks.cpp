#include "tpucore/core/hooks.h"

#include <atomic>

namespace tpu::detail {
namespace {
std::atomic<MaterializeHook> g_hook{nullptr};
std::atomic<TracedCopyHook> g_copy_hook{nullptr};
std::atomic<DeviceCopyHook> g_device_copy_hook{nullptr};
std::atomic<ProxyContiguousHook> g_contiguous_hook{nullptr};
}  // namespace

void set_materialize_hook(MaterializeHook h) { g_hook.store(h); }

Tensor materialize_proxy(const Tensor& proxy, const char* what) {
  MaterializeHook h = g_hook.load();
  TPU_CHECK(h != nullptr, "{}: the tensor is a traced proxy and no tracer is active", what);
  return h(proxy, what);
}

void set_traced_copy_hook(TracedCopyHook h) { g_copy_hook.store(h); }

void traced_copy(const Tensor& self, const Tensor& src) {
  TracedCopyHook h = g_copy_hook.load();
  TPU_CHECK(h != nullptr, "copy_: a traced (proxy) tensor was written or read outside of tracing");
  h(self, src);
}

void set_proxy_contiguous_hook(ProxyContiguousHook h) { g_contiguous_hook.store(h); }

bool proxy_eager_contiguous(const Tensor& proxy) {
  ProxyContiguousHook h = g_contiguous_hook.load(std::memory_order_relaxed);
  return h && h(proxy);
}

namespace {
std::atomic<ProxyDeferredHook> g_deferred_hook{nullptr};
}  // namespace
void set_proxy_deferred_hook(ProxyDeferredHook h) { g_deferred_hook.store(h); }
bool proxy_deferred(const Tensor& proxy) {
  ProxyDeferredHook h = g_deferred_hook.load(std::memory_order_relaxed);
  return h && h(proxy);
}

namespace {
std::atomic<DeferredAccessHook> g_access_hook{nullptr};
}  // namespace
void set_deferred_access_hook(DeferredAccessHook h) { g_access_hook.store(h); }
void before_host_access(const Tensor& t) {
  if (DeferredAccessHook h = g_access_hook.load(std::memory_order_relaxed)) h(t);
}

void set_device_copy_hook(DeviceCopyHook h) { g_device_copy_hook.store(h); }

void on_device_copy(const Tensor& src, Tensor& dst) {
  if (DeviceCopyHook h = g_device_copy_hook.load(std::memory_order_relaxed)) h(src, dst);
}

}  // namespace tpu::detail
