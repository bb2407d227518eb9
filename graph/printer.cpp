#include "graph/printer.h"

namespace tpu::graph {

std::string to_text(const Graph& g) {
  std::string s = "graph(";
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    if (i) s += ", ";
    s += fmt::format("%{}: {}", g.inputs[i], meta_str(g.meta(g.inputs[i])));
  }
  s += "):\n";
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& val = g.values[v];
    if (val.kind != ValueKind::constant) continue;
    std::string shown;
    if (val.constant.numel() <= 4) {
      std::vector<float> xs = val.constant.to_vector<float>();
      shown = fmt::format(" = [{}]", fmt::join(xs, ", "));
    }
    s += fmt::format("  %{}: {} = constant{}{}\n", v, meta_str(val.meta), val.meta.wrapped ? "(wrapped)" : "", shown);
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.dead) continue;
    std::string outs, ins;
    for (size_t k = 0; k < n.outputs.size(); ++k)
      outs += fmt::format("{}%{}: {}", k ? ", " : "", n.outputs[k], meta_str(g.meta(n.outputs[k])));
    for (size_t k = 0; k < n.inputs.size(); ++k) ins += fmt::format("{}%{}", k ? ", " : "", n.inputs[k]);
    std::string attrs = n.attrs.empty() ? "" : (ins.empty() ? "" : ", ") + n.attrs.str();
    std::string line = fmt::format("  {} = {}({}{})", outs, n.op->name, ins, attrs);
    if (n.region >= 0) {
      if (line.size() < 60) line.resize(60, ' ');
      line += fmt::format("  # region {}", n.region);
    }
    s += line + "\n";
  }
  s += "  return (";
  for (size_t i = 0; i < g.outputs.size(); ++i) s += fmt::format("{}%{}", i ? ", " : "", g.outputs[i]);
  s += ")\n";
  for (size_t r = 0; r < g.regions.size(); ++r) {
    const Region& R = g.regions[r];
    const char* kind = R.kind == RegionKind::elementwise ? "elementwise" : R.kind == RegionKind::rowwise ? "rowwise" : "matmul_epilogue";
    s += fmt::format("# region {}: {} over {}, {} nodes, tiles split dims <= {}\n", r, kind, R.domain.str(), R.nodes.size(),
                     R.tile_dim_limit);
  }
  if (g.plan.valid)
    s += fmt::format("# buffers: {} slots, planned peak {} bytes (unplanned {} bytes)\n", g.plan.slot_bytes.size(),
                     g.plan.planned_peak_bytes, g.plan.unplanned_bytes);
  return s;
}

}  // namespace tpu::graph
