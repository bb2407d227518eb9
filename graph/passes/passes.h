// Graph passes. Each pass is one file under graph/passes/ and has its own tests. A pass
// returns how many changes it made; passes never change what the graph computes.
#pragma once

#include <string>
#include <vector>

#include "graph/ir.h"

namespace tpu::graph {

// Dead code elimination: drops nodes whose outputs nobody uses.
int dce(Graph& g);
// Common subexpression elimination: merges identical nodes (same op, inputs, attrs) and
// identical constants. Random ops are never merged.
int cse(Graph& g);
// Constant folding: nodes whose inputs are all constants (and non-random creation ops) are
// evaluated with the eager kernels; results up to max_elems elements become constants.
int fold_constants(Graph& g, int64_t max_elems = 1 << 16);
// Algebraic simplification: x*1, x+0, x-0, x/1, double permute, view of view, cast to the
// same dtype, views and copies that change nothing.
int simplify(Graph& g);
// The fused mixture-of-experts layer: moe_sort -> moe_permute -> grouped_matmul -> silu-gated
// product -> grouped_matmul -> moe_unpermute, when nothing else reads its intermediates (an
// inference graph on the cpu or sim), becomes one moe_ffn node (fuse_moe.cpp).
int fuse_moe(Graph& g);
// Fusion into regions (sets Graph::regions and Node::region): elementwise chains, matmul with
// its epilogue, rowwise reductions with their elementwise producers and consumers.
int fuse(Graph& g);
// Buffer planning by liveness (sets Graph::plan). Returns the number of slots.
int plan_buffers(Graph& g);

// Checks the graph's invariants (ids, topological order, metas re-inferred by each op's meta
// function, regions, plan); a violation is a tpu::Error naming the node and `when`.
void verify(const Graph& g, const std::string& when);

struct PassOptions {
  bool fold = true;
  bool simplify = true;
  bool cse = true;
  bool fuse = true;
  bool plan = true;
  bool verify = false;
  bool emulate_precision_casts = false;  // sets Graph::emulate_precision_casts first
};
struct PassReport {
  std::vector<std::pair<std::string, int>> changes;  // pass name, changes
};
// The default pipeline: simplify, fold, cse, dce (to a fixed point), then fuse and plan.
PassReport optimize(Graph& g, const PassOptions& o);

}  // namespace tpu::graph
