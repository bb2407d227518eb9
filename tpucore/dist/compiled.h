// tpu::dist inside tpu::compile (internal): while a trace records on this thread (or a tensor is
// a traced proxy), the collectives of ProcessGroup become graph nodes (ops dist_all_reduce,
// dist_broadcast, dist_all_gather, dist_reduce_scatter, dist_all_to_all) instead of running; the in-place
// results are functionalized (a copy_ into the caller's tensor). The nodes are asynchronous
// (graph/async_ops.h): the executor starts them as early as their input is ready and waits for
// them before the first step that reads their result. On sim devices the collective runs on a
// communication stream of the chip (the ICI) while the chip's current stream computes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpucore/dist.h"

namespace tpu::dist::detail {

// True when the call must be traced: a trace records on this thread, or t is a traced proxy.
bool traced(const Tensor& t);

Work traced_all_reduce(ProcessGroup& pg, const Tensor& t, ReduceOp op);
Work traced_broadcast(ProcessGroup& pg, const Tensor& t, int src);
Work traced_all_gather_into_tensor(ProcessGroup& pg, const Tensor& out, const Tensor& in);
Work traced_reduce_scatter_tensor(ProcessGroup& pg, const Tensor& out, const Tensor& in, ReduceOp op);
// Split sizes empty: equal splits. They become attributes of the node.
Work traced_all_to_all_single(ProcessGroup& pg, const Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                              const std::vector<int64_t>& in_splits);

// A tpu::Error: `op` cannot be recorded in a compiled graph.
[[noreturn]] void not_traceable(const char* op);

// The id under which a graph node names the group (assigned on first use), and back; the
// group's destructor forgets it, so graphs that name it recompile ("mesh changed").
int64_t graph_group_id(ProcessGroup& pg);
void forget_group(const ProcessGroup* pg);

}  // namespace tpu::dist::detail
