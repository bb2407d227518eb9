// Runs an optimized graph. On the cpu, fused regions run tile by tile (one pass over memory,
// split over the cores) and standalone nodes call their kernels directly into buffers planned
// by liveness; on other devices each node goes through the eager op front half.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "graph/async_ops.h"
#include "graph/ir.h"
#include "graph/region_exec.h"
#include "graph/schedule.h"

namespace tpu::graph {

// Runs a fused region on a device that is not the cpu (codegen on sim, installed by the
// tpu::compile driver): reads the region's inputs from `vals`, sets its outputs; returns false to
// decline, and the region's nodes then run one by one through the eager front half.
using RegionRunner = bool (*)(const Graph& g, const Region& r, std::vector<Tensor>& vals);

class Executable {
 public:
  explicit Executable(Graph g, RegionRunner device_regions = nullptr);
  const Graph& graph() const { return g_; }
  // inputs: one tensor per graph input (shapes and dtypes as in the graph).
  void run(std::span<const Tensor> inputs, std::vector<Tensor>& outputs) const;

 private:
  Graph g_;
  std::vector<Step> steps_;
  std::vector<std::vector<ValueId>> release_;  // values dead after each step
  std::vector<RegionProgram> programs_;        // per region
  std::vector<char> vec_ok_;                   // per region: the f32 vector interpreter applies
  std::vector<char> is_output_;                // per value
  bool on_cpu_ = true;
  RegionRunner device_regions_ = nullptr;
  // Asynchronous nodes (graph/async_ops.h): start function per node, buffer root per value.
  std::vector<AsyncStartFn> async_;
  std::vector<ValueId> root_;
  bool has_async_ = false;
};

// Runs one node eagerly through the front half (used by constant folding and off the cpu).
void run_node_eager(const Node& n, std::span<const Tensor> ins, std::span<Tensor> outs);

}  // namespace tpu::graph
