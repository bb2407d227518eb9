#include "tpucore/nn/parallel/function.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tpucore/autograd.h"
#include "tpucore/autograd/node.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu::nn::parallel::detail {
namespace {

// One OpDef per function name: the node's name; its backward is the node's closure.
const ops::OpDef& op_named(const char* name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<ops::OpDef>> defs;
  std::lock_guard<std::mutex> lock(mu);
  auto& d = defs[name];
  if (!d) {
    d = std::make_unique<ops::OpDef>();
    d->name = name;
  }
  return *d;
}

Edge edge_of(const Tensor& t) {
  auto& m = t.impl().autograd;
  if (!m) {
    m = std::make_shared<AutogradMeta>();
    m->owner = t.impl_ptr();
  }
  if (m->grad_fn) return Edge{m->grad_fn, m->output_nr, nullptr};
  return Edge{nullptr, 0, m};
}

}  // namespace

Tensor fresh_alias(const Tensor& t) { return autograd::detail::alias(t); }

void attach_backward(const char* name, std::span<const Tensor> inputs, std::span<Tensor> outputs, CustomBackward fn,
                     bool traceable) {
  for (const Tensor& t : inputs)
    TPU_CHECK(traceable || !t.is_proxy(), "{}: sharded layers run eagerly; they are not supported inside tpu::compile", name);
  if (!is_grad_enabled()) return;
  uint32_t needs = 0;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].requires_grad()) needs |= 1u << (i < 31 ? i : 31);
  if (!needs) return;
  auto node = std::make_shared<Node>();
  node->op = &op_named(name);
  node->needs = needs;
  node->seq = autograd::detail::next_node_seq();
  node->next.resize(inputs.size());
  node->saved_inputs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    node->input_meta.push_back({t.shape(), t.dtype(), t.device()});
    if (t.requires_grad()) node->next[i] = edge_of(t);
  }
  node->saved_outputs.resize(outputs.size());
  node->retained.resize(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& o = outputs[i];
    for (const Tensor& in : inputs)
      TPU_CHECK(!o.is_same(in), "internal: {}: an output is one of the inputs", name);
    node->output_meta.push_back({o.shape(), o.dtype(), o.device()});
    if (is_floating(o.dtype())) {
      auto m = std::make_shared<AutogradMeta>();
      m->grad_fn = node;
      m->output_nr = static_cast<int>(i);
      m->owner = o.impl_ptr();
      o.impl().autograd = std::move(m);
      o.impl().requires_grad = true;
    }
  }
  node->saved_any = true;  // a second backward without retain_graph is an error, as for ops
  node->custom = [f = std::move(fn)](const ops::BackwardArgs& a, std::span<Tensor> gin) { f(a.grad_outputs, gin); };
}

bool recording() { return ops::interceptor() != nullptr; }

Tensor collective_buffer(const Shape& shape, TensorOptions o) { return recording() ? zeros(shape, o) : empty(shape, o); }

}  // namespace tpu::nn::parallel::detail
