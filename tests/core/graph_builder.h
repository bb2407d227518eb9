// Builds graphs by hand for the pass tests: nodes get their output metas from the op's own
// meta function, so hand-built graphs are as well-formed as traced ones.
#pragma once

#include <catch2/catch.hpp>

#include "graph/ir.h"
#include "graph/passes/passes.h"
#include "graph/tracer.h"
#include "tpucore/ops.h"

namespace tpu::graph_testing {

using graph::Graph;
using graph::ValueId;

inline Tensor fake(const graph::ValueMeta& m) {
  static const auto tv = std::make_shared<TraceValue>();
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = m.shape;
  impl->strides = contiguous_strides(m.shape);
  impl->dtype = m.dtype;
  impl->device = m.device;
  impl->wrapped_number = m.wrapped;
  impl->trace = tv;
  return Tensor(std::move(impl));
}

inline const ops::OpDef& op(const char* name) {
  const ops::OpDef* d = ops::find_op(name);
  REQUIRE(d != nullptr);
  return *d;
}

// Adds a node; returns its first output.
inline ValueId node(Graph& g, const char* name, std::vector<ValueId> ins, ops::Attrs attrs = {}) {
  const ops::OpDef& d = op(name);
  std::vector<Tensor> fakes;
  for (ValueId v : ins) fakes.push_back(fake(g.meta(v)));
  ops::MetaResult m;
  d.meta(ops::MetaArgs{d, fakes, attrs}, m);
  std::vector<graph::ValueMeta> metas;
  for (int i = 0; i < m.num_outputs; ++i) metas.push_back({m.outputs[static_cast<size_t>(i)].shape, m.outputs[static_cast<size_t>(i)].dtype, m.outputs[static_cast<size_t>(i)].device, false});
  int n = g.add_node(d, std::move(ins), std::move(attrs), metas);
  return g.nodes[static_cast<size_t>(n)].outputs[0];
}

inline ValueId input(Graph& g, Shape s, DType dt = DType::f32) { return g.add_input({s, dt, Device(), false}); }
inline ValueId scalar_const(Graph& g, double v, DType dt = DType::f32) {
  Tensor t = tpu::to(tpu::scalar_tensor(v), dt).contiguous();
  t.impl().wrapped_number = true;
  return g.add_constant(t, true);
}

inline size_t count_op(const Graph& g, const char* name) {
  size_t k = 0;
  for (const auto& n : g.nodes) k += !n.dead && n.op->name == name;
  return k;
}

}  // namespace tpu::graph_testing
