// Fusion into regions. Nodes are visited in topological order; a fusable node joins the region
// of one of its producers when the shapes fit the region's domain (same shape, or the domain
// reduced over trailing dims past the tile limit) and joining keeps the region convex (no
// other input of the node depends on the region through a node outside it). Otherwise it
// starts a region. When the node joins a region, elementwise regions of its other producers
// merge into it where that keeps the region convex. Regions of a single node are dissolved
// (the node's own kernel is already one pass). The result: elementwise chains, matmul +
// epilogue, and rowwise regions (softmax, layer_norm, rms_norm, written by hand or as ops,
// with their neighbours).
#include <algorithm>

#include "graph/op_class.h"
#include "graph/passes/passes.h"

namespace tpu::graph {
namespace {

struct Builder {
  Graph& g;
  std::vector<FusionInfo> info;

  // True when node p (transitively) reads a value produced inside region r. A region runs as
  // one step, so a node in another region depends on r when any node of its region does.
  bool depends_on(int32_t p, int32_t r, std::vector<char>& seen) {
    const Node& n = g.nodes[static_cast<size_t>(p)];
    if (n.region == r) return true;
    if (seen[static_cast<size_t>(p)]) return false;
    auto reads_r = [&](int32_t m) {
      seen[static_cast<size_t>(m)] = 1;
      for (ValueId in : g.nodes[static_cast<size_t>(m)].inputs) {
        const Value& v = g.value(in);
        if (v.kind != ValueKind::node) continue;
        if (n.region >= 0 && g.nodes[static_cast<size_t>(v.producer)].region == n.region) continue;  // inside
        if (depends_on(v.producer, r, seen)) return true;
      }
      return false;
    };
    if (n.region < 0) return reads_r(p);
    for (int32_t m : g.regions[static_cast<size_t>(n.region)].nodes) seen[static_cast<size_t>(m)] = 1;
    for (int32_t m : g.regions[static_cast<size_t>(n.region)].nodes)
      if (reads_r(m)) return true;
    return false;
  }

  // The shape s fits domain d with tile limit lim: equal dims up to lim, and past lim equal
  // or reduced to 1.
  static bool fits(const Shape& s, const Shape& d, int lim) {
    if (s.ndim() != d.ndim()) return false;
    for (int j = 0; j < d.ndim(); ++j) {
      if (s[j] == d[j]) continue;
      if (j > lim && s[j] == 1) continue;
      return false;
    }
    return true;
  }

  bool can_join(int32_t ni, int32_t r) {
    const Node& n = g.nodes[static_cast<size_t>(ni)];
    const Region& R = g.regions[static_cast<size_t>(r)];
    const FusionInfo& fi = info[static_cast<size_t>(ni)];
    const int lim = std::min(R.tile_dim_limit, fi.tile_limit);
    if (lim < 0) return false;
    const Shape& s = g.meta(n.outputs[0]).shape;
    if (fi.cls == OpClass::matmul) return false;
    if (R.kind == RegionKind::matmul_epilogue) {
      if (fi.cls != OpClass::elementwise || s != R.domain) return false;
    } else if (fi.cls == OpClass::rowwise) {
      if (g.meta(n.inputs[0]).shape != R.domain || !fits(s, R.domain, lim)) return false;
      // Values already in the region must still fit the tighter limit.
      for (int32_t m : R.nodes)
        if (!fits(g.meta(g.nodes[static_cast<size_t>(m)].outputs[0]).shape, R.domain, lim)) return false;
    } else if (!fits(s, R.domain, lim)) {
      return false;
    }
    // Convexity: inputs from outside the region must not depend on it.
    std::vector<char> seen(g.nodes.size(), 0);
    for (ValueId in : n.inputs) {
      const Value& v = g.value(in);
      if (v.kind != ValueKind::node) continue;
      const Node& p = g.nodes[static_cast<size_t>(v.producer)];
      if (p.region == r) continue;
      if (depends_on(v.producer, r, seen)) return false;
    }
    return true;
  }

  void join(int32_t ni, int32_t r) {
    Region& R = g.regions[static_cast<size_t>(r)];
    const FusionInfo& fi = info[static_cast<size_t>(ni)];
    R.nodes.push_back(ni);
    R.tile_dim_limit = std::min(R.tile_dim_limit, fi.tile_limit);
    if (fi.cls == OpClass::rowwise && R.kind == RegionKind::elementwise) R.kind = RegionKind::rowwise;
    g.nodes[static_cast<size_t>(ni)].region = r;
  }

  // True when an elementwise region `a` may merge into elementwise region `t` (same domain)
  // without a node outside both lying on a path between them (which would make a cycle).
  bool can_merge(int32_t a, int32_t t) {
    const Region& A = g.regions[static_cast<size_t>(a)];
    const Region& T = g.regions[static_cast<size_t>(t)];
    if (A.kind != RegionKind::elementwise || T.kind != RegionKind::elementwise || A.domain != T.domain) return false;
    auto outside_inputs_clear = [&](const Region& R, int32_t other) {
      std::vector<char> seen(g.nodes.size(), 0);
      for (int32_t ni : R.nodes)
        for (ValueId in : g.nodes[static_cast<size_t>(ni)].inputs) {
          const Value& v = g.value(in);
          if (v.kind != ValueKind::node) continue;
          const int32_t pr = g.nodes[static_cast<size_t>(v.producer)].region;
          if (pr == a || pr == t) continue;
          if (depends_on(v.producer, other, seen)) return false;
        }
      return true;
    };
    return outside_inputs_clear(A, t) && outside_inputs_clear(T, a);
  }

