// How an op takes part in fusion: elementwise (any tiling), rowwise (reduces or normalizes
// trailing dims, so tiles are whole rows), matmul (tiles are blocks of output rows), or other
// (never fused). Used by the fusion pass, the cpu region executor and, later, codegen.
#pragma once

#include "graph/ir.h"

namespace tpu::graph {

enum class OpClass : uint8_t { other, elementwise, rowwise, matmul };
enum class InputMode : uint8_t { broadcast, own, full };

struct FusionInfo {
  OpClass cls = OpClass::other;
  int tile_limit = -1;  // tiles may split dims [0, tile_limit] of the node's output
};

FusionInfo classify(const Graph& g, const Node& n);
// How the region executor hands input i of a fused node to its kernel.
InputMode input_mode(OpClass c, size_t input);

}  // namespace tpu::graph
