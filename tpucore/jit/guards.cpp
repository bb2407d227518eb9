#include "tpucore/jit/guards.h"

namespace tpu::jit {
namespace {
thread_local std::vector<TraceGuard>* t_sink = nullptr;
}

void add_trace_guard(TraceGuard g) {
  if (t_sink) t_sink->push_back(std::move(g));
}

namespace detail {

TraceGuardScope::TraceGuardScope(std::vector<TraceGuard>* sink) : prev_(t_sink) { t_sink = sink; }
TraceGuardScope::~TraceGuardScope() { t_sink = prev_; }

std::string check_trace_guards(const std::vector<TraceGuard>& guards) {
  for (const TraceGuard& g : guards)
    if (std::string why = g(); !why.empty()) return why;
  return {};
}

}  // namespace detail
}  // namespace tpu::jit
