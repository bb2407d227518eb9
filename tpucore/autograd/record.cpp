// Recording: the post-call hook that gives each differentiable op call a node, the in-place
// hook that keeps in-place writes from corrupting gradients, grad mode, and the Tensor methods
// of autograd.
#include <atomic>

#include "graph/tracer.h"
#include "ops/meta_util.h"
#include "tpucore/autograd/capture.h"
#include "tpucore/autograd/node.h"
#include "tpucore/core/hooks.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {

thread_local bool t_grad_enabled = true;
std::atomic<uint64_t> g_node_seq{0};

bool floating_out(DType t) { return is_floating(t); }

std::shared_ptr<AutogradMeta>& meta_of(const Tensor& t) {
  auto& m = t.impl().autograd;
  if (!m) {
    m = std::make_shared<AutogradMeta>();
    m->owner = t.impl_ptr();
  }
  return m;
}

Edge edge_of(const Tensor& t) {
  const auto& m = meta_of(t);
  if (m->grad_fn) return Edge{m->grad_fn, m->output_nr, nullptr};
  return Edge{nullptr, 0, m};
}

SavedTensor save(const Tensor& t, bool is_output, int nr) {
  SavedTensor s;
  s.data = autograd::detail::alias(t);
  s.version = autograd::detail::data_version(t);
  s.is_output = is_output;
  s.output_nr = nr;
  if (!is_output && t.impl().requires_grad) s.input_meta = t.impl().autograd;
  return s;
}

void record(const ops::OpDef& op, std::span<const Tensor> inputs, const ops::Attrs& attrs, std::span<Tensor> outputs) {
  if (!t_grad_enabled) return;
  uint32_t needs = 0;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].impl().requires_grad) needs |= 1u << (i < 31 ? i : 31);
  if (!needs) return;
  // An output that is one of the inputs (no new tensor) must not take over the input's history.
  for (auto& o : outputs)
    for (const Tensor& in : inputs)
      if (o.is_same(in)) o = autograd::detail::alias(in);
  if (op.has(ops::kNonDifferentiable)) {
    for (auto& o : outputs) meta_of(o)->nondiff_op = op.name;
    return;
  }
  auto node = std::make_shared<Node>();
  node->op = &op;
  node->attrs = attrs;
  node->needs = needs;
  node->seq = ++g_node_seq;
  uint32_t save_in = op.backward.save_inputs, save_out = op.backward.save_outputs;
  if (op.backward.saves) op.backward.saves(needs, save_in, save_out);
  node->input_meta.reserve(inputs.size());
  node->next.resize(inputs.size());
  node->saved_inputs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    node->input_meta.push_back({t.shape(), t.dtype(), t.device()});
    if (t.impl().requires_grad) node->next[i] = edge_of(t);
    if ((save_in >> (i < 31 ? i : 31)) & 1u) {
      node->saved_inputs[i] = save(t, false, 0);
      node->saved_any = true;
    }
  }
  node->saved_outputs.resize(outputs.size());
  node->retained.resize(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& o = outputs[i];
    node->output_meta.push_back({o.shape(), o.dtype(), o.device()});
    if (floating_out(o.dtype())) {
      auto m = std::make_shared<AutogradMeta>();
      m->grad_fn = node;
      m->output_nr = static_cast<int>(i);
      m->is_view = op.has(ops::kView);
      o.impl().autograd = std::move(m);
      o.impl().requires_grad = true;
    }
    if ((save_out >> i) & 1u) {
      node->saved_outputs[i] = save(o, true, static_cast<int>(i));
      node->saved_any = true;
    }
  }
}

bool on_inplace(const char* name, const ops::OpDef* op, Tensor& self, std::span<const Tensor> inputs,
                const ops::Attrs& attrs) {
  if (!t_grad_enabled || !self.defined()) return false;
  const bool self_req = self.impl().requires_grad;
  bool other_req = false;
  for (size_t i = op ? 1 : 0; i < inputs.size(); ++i) other_req |= inputs[i].defined() && inputs[i].impl().requires_grad;
  if (!self_req && !other_req) return false;
  if (self_req && self.is_leaf())
    fail("{}: a leaf tensor that requires grad ({}) cannot be modified in place while grad mode is on; "
         "do it under tpu::NoGradGuard, or use the out-of-place form",
         name, ops::describe(self));
  if (!self_req)
    fail("{}: self ({}) does not require grad but the value written into it does; autograd does not record an "
         "in-place write that starts a history (self may be a view of another tensor); use the out-of-place form "
         "(e.g. tpu::add, tpu::cat, tpu::where)",
         name, ops::describe(self));
  if (self.impl().autograd->is_view)
    fail("{}: self ({}) is a view of a tensor that requires grad; autograd does not support in-place writes "
         "into views; clone() it first or use the out-of-place form",
         name, ops::describe(self));
  // Record the out-of-place op on an alias that keeps self's current history, write the result
  // into self's storage, and give self the new history.
  Tensor old = autograd::detail::alias(self);
  old.impl().autograd = self.impl().autograd;
  old.impl().requires_grad = true;
  Tensor result;
  if (op) {
    std::vector<Tensor> ins(inputs.begin(), inputs.end());
    ins[0] = old;
    Tensor outs[ops::kMaxOutputs];
    ops::call(*op, ins, attrs, outs);
    result = outs[0];
  } else if (!inputs.empty()) {  // copy_
    const Tensor& src = inputs[0];
    TPU_CHECK(src.device() == self.device(),
              "{}: copying a tensor that requires grad across devices ({} -> {}) is not recorded by autograd", name,
              src.device().str(), self.device().str());
    result = expand(src, self.shape());
  } else {  // fill_: the new value has no history
    result = full(self.shape(), attrs.get_scalar("value"), TensorOptions(self.dtype(), self.device()));
  }
  if (result.dtype() != self.dtype()) result = result.to(self.dtype());
  {
    NoGradGuard ng;
    copy_(self, result);
  }
  if (result.impl().requires_grad) {
    self.impl().autograd = result.impl().autograd;
  } else {
    self.impl().autograd = nullptr;
    self.impl().requires_grad = false;
  }
  return true;
}

