// Text form of a graph, one node a line (like torch.fx's printout), and a JSON serialization
// that round-trips (nlohmann/json inside the library; this header exposes strings only).
#pragma once

#include <string>

#include "graph/ir.h"

namespace tpu::graph {

std::string to_text(const Graph& g);
std::string to_json(const Graph& g);
// Parses and verifies a graph; malformed input is a tpu::Error that says what is wrong.
Graph from_json(const std::string& text);

}  // namespace tpu::graph