  // Moves region a's nodes into t (a is left empty and dissolved later).
  void merge(int32_t a, int32_t t) {
    Region& A = g.regions[static_cast<size_t>(a)];
    Region& T = g.regions[static_cast<size_t>(t)];
    for (int32_t ni : A.nodes) {
      g.nodes[static_cast<size_t>(ni)].region = t;
      T.nodes.push_back(ni);
    }
    std::sort(T.nodes.begin(), T.nodes.end());  // node order is a topological order
    T.tile_dim_limit = std::min(T.tile_dim_limit, A.tile_dim_limit);
    A.nodes.clear();
  }

  void start(int32_t ni) {
    const Node& n = g.nodes[static_cast<size_t>(ni)];
    const FusionInfo& fi = info[static_cast<size_t>(ni)];
    Region R;
    R.kind = fi.cls == OpClass::matmul    ? RegionKind::matmul_epilogue
             : fi.cls == OpClass::rowwise ? RegionKind::rowwise
                                          : RegionKind::elementwise;
    R.domain = fi.cls == OpClass::rowwise ? g.meta(n.inputs[0]).shape : g.meta(n.outputs[0]).shape;
    R.tile_dim_limit = fi.tile_limit;
    R.nodes.push_back(ni);
    g.nodes[static_cast<size_t>(ni)].region = static_cast<int32_t>(g.regions.size());
    g.regions.push_back(std::move(R));
  }
};

}  // namespace

int fuse(Graph& g) {
  g.regions.clear();
  for (Node& n : g.nodes) n.region = -1;
  Builder b{g, {}};
  b.info.resize(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) b.info[i] = classify(g, g.nodes[i]);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const FusionInfo& fi = b.info[i];
    if (n.dead || fi.cls == OpClass::other) continue;
    int32_t target = -1;
    for (ValueId in : n.inputs) {
      const Node* p = g.producer(in);
      if (!p || p->region < 0) continue;
      if (b.can_join(static_cast<int32_t>(i), p->region)) {
        target = p->region;
        break;
      }
    }
    if (target < 0) {
      b.start(static_cast<int32_t>(i));
      continue;
    }
    b.join(static_cast<int32_t>(i), target);
    // A node that combines two chains (an optimizer's update of a parameter from its moment
    // estimates, say) also pulls its other producers' regions in, so they run as one pass.
    for (ValueId in : n.inputs) {
      const Node* p = g.producer(in);
      if (!p || p->region < 0 || p->region == target) continue;
      if (b.can_merge(p->region, target)) b.merge(p->region, target);
    }
  }
  // Dissolve single-node regions, renumber, and compute region inputs/outputs.
  std::vector<Region> kept;
  std::vector<int32_t> remap(g.regions.size(), -1);
  for (size_t r = 0; r < g.regions.size(); ++r) {
    if (g.regions[r].nodes.size() < 2) continue;
    remap[r] = static_cast<int32_t>(kept.size());
    kept.push_back(std::move(g.regions[r]));
  }
  for (Node& n : g.nodes)
    if (n.region >= 0) n.region = remap[static_cast<size_t>(n.region)];
  g.regions = std::move(kept);
  std::vector<char> is_graph_out(g.values.size(), 0);
  for (ValueId o : g.outputs) is_graph_out[static_cast<size_t>(o)] = 1;
  for (size_t r = 0; r < g.regions.size(); ++r) {
    Region& R = g.regions[r];
    std::vector<char> inside(g.values.size(), 0);
    for (int32_t ni : R.nodes)
      for (ValueId o : g.nodes[static_cast<size_t>(ni)].outputs) inside[static_cast<size_t>(o)] = 1;
    std::vector<char> used_outside(g.values.size(), 0);
    for (const Node& n : g.nodes) {
      if (n.dead || n.region == static_cast<int32_t>(r)) continue;
      for (ValueId in : n.inputs) used_outside[static_cast<size_t>(in)] = 1;
    }
    for (int32_t ni : R.nodes) {
      const Node& n = g.nodes[static_cast<size_t>(ni)];
      for (ValueId in : n.inputs)
        if (!inside[static_cast<size_t>(in)] && std::find(R.inputs.begin(), R.inputs.end(), in) == R.inputs.end())
          R.inputs.push_back(in);
      for (ValueId o : n.outputs)
        if (used_outside[static_cast<size_t>(o)] || is_graph_out[static_cast<size_t>(o)]) R.outputs.push_back(o);
    }
  }
  int fused = 0;
  for (const Region& R : g.regions) fused += static_cast<int>(R.nodes.size());
  return fused;
}

}  // namespace tpu::graph
