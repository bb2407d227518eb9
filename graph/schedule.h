// Execution order of a graph: fused regions and standalone nodes as steps, topologically
// sorted (regions are convex, so the condensed graph is a DAG). Shared by the buffer
// planner, the cpu executor and (later) codegen.
#pragma once

#include <vector>

#include "graph/ir.h"

namespace tpu::graph {

struct Step {
  int32_t region = -1;  // a region index, or -1 for a standalone node
  int32_t node = -1;    // the node (standalone steps)
};

std::vector<Step> schedule(const Graph& g);

// Nodes whose outputs alias their first input (views): the value whose buffer v shares.
ValueId alias_root(const Graph& g, ValueId v);

}  // namespace tpu::graph
