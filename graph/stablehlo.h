// StableHLO export, the graph side: a traced graph as a StableHLO module in MLIR text. The
// public entry point, tpu::export_stablehlo, and what it maps are described in tpucore/export.h.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "graph/ir.h"
#include "graph/stablehlo_options.h"
#include "tpucore/core/error.h"

namespace tpu {

namespace graph {
// The graph as a module: graph inputs with a real tensor in `captured` (same length as
// g.inputs; undefined = a function argument) are written as constants.
std::string to_stablehlo(const Graph& g, const std::vector<Tensor>& captured, const StableHloOptions& opt = {});

// The compile-time parameters of a custom-call op's call, by name, read from its attributes.
using CustomCallParams = std::function<std::vector<std::pair<std::string, int64_t>>(const ops::Attrs& attrs)>;
// Makes the export write every node of op `op` as a `stablehlo.custom_call` whose
// call_target_name is the op's name, whose backend_config is its parameters as
// "name=value;..." and whose `tpucore.params` dictionary holds them as i64 attributes (the
// kernel API registers its ops here). A second registration of a name replaces the first.
void register_custom_call(std::string_view op, CustomCallParams params);
}  // namespace graph

}  // namespace tpu
