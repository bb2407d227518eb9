// StableHLO export, the graph side: a traced graph as a StableHLO module in MLIR text. The
// public entry point, tpu::export_stablehlo, and what it maps are described in tpucore/export.h.
#pragma once

#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/stablehlo_options.h"
#include "tpucore/core/error.h"

namespace tpu {

namespace graph {
// The graph as a module: graph inputs with a real tensor in `captured` (same length as
// g.inputs; undefined = a function argument) are written as constants.
std::string to_stablehlo(const Graph& g, const std::vector<Tensor>& captured, const StableHloOptions& opt = {});
}  // namespace graph

}  // namespace tpu
