// Dynamic dims: a dim marked dynamic is padded (with zeros) up to a power-of-two bucket, the
// graph is compiled once per bucket, and outputs along that dim are cut back to the real size
// (the mask). That is exact only when no op mixes values along the padded dim, so this walk
// follows the dim through the graph and refuses (with a reason) when an op reduces, contracts,
// normalizes, slices or reshapes it; the function is then compiled for exact sizes instead.
#include "graph/op_class.h"
#include "tpucore/jit/internal.h"

namespace tpu::jit::detail {
namespace {

using graph::Graph;
using graph::Node;
using Marks = uint32_t;  // bit d: dim d follows the padded dim

bool reduces_marked(const std::vector<int64_t>& dims, int nd, Marks m) {
  if (dims.empty()) return m != 0;
  for (int64_t d : dims) {
    int w = static_cast<int>(d < 0 ? d + nd : d);
    if (w >= 0 && w < nd && ((m >> w) & 1u)) return true;
  }
  return false;
}

}  // namespace

std::optional<std::vector<std::pair<int, int>>> follow_dynamic_dims(const Graph& g,
                                                                    const std::vector<std::pair<int, int>>& input_dims,
                                                                    std::string& why) {
  std::vector<Marks> mark(g.values.size(), 0);
  for (auto& [in, d] : input_dims) mark[static_cast<size_t>(g.inputs[static_cast<size_t>(in)])] |= 1u << d;
  for (const Node& n : g.nodes) {
    if (n.dead) continue;
    Marks any = 0;
    for (graph::ValueId i : n.inputs) any |= mark[static_cast<size_t>(i)];
    if (!any) continue;
    const std::string& name = n.op->name;
    const Shape& out = g.meta(n.outputs[0]).shape;
    const int nd = out.ndim();
    auto refuse = [&](const char* what) {
      why = fmt::format("op '{}' {} the dynamic dim", name, what);
      return std::nullopt;
    };
    Marks m = 0;
    const Marks m0 = mark[static_cast<size_t>(n.inputs[0])];
    const int nd0 = g.meta(n.inputs[0]).shape.ndim();
    if (n.op->has(ops::kElementwise)) {
      for (graph::ValueId i : n.inputs) {
        const Shape& s = g.meta(i).shape;
        const int off = nd - s.ndim();
        for (int d = 0; d < s.ndim(); ++d)
          if ((mark[static_cast<size_t>(i)] >> d) & 1u) {
            if (s[d] != out[d + off]) return refuse("broadcasts");
            m |= 1u << (d + off);
          }
      }
    } else if (n.op->has(ops::kReduction)) {
      const auto* dv = n.attrs.find("dims");
      if (!dv || !std::holds_alternative<std::vector<int64_t>>(*dv)) return refuse("reduces");
      const auto& dims = std::get<std::vector<int64_t>>(*dv);
      if (reduces_marked(dims, nd0, m0)) return refuse("reduces");
      const bool keep = n.attrs.get_bool("keepdim", false);
      std::vector<char> red(static_cast<size_t>(nd0), 0);
      for (int64_t d : dims) red[static_cast<size_t>(d < 0 ? d + nd0 : d)] = 1;
      for (int d = 0, o = 0; d < nd0; ++d) {
        if (red[static_cast<size_t>(d)] && !keep) continue;
        if ((m0 >> d) & 1u) m |= 1u << o;
        ++o;
      }
    } else if (name == "softmax" || name == "log_softmax") {
      int64_t d = n.attrs.get_int("dim");
      if ((m0 >> (d < 0 ? d + nd0 : d)) & 1u) return refuse("normalizes over");
      m = m0;
    } else if (name == "layer_norm" || name == "rms_norm") {
      const int k = static_cast<int>(n.attrs.get_ints("normalized_shape").size());
      if (m0 >> (nd0 - k)) return refuse("normalizes over");
      for (size_t i = 1; i < n.inputs.size(); ++i)
        if (mark[static_cast<size_t>(n.inputs[i])]) return refuse("takes a weight along");
      m = m0;
    } else if (name == "matmul" || name == "mm" || name == "bmm") {
      const Marks m1 = mark[static_cast<size_t>(n.inputs[1])];
      const int nd1 = g.meta(n.inputs[1]).shape.ndim();
      if (nd0 < 2 || nd1 < 2) return refuse("contracts");
      if (((m0 >> (nd0 - 1)) & 1u) || ((m1 >> (nd1 - 2)) & 1u)) return refuse("contracts");
      if ((m0 >> (nd0 - 2)) & 1u) m |= 1u << (nd - 2);
      if ((m1 >> (nd1 - 1)) & 1u) m |= 1u << (nd - 1);
      for (int d = 0; d < nd0 - 2; ++d)
        if ((m0 >> d) & 1u) m |= 1u << (d + nd - nd0);
      for (int d = 0; d < nd1 - 2; ++d)
        if ((m1 >> d) & 1u) m |= 1u << (d + nd - nd1);
    } else if (name == "permute") {
      const auto& dims = n.attrs.get_ints("dims");
      for (int o = 0; o < nd; ++o) {
        int64_t src = dims[static_cast<size_t>(o)];
        if ((m0 >> (src < 0 ? src + nd0 : src)) & 1u) m |= 1u << o;
      }
    } else if (name == "expand") {
      for (int d = 0; d < nd0; ++d)
        if ((m0 >> d) & 1u) m |= 1u << (d + nd - nd0);
    } else if (name == "view") {
      // Kept when the dim survives with the same size and the same product of dims before it.
      const Shape& in = g.meta(n.inputs[0]).shape;
      for (int d = 0; d < nd0; ++d) {
        if (!((m0 >> d) & 1u)) continue;
        int64_t before = 1;
        for (int j = 0; j < d; ++j) before *= in[j];
        int64_t acc = 1;
        int found = -1;
        for (int o = 0; o < nd; ++o) {
          if (acc == before && out[o] == in[d]) {
            found = o;
            break;
          }
          acc *= out[o];
        }
        if (found < 0) return refuse("reshapes");
        m |= 1u << found;
      }
    } else {
      return refuse("reads across");
    }
    for (graph::ValueId o : n.outputs) mark[static_cast<size_t>(o)] = m;
  }
  std::vector<std::pair<int, int>> res;
  for (size_t i = 0; i < g.outputs.size(); ++i) {
    const Marks m = mark[static_cast<size_t>(g.outputs[i])];
    for (int d = 0; d < kMaxDims; ++d)
      if ((m >> d) & 1u) res.emplace_back(static_cast<int>(i), d);
  }
  return res;
}

}  // namespace tpu::jit::detail
