#include "tpucore/jit_hooks.h"

#include <atomic>

namespace tpu::detail {
namespace {
std::atomic<MaterializeHook> g_hook{nullptr};
}

void set_materialize_hook(MaterializeHook h) { g_hook.store(h); }

Tensor materialize_proxy(const Tensor& proxy, const char* what) {
  MaterializeHook h = g_hook.load();
  TPU_CHECK(h != nullptr, "{}: the tensor is a traced proxy and no tracer is active", what);
  return h(proxy, what);
}

}  // namespace tpu::detail
