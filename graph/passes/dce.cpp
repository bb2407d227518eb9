// Dead code elimination: a node is dead when none of its outputs is used by a live node or
// the graph outputs. Visited in reverse so whole dead chains go in one pass.
#include "graph/passes/passes.h"

namespace tpu::graph {

int dce(Graph& g) {
  std::vector<char> live(g.values.size(), 0);
  for (ValueId o : g.outputs) live[static_cast<size_t>(o)] = 1;
  int removed = 0;
  for (size_t i = g.nodes.size(); i-- > 0;) {
    Node& n = g.nodes[i];
    if (n.dead) continue;
    bool used = false;
    for (ValueId o : n.outputs) used |= live[static_cast<size_t>(o)] != 0;
    if (!used) {
      n.dead = true;
      ++removed;
      continue;
    }
    for (ValueId in : n.inputs) live[static_cast<size_t>(in)] = 1;
  }
  if (removed) g.compact();
  return removed;
}

}  // namespace tpu::graph
