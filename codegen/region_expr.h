// Elementwise nodes of a fused region as a VecExpr: each node's lowering rule appends it; values
// from outside the region become expression inputs laid out against the region's domain (0-d cpu
// constants become immediates). Shared by the region runner and the MLP fusion.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "codegen/elementwise_kernel.h"
#include "codegen/vector_expr.h"
#include "graph/ir.h"

namespace tpu::codegen {

struct RegionExprBuilder {
  const graph::Graph& g;
  std::vector<Tensor>& vals;
  Shape domain;
  Device dev;
  VecExpr& e;
  std::vector<EwInput>& inputs;  // layouts of the expression inputs first_input, first_input + 1, ...
  std::vector<Tensor>& args;     // their device tensors
  int first_input = 0;
  std::unordered_map<graph::ValueId, VecRef> known{};  // values already in the expression
  std::string key{};                                   // nodes and immediates, for cache keys

  RegionExprBuilder(const graph::Graph& g_, std::vector<Tensor>& vals_, Shape domain_, Device dev_, VecExpr& e_,
                    std::vector<EwInput>& inputs_, std::vector<Tensor>& args_)
      : g(g_), vals(vals_), domain(std::move(domain_)), dev(dev_), e(e_), inputs(inputs_), args(args_) {}

  std::optional<VecRef> ref(graph::ValueId v);
  // r, the f32 value of v, rounded to v's dtype when the graph emulates eager's precision
  // casts (Graph::emulate_precision_casts) and eager would have rounded it; else r.
  VecRef round_as_eager(graph::ValueId v, VecRef r);
  // Appends node n; false when it does not lower (no elementwise rule, integer math, an input
  // that is not available or not laid out).
  bool add(const graph::Node& n);
};

}  // namespace tpu::codegen
