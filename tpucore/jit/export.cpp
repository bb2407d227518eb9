// tpu::export_stablehlo's tracing half (tpucore/export.h): trace the function with proxies of the
// example inputs, then write the graph (graph/stablehlo.cpp).
#include "tpucore/export.h"

#include "graph/stablehlo.h"
#include "graph/tracer.h"

namespace tpu {

std::string detail::export_traced(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                                  const std::vector<Tensor>& example_inputs, const StableHloOptions& opt) {
  graph::Tracer tracer;
  std::vector<Tensor> proxies;
  for (size_t i = 0; i < example_inputs.size(); ++i) {
    TPU_CHECK(example_inputs[i].defined(), "export_stablehlo: example input {} is an undefined tensor", i);
    proxies.push_back(tracer.add_arg(example_inputs[i], int(i)));
  }
  std::vector<Tensor> outs;
  {
    graph::TraceScope scope(&tracer);
    outs = fn(proxies);
  }
  TPU_CHECK(!outs.empty(), "export_stablehlo: the function returned no tensors");
  tracer.set_outputs(outs);
  const graph::Graph& g = tracer.graph();
  std::vector<Tensor> captured(g.inputs.size());
  for (size_t i = 0; i < g.inputs.size(); ++i)
    if (tracer.sources()[i].kind == graph::InputSource::Kind::captured) captured[i] = tracer.real_inputs()[i];
  return graph::to_stablehlo(g, captured, opt);
}

}  // namespace tpu
