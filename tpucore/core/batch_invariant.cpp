#include "tpucore/core/batch_invariant.h"

namespace tpu {
namespace {
std::atomic<int> g_scopes{0};
}  // namespace

bool batch_invariant() { return g_scopes.load(std::memory_order_relaxed) > 0; }

BatchInvariantScope::BatchInvariantScope(bool enable) : enabled_(enable) {
  if (enabled_) g_scopes.fetch_add(1, std::memory_order_relaxed);
}

BatchInvariantScope::~BatchInvariantScope() {
  if (enabled_) g_scopes.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace tpu
