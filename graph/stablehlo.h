// StableHLO export: a traced function (or a graph) as a StableHLO module in MLIR text, generic
// form ("stablehlo.add"(%a, %b) : (...) -> ...), the way go-xla writes it, for a PJRT plugin
// (libtpu, a CPU plugin) to compile.
//
// Version: the ops and attribute encodings of StableHLO 1.0 (the spec of openxla/stablehlo,
// stable since 2024: dense i64 arrays written `array<i64: ...>`, enum attributes
// `#stablehlo<comparison_direction LT>`, `#stablehlo.dot<...>` dimension numbers). No VHLO
// portable artifact is written; a consumer parses the text with a StableHLO of version >= 1.0.
// StableHloSyntax::mlir14 writes the same module in the attribute syntax MLIR 14 parses
// (`dense<[..]> : tensor<Nxi64>`, `#stablehlo<"comparison_direction LT">`), which is what the
// test checks with Debian's mlir-opt-14 (StableHLO ops are unregistered there, so only the
// generic structure, the SSA form and the types are checked, not the ops' semantics).
//
// Ops: elementwise arithmetic and math (erf, hence exact gelu, decomposed with a polynomial of
// absolute error <= 1.5e-7), compare/select/clamp, convert, views (reshape, transpose,
// broadcast_in_dim, slice), concatenate, dot_general (matmul with batch broadcasting, linear),
// reduce (sum, mean, prod, amax, amin, all, any), softmax / log_softmax / layer_norm / rms_norm /
// rotary_embedding / scaled_dot_product_attention decomposed, full. Any other op (gather,
// scatter, argmax, random, ...) makes the export a tpu::Error naming every such op.
// Tensors the function captures (weights in a closure) and constants are written as
// `stablehlo.constant`s; the example inputs become the function's arguments, in order.
#pragma once

#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "graph/ir.h"

namespace tpu {

inline constexpr const char* kStableHloVersion = "1.0";

enum class StableHloSyntax : uint8_t { current, mlir14 };

struct StableHloOptions {
  std::string function_name = "main";
  StableHloSyntax syntax = StableHloSyntax::current;
};

// Traces fn on proxies of `example_inputs` (their shapes and dtypes become the argument types)
// and writes the module. A graph break (reading a value inside fn) or an op without a StableHLO
// counterpart is a tpu::Error naming it.
std::string export_stablehlo(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                             const std::vector<Tensor>& example_inputs, const StableHloOptions& opt = {});

// For functions returning one Tensor.
template <class F>
  requires std::is_same_v<std::invoke_result_t<F, const std::vector<Tensor>&>, Tensor>
std::string export_stablehlo(F&& fn, const std::vector<Tensor>& example_inputs, const StableHloOptions& opt = {}) {
  return export_stablehlo(
      std::function<std::vector<Tensor>(const std::vector<Tensor>&)>(
          [&fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in)}; }),
      example_inputs, opt);
}

namespace graph {
// The graph as a module: graph inputs with a real tensor in `captured` (same length as
// g.inputs; undefined = a function argument) are written as constants.
std::string to_stablehlo(const Graph& g, const std::vector<Tensor>& captured, const StableHloOptions& opt = {});
}  // namespace graph

}  // namespace tpu
