// Post-accumulate-grad hooks on leaves (the engine calls them, engine.cpp) and the reachability
// of leaves from a root's recorded graph.
#include <algorithm>
#include <atomic>
#include <unordered_set>

#include "ops/meta_util.h"
#include "tpucore/autograd/node.h"
#include "tpucore/ops.h"

namespace tpu::autograd {

namespace {
std::atomic<int> g_next_hook{1};
}

int register_post_accumulate_grad_hook(const Tensor& leaf, std::function<void(const Tensor&)> fn) {
  TPU_CHECK(leaf.defined(), "register_post_accumulate_grad_hook: the tensor is undefined");
  TPU_CHECK(leaf.requires_grad() && leaf.is_leaf(),
            "register_post_accumulate_grad_hook: the tensor ({}) must be a leaf that requires grad",
            ops::describe(leaf));
  TPU_CHECK(static_cast<bool>(fn), "register_post_accumulate_grad_hook: the hook is empty");
  auto& m = leaf.impl().autograd;
  if (!m) {
    m = std::make_shared<AutogradMeta>();
    m->owner = leaf.impl_ptr();
  }
  const int id = g_next_hook++;
  m->post_accumulate_hooks.emplace_back(id, std::move(fn));
  return id;
}

void remove_post_accumulate_grad_hook(const Tensor& leaf, int id) {
  if (!leaf.defined() || !leaf.impl().autograd) return;
  auto& hooks = leaf.impl().autograd->post_accumulate_hooks;
  hooks.erase(std::remove_if(hooks.begin(), hooks.end(), [&](const auto& h) { return h.first == id; }), hooks.end());
}

std::vector<bool> reachable_leaves(const Tensor& root, const std::vector<Tensor>& leaves) {
  std::unordered_set<const AutogradMeta*> found;
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> stack;
  if (root.defined() && root.impl().autograd) {
    const auto& m = root.impl().autograd;
    if (m->grad_fn) stack.push_back(m->grad_fn.get());
    else found.insert(m.get());
  }
  while (!stack.empty()) {  // every node is visited once
    const Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    for (const Edge& e : n->next) {
      if (e.node) stack.push_back(e.node.get());
      else if (e.leaf) found.insert(e.leaf.get());
    }
  }
  std::vector<bool> r;
  for (const Tensor& t : leaves) r.push_back(t.defined() && t.impl().autograd && found.count(t.impl().autograd.get()));
  return r;
}

}  // namespace tpu::autograd