// to(device): not an op of the registry (a driver copy); its node's formula passes the gradient
// through, and the engine moves it back to the input's device.
void device_copy_bw(const ops::BackwardArgs& a, std::span<Tensor> g) { g[0] = a.grad_outputs[0]; }
const ops::OpDef& device_copy_def() {
  static const ops::OpDef d = [] {
    ops::OpDef o;
    o.name = "to_device";
    o.backward.fn = &device_copy_bw;
    return o;
  }();
  return d;
}

void record_device_copy(const Tensor& src, Tensor& dst) {
  if (!t_grad_enabled || !src.impl().requires_grad) return;
  auto node = std::make_shared<Node>();
  node->op = &device_copy_def();
  node->needs = 1;
  node->seq = ++g_node_seq;
  node->input_meta.push_back({src.shape(), src.dtype(), src.device()});
  node->next.push_back(edge_of(src));
  node->saved_inputs.resize(1);
  node->saved_outputs.resize(1);
  node->retained.resize(1);
  node->output_meta.push_back({dst.shape(), dst.dtype(), dst.device()});
  auto m = std::make_shared<AutogradMeta>();
  m->grad_fn = node;
  dst.impl().autograd = std::move(m);
  dst.impl().requires_grad = true;
}

[[maybe_unused]] const bool g_hooks_installed = [] {
  ops::set_post_call_hook(&record);
  ops::set_inplace_hook(&on_inplace);
  detail::set_device_copy_hook(&record_device_copy);
  return true;
}();

}  // namespace

bool is_grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool on) { t_grad_enabled = on; }

namespace autograd::detail {
uint64_t data_version(const Tensor& t) {
  if (t.storage()) {
    uint64_t v = t.storage()->version;
    if (auto* tr = dynamic_cast<graph::Tracer*>(ops::interceptor())) v += tr->real_version(t);  // traced writes
    return v;
  }
  return t.impl().trace ? t.impl().trace->version : 0;
}

uint64_t next_node_seq() { return ++g_node_seq; }

Tensor alias(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>(t.impl());
  impl->autograd = nullptr;
  impl->requires_grad = false;
  if (impl->trace && impl->trace->tracer && ops::interceptor() == impl->trace->tracer)
    impl->trace->tracer->add_alias(impl);  // filled in place with the original at a graph break
  return Tensor(std::move(impl));
}
}  // namespace autograd::detail

namespace autograd {
std::string grad_fn_name(const Tensor& t) {
  const auto& m = t.impl().autograd;
  return m && m->grad_fn ? m->grad_fn->name() : std::string();
}
}  // namespace autograd

Tensor& Tensor::requires_grad_(bool on) {
  if (on) {
    TPU_CHECK(is_floating(dtype()), "requires_grad_: only floating point tensors can require gradients, got {}",
              ops::describe(*this));
  } else {
    TPU_CHECK(is_leaf(), "requires_grad_(false): the tensor ({}) was computed by '{}' and is not a leaf; use detach()",
              ops::describe(*this), autograd::grad_fn_name(*this));
  }
  impl().requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const {
  const auto& m = impl().autograd;
  return !m || !m->grad_fn;
}

Tensor Tensor::grad() const {
  const auto& m = impl().autograd;
  if (m) autograd::detail::touch_grad(m, true);
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  if (g.defined())
    TPU_CHECK(g.shape() == shape() && g.device() == device(),
              "set_grad: the gradient ({}) must have the shape and device of the tensor ({})", ops::describe(g),
              ops::describe(*this));
  const auto& m = meta_of(*this);
  autograd::detail::touch_grad(m, false);
  m->grad = g;
}

void Tensor::zero_grad() {
  const auto& m = impl().autograd;
  if (m) autograd::detail::touch_grad(m, true);
  if (!m || !m->grad.defined()) return;
  NoGradGuard ng;
  m->grad.zero_();
}

void Tensor::retain_grad() const {
  TPU_CHECK(requires_grad(), "retain_grad: the tensor ({}) does not require grad", ops::describe(*this));
  if (is_leaf()) return;  // leaves keep their gradient anyway
  auto& m = impl().autograd;
  m->retains_grad = true;
  m->grad_fn->retained[static_cast<size_t>(m->output_nr)] = m;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph, create_graph);
}

Tensor Tensor::detach() const { return autograd::detail::alias(*this); }

}  // namespace tpu
