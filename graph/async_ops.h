// Asynchronous nodes: ops whose work runs in the background (the collectives of tpu::dist,
// registered by tpucore/dist). The executor starts such a node at its place in the schedule
// (schedule() puts it as early as its inputs allow) and waits for it only before the first
// step that reads its outputs (schedule() puts those readers as late as it can), so the
// computation in between overlaps the communication. Their input and output buffers are never
// shared with other values by the buffer planner (the background work reads and writes them
// until the wait).
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "graph/ir.h"

namespace tpu::graph {

class AsyncHandle {
 public:
  virtual ~AsyncHandle() = default;
  // Blocks until the work finished (rethrowing its error); the outputs then hold the values.
  virtual void wait() = 0;
};

// Starts node `n` with its inputs; `outs` (one per output) are allocated by the start function
// (or given, preallocated, when defined) and hold their values once the handle's wait() returned.
using AsyncStartFn = std::shared_ptr<AsyncHandle> (*)(const Node& n, std::span<const Tensor> ins,
                                                      std::span<Tensor> outs);

// Registers an op as asynchronous (later registrations replace it). Asynchronous nodes are
// never folded, merged (CSE) or fused.
void register_async_op(std::string_view op, AsyncStartFn start);
// The start function of an op, or nullptr when it runs synchronously.
AsyncStartFn async_start_fn(const ops::OpDef& op);
inline bool is_async(const Node& n) { return !n.dead && async_start_fn(*n.op) != nullptr; }

}  // namespace tpu::graph
