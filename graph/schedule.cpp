#include "graph/schedule.h"

#include <queue>
#include <utility>

#include "graph/async_ops.h"

namespace tpu::graph {

std::vector<Step> schedule(const Graph& g) {
  // Step per region and per standalone live node.
  std::vector<Step> steps;
  std::vector<int32_t> step_of_node(g.nodes.size(), -1);
  std::vector<int32_t> step_of_region(g.regions.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.dead) continue;
    if (n.region >= 0) {
      int32_t& s = step_of_region[static_cast<size_t>(n.region)];
      if (s < 0) {
        s = static_cast<int32_t>(steps.size());
        steps.push_back({n.region, -1});
      }
      step_of_node[i] = s;
    } else {
      step_of_node[i] = static_cast<int32_t>(steps.size());
      steps.push_back({-1, static_cast<int32_t>(i)});
    }
  }
  // Edges between steps; Kahn's algorithm keeps the original order where it can.
  std::vector<std::vector<int32_t>> succ(steps.size());
  std::vector<int32_t> indeg(steps.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.dead) continue;
    const int32_t s = step_of_node[i];
    for (ValueId in : n.inputs) {
      const Value& v = g.value(in);
      if (v.kind != ValueKind::node) continue;
      const int32_t p = step_of_node[static_cast<size_t>(v.producer)];
      if (p == s || p < 0) continue;
      succ[static_cast<size_t>(p)].push_back(s);
      ++indeg[static_cast<size_t>(s)];
    }
  }
  // Priority among ready steps (then the original order): asynchronous nodes (collectives)
  // first, as soon as their inputs are ready, and before other work the steps that feed them;
  // steps that read their results (other than views) as late as the rest of the work allows,
  // so the work in between overlaps them.
  enum : int32_t { kAsync = 0, kFeedsAsync = 1, kOther = 2, kReadsAsync = 3 };
  std::vector<int32_t> prio(steps.size(), kOther);
  std::vector<char> async_value(g.values.size(), 0);
  std::vector<int32_t> todo;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (is_async(g.nodes[i])) {
      prio[static_cast<size_t>(step_of_node[i])] = kAsync;
      todo.push_back(step_of_node[i]);
      for (ValueId o : g.nodes[i].outputs) async_value[static_cast<size_t>(o)] = 1;
    }
  if (!todo.empty()) {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      if (n.dead || n.op->has(ops::kView) || prio[static_cast<size_t>(step_of_node[i])] == kAsync) continue;
      for (ValueId in : n.inputs)
        if (async_value[static_cast<size_t>(alias_root(g, in))]) prio[static_cast<size_t>(step_of_node[i])] = kReadsAsync;
    }
    std::vector<std::vector<int32_t>> pred(steps.size());
    for (size_t s = 0; s < steps.size(); ++s)
      for (int32_t t : succ[s]) pred[static_cast<size_t>(t)].push_back(static_cast<int32_t>(s));
    std::vector<char> seen(steps.size(), 0);
    while (!todo.empty()) {
      const int32_t s = todo.back();
      todo.pop_back();
      for (int32_t p : pred[static_cast<size_t>(s)]) {
        if (seen[static_cast<size_t>(p)]) continue;
        seen[static_cast<size_t>(p)] = 1;
        if (prio[static_cast<size_t>(p)] == kOther) prio[static_cast<size_t>(p)] = kFeedsAsync;
        todo.push_back(p);
      }
    }
  }
  using Key = std::pair<int32_t, int32_t>;  // (priority, step)
  std::priority_queue<Key, std::vector<Key>, std::greater<>> ready;
  for (size_t s = 0; s < steps.size(); ++s)
    if (indeg[s] == 0) ready.push({prio[s], static_cast<int32_t>(s)});
  std::vector<Step> order;
  order.reserve(steps.size());
  while (!ready.empty()) {
    int32_t s = ready.top().second;
    ready.pop();
    order.push_back(steps[static_cast<size_t>(s)]);
    for (int32_t t : succ[static_cast<size_t>(s)])
      if (--indeg[static_cast<size_t>(t)] == 0) ready.push({prio[static_cast<size_t>(t)], t});
  }
  TPU_CHECK(order.size() == steps.size(), "internal: graph schedule: the fused regions form a cycle");
  return order;
}

ValueId alias_root(const Graph& g, ValueId v) {
  while (true) {
    const Node* p = g.producer(v);
    if (!p || !p->op->has(ops::kView) || p->inputs.empty()) return v;
    v = p->inputs[0];
  }
}

}  // namespace tpu::graph
