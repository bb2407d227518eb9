// Constant folding: a node whose inputs are all constants (or a creation op without inputs
// that is not random) is evaluated once, with the eager kernels, and replaced by a constant.
// Large results stay nodes so that compiled graphs do not carry big baked-in tensors.
#include "graph/executor.h"
#include "graph/async_ops.h"
#include "graph/passes/passes.h"
#include "graph/tracer.h"

namespace tpu::graph {

int fold_constants(Graph& g, int64_t max_elems) {
  int folded = 0;
  TraceScope no_trace(nullptr);  // evaluate for real even while a trace is active
  for (Node& n : g.nodes) {
    if (n.dead || n.op->has(ops::kRandom) || is_async(n)) continue;
    bool all_const = true;
    for (ValueId in : n.inputs) all_const &= g.value(in).kind == ValueKind::constant;
    if (!all_const) continue;
    bool small = true, cpu = true;
    for (ValueId o : n.outputs) {
      small &= g.meta(o).shape.numel() <= max_elems;
      cpu &= g.meta(o).device.is_cpu();
    }
    if (!small || !cpu) continue;
    std::vector<Tensor> ins;
    for (ValueId in : n.inputs) ins.push_back(g.value(in).constant);
    std::vector<Tensor> outs(std::max<size_t>(n.outputs.size(), ops::kMaxOutputs));
    try {
      run_node_eager(n, ins, outs);
    } catch (const Error&) {
      continue;  // leave it to run time, where the error is reported in context
    }
    std::vector<ValueId> outs_ids = n.outputs;
    n.dead = true;
    for (size_t k = 0; k < outs_ids.size(); ++k) {
      Tensor c = outs[k].contiguous();
      const bool wrapped = g.meta(outs_ids[k]).wrapped;
      ValueId cv = g.add_constant(c, wrapped);
      g.replace_uses(outs_ids[k], cv);
    }
    ++folded;
  }
  if (folded) g.compact();
  return folded;
}

}  // namespace tpu::graph
