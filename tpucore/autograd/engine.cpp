// The backward pass: collects the nodes reachable from the roots, runs them in reverse
// topological order (a node runs once every consumer of its outputs has passed its gradient),
// reduces and casts each input gradient to its input's shape and dtype, and accumulates the
// leaves' gradients.
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "ops/meta_util.h"
#include "tpucore/autograd/capture.h"
#include "tpucore/autograd/node.h"
#include "tpucore/defer.h"
#include "tpucore/ops.h"

namespace tpu {
namespace autograd {
namespace detail {

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int lead = g.dim() - shape.ndim();
  TPU_CHECK(lead >= 0, "internal: autograd: a gradient of shape {} cannot be reduced to shape {}", g.shape().str(),
            shape.str());
  Dims dims;
  for (int i = 0; i < lead; ++i) dims.push_back(i);
  for (int i = 0; i < shape.ndim(); ++i)
    if (shape[i] == 1 && g.shape()[lead + i] != 1) dims.push_back(lead + i);
  Tensor r = dims.empty() ? g : sum(g, dims, true);
  return reshape(r, shape);
}

}  // namespace detail

namespace {

bool floating_out(DType t) { return is_floating(t); }

std::shared_ptr<AutogradMeta> new_meta(const Tensor& t) {
  auto m = std::make_shared<AutogradMeta>();
  m->owner = t.impl_ptr();
  t.impl().autograd = m;
  return m;
}

Tensor unpack(const SavedTensor& s, const Node& node, const std::shared_ptr<Node>& self, bool create_graph, size_t idx) {
  if (!s.data.defined()) return {};
  const uint64_t now = detail::data_version(s.data);
  if (now != s.version)
    fail("backward: {} {} ({}) saved by '{}' for its backward was modified by an in-place operation after it was "
         "saved (version {}, now {}); clone() it before modifying it in place, or compute out of place",
         s.is_output ? "output" : "input", idx, ops::describe(s.data), node.name(), s.version, now);
  if (!create_graph) return s.data;
  // Double backward: the saved tensor takes part in the new graph with its history.
  Tensor t = detail::alias(s.data);
  if (s.is_output && floating_out(t.dtype())) {
    auto m = std::make_shared<AutogradMeta>();
    m->grad_fn = self;
    m->output_nr = s.output_nr;
    t.impl().autograd = std::move(m);
    t.impl().requires_grad = true;
  } else if (s.input_meta) {
    t.impl().autograd = s.input_meta;
    t.impl().requires_grad = true;
  }
  return t;
}

struct Target {  // inputs of autograd::grad
  std::unordered_map<const AutogradMeta*, size_t> leaves;
  std::unordered_map<const Node*, std::vector<std::pair<int, size_t>>> nodes;
  std::vector<Tensor>* out = nullptr;
};

void add_into(Tensor& acc, Tensor g) {
  acc = acc.defined() ? add(acc, g) : std::move(g);
}

void accumulate_leaf(const std::shared_ptr<AutogradMeta>& leaf, Tensor g, bool create_graph) {
  detail::touch_grad(leaf, true);
  AutogradMeta& m = *leaf;
  if (!m.grad.defined()) {
    if (g.is_proxy() && !create_graph) {
      g = clone(g.detach());  // a traced gradient gets its own tensor (free once the graph is optimized)
    } else if (!create_graph) {
      // Own the gradient: a contiguous tensor nobody else holds (so in-place updates of .grad()
      // never write into another leaf's gradient or into the caller's tensor).
      if (!g.is_contiguous() || (g.storage() && g.storage().use_count() > 1) || g.requires_grad()) g = clone(g.detach());
    }
    m.grad = std::move(g);
  } else if (create_graph) {
    m.grad = add(m.grad, g);
  } else {
    NoGradGuard ng;
    if (m.grad.requires_grad()) m.grad = add(m.grad.detach(), g);
    else m.grad.add_(g);
  }
}

void run(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads_in, bool retain_graph, bool create_graph,
         Target* target) {
  TPU_CHECK(grads_in.empty() || grads_in.size() == roots.size(),
            "backward: {} gradient(s) given for {} tensor(s)", grads_in.size(), roots.size());
  std::vector<Edge> root_edges;
  std::vector<Tensor> root_grads;
  for (size_t r = 0; r < roots.size(); ++r) {
    const Tensor& t = roots[r];
    TPU_CHECK(t.defined(), "backward: tensor {} is undefined", r);
    if (!t.requires_grad()) {
      const auto& m = t.impl().autograd;
      if (m && !m->nondiff_op.empty())
        fail("backward: the tensor ({}) was computed by '{}', which is not differentiable, so no gradient flows "
             "through it",
             ops::describe(t), m->nondiff_op);
      fail("backward: the tensor ({}) does not require grad and has no history; call requires_grad_() on the "
           "tensors to differentiate with respect to before computing it (and not under tpu::NoGradGuard)",
           ops::describe(t));
    }
    Tensor g = grads_in.empty() ? Tensor() : grads_in[r];
    if (!g.defined()) {
      TPU_CHECK(t.numel() == 1,
                "backward: a gradient can be implied only for a tensor with one element, got {}; pass a gradient of "
                "shape {}",
                ops::describe(t), t.shape().str());
      g = ones_like(t);
    } else {
      TPU_CHECK(g.shape() == t.shape(), "backward: the gradient ({}) does not match the tensor's shape {}",
                ops::describe(g), t.shape().str());
      TPU_CHECK(g.device() == t.device(), "backward: the gradient is on {} but the tensor on {}", g.device().str(),
                t.device().str());
      if (g.dtype() != t.dtype()) g = g.to(t.dtype());
    }
    const auto& m = t.impl().autograd;
    root_edges.push_back(m && m->grad_fn ? Edge{m->grad_fn, m->output_nr, nullptr}
                                         : Edge{nullptr, 0, m ? m : new_meta(t)});
    root_grads.push_back(g);
  }

  // Collect the graph and count, for each node, the edges that feed it a gradient.
  std::unordered_map<Node*, int> deps;
  std::unordered_map<const AutogradMeta*, int> leaf_edges;  // leaves with post-accumulate hooks
  auto count_leaf = [&](const Edge& e) {
    if (!e.node && e.leaf && !e.leaf->post_accumulate_hooks.empty()) ++leaf_edges[e.leaf.get()];
  };
  std::vector<std::shared_ptr<Node>> keep;
  std::vector<Node*> stack;
  for (const Edge& e : root_edges) {
    count_leaf(e);
    if (e.node && deps.emplace(e.node.get(), 0).second) {
      keep.push_back(e.node);
      stack.push_back(e.node.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      count_leaf(e);
      if (!e.node) continue;
      auto [it, fresh] = deps.emplace(e.node.get(), 0);
      ++it->second;
      if (fresh) {
        keep.push_back(e.node);
        stack.push_back(e.node.get());
      }
    }
  }

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  auto deliver = [&](const Edge& e, Tensor g) {
    if (e.node) {
      auto& b = buffers[e.node.get()];
      if (b.empty()) b.resize(e.node->output_meta.size());
      add_into(b[static_cast<size_t>(e.output_nr)], std::move(g));
    } else if (e.leaf) {
      if (target) {
        auto it = target->leaves.find(e.leaf.get());
        if (it != target->leaves.end()) add_into((*target->out)[it->second], std::move(g));
      } else {
        accumulate_leaf(e.leaf, std::move(g), create_graph);
        auto it = leaf_edges.find(e.leaf.get());
        if (it != leaf_edges.end() && --it->second == 0) {
          auto hooks = e.leaf->post_accumulate_hooks;  // a hook may remove hooks
          for (auto& [id, fn] : hooks) fn(e.leaf->grad);
        }
      }
    }
  };
  {
    GradModeGuard gm(create_graph);
    for (size_t r = 0; r < root_edges.size(); ++r) deliver(root_edges[r], root_grads[r]);
  }

  auto later = [](const Node* a, const Node* b) { return a->seq < b->seq; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later)> ready(later);
  for (auto& [n, d] : deps)
    if (d == 0) ready.push(n);
  std::unordered_map<Node*, std::shared_ptr<Node>> owner;
  for (auto& k : keep) owner[k.get()] = k;

  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> gout = std::move(buffers[n]);
    buffers.erase(n);
    gout.resize(n->output_meta.size());
    bool any = false;
    for (const Tensor& g : gout) any |= g.defined();
    if (target) {
      if (auto it = target->nodes.find(n); it != target->nodes.end())
        for (auto [nr, idx] : it->second) add_into((*target->out)[idx], gout[static_cast<size_t>(nr)]);
    }
    for (size_t i = 0; i < n->retained.size(); ++i)
      if (auto m = n->retained[i].lock(); m && gout[i].defined() && !target) {
        GradModeGuard gm(create_graph);
        m->grad = m->grad.defined() ? add(m->grad, gout[i]) : (create_graph ? gout[i] : gout[i].detach());
      }
    if (any) {
      TPU_CHECK(n->op && (n->op->backward.fn || n->custom), "backward: op '{}' has no derivative formula", n->name());
      if (n->freed && n->saved_any)
        fail("backward: trying to backward through '{}' a second time, but its saved tensors were freed by the "
             "first backward; pass retain_graph=true to the first backward (or compute the forward again)",
             n->name());
      for (size_t i = 0; i < gout.size(); ++i)
        if (!gout[i].defined() && floating_out(n->output_meta[i].dtype))
          gout[i] = zeros(n->output_meta[i].shape, TensorOptions(n->output_meta[i].dtype, n->output_meta[i].device));
      const std::shared_ptr<Node>& self = owner[n];
      std::vector<Tensor> ins(n->saved_inputs.size()), outs(n->saved_outputs.size());
      for (size_t i = 0; i < ins.size(); ++i) ins[i] = unpack(n->saved_inputs[i], *n, self, create_graph, i);
      for (size_t i = 0; i < outs.size(); ++i) outs[i] = unpack(n->saved_outputs[i], *n, self, create_graph, i);
      std::vector<Tensor> gin(n->next.size());
      {
        GradModeGuard gm(create_graph);
        ops::BackwardArgs args{*n->op, n->attrs, n->input_meta, ins, outs, gout, n->needs};
        if (n->custom) n->custom(args, gin);
        else n->op->backward.fn(args, gin);
        for (size_t i = 0; i < gin.size(); ++i) {
          if (!gin[i].defined() || !n->next[i].valid()) continue;
          const ops::TensorMeta& im = n->input_meta[i];
          Tensor g = std::move(gin[i]);
          if (g.shape() != im.shape) g = detail::sum_to(g, im.shape);
          if (g.dtype() != im.dtype) g = g.to(im.dtype);
          if (g.device() != im.device) g = g.to(im.device);
          deliver(n->next[i], std::move(g));
        }
      }
      if (!retain_graph) {
        n->saved_inputs.assign(n->saved_inputs.size(), SavedTensor{});
        n->saved_outputs.assign(n->saved_outputs.size(), SavedTensor{});
        n->custom = nullptr;
        n->freed = true;
      }
    }
    for (const Edge& e : n->next)
      if (e.node && --deps[e.node.get()] == 0) ready.push(e.node.get());
  }
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph, bool create_graph) {
  TPU_CHECK(!roots.empty(), "backward: no tensors given");
  // Deferred eager mode (tpucore/defer.h): the pending recording is flushed and the backward runs
  // eagerly. Recorded, its many small ops cost more to record and flush than their fusion saved
  // on the training step (bench_defer: SGD 0.96x -> 0.98x of plain eager, AdamW about even).
  EagerIfDeferred eager;
  run(roots, grads, retain_graph || create_graph, create_graph, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grads, bool retain_graph, bool create_graph, bool allow_unused) {
  TPU_CHECK(!roots.empty(), "autograd::grad: no output tensors given");
  Target target;
  std::vector<Tensor> out(inputs.size());
  target.out = &out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    TPU_CHECK(t.defined() && t.requires_grad(), "autograd::grad: input {} ({}) does not require grad", i,
              t.defined() ? ops::describe(t) : std::string("undefined"));
    auto& m = t.impl().autograd;
    if (!m) new_meta(t);
    if (m->grad_fn) target.nodes[m->grad_fn.get()].emplace_back(m->output_nr, i);
    else target.leaves[m.get()] = i;
  }
  run(roots, grads, retain_graph || create_graph, create_graph, &target);
  for (size_t i = 0; i < out.size(); ++i) {
    TPU_CHECK(out[i].defined() || allow_unused,
              "autograd::grad: input {} ({}) was not used to compute the outputs; pass allow_unused=true to get an "
              "undefined gradient for it",
              i, ops::describe(inputs[i]));
    if (out[i].defined() && !create_graph) out[i] = out[i].detach();
  }
  return out;
}

}  // namespace autograd
}  // namespace tpu
