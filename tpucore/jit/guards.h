// Guards on state outside a traced graph that the graph depends on, for layers above the JIT
// (tpu::dist's process groups: the mesh of a compiled function's collectives). While
// tpu::compile traces a function on this thread, add_trace_guard attaches a check to the graph
// being compiled; the cached graph is used only while every check of it returns "", else the
// function is traced again and the check's text is the recompile's reason (jit::stats()).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace tpu::jit {

using TraceGuard = std::function<std::string()>;  // "" while valid, else why not

// No-op when no tpu::compile trace records on this thread.
void add_trace_guard(TraceGuard g);

namespace detail {
// Collects the guards added on this thread for a scope (the engine's trace).
class TraceGuardScope {
 public:
  explicit TraceGuardScope(std::vector<TraceGuard>* sink);
  ~TraceGuardScope();
  TraceGuardScope(const TraceGuardScope&) = delete;
  TraceGuardScope& operator=(const TraceGuardScope&) = delete;

 private:
  std::vector<TraceGuard>* prev_;
};
// "" when every guard holds, else the first failure.
std::string check_trace_guards(const std::vector<TraceGuard>& guards);
}  // namespace detail

}  // namespace tpu::jit
