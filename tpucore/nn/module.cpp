#include "tpucore/nn/module.h"

#include <functional>
#include <set>

#include "tpucore/autograd.h"
#include "tpucore/nn/quantized.h"
#include "tpucore/ops.h"

namespace tpu::nn {

namespace detail {
struct HookTable {
  struct Post {
    uint64_t id;
    ForwardHook fn;
    bool always;
  };
  uint64_t next = 1;
  std::vector<std::pair<uint64_t, ForwardPreHook>> pre;
  std::vector<Post> post;
};
}  // namespace detail

namespace {
thread_local std::optional<DType> g_skip_init;
}

SkipInitGuard::SkipInitGuard(DType dtype) : previous_(g_skip_init) { g_skip_init = dtype; }
SkipInitGuard::~SkipInitGuard() { g_skip_init = previous_; }
std::optional<DType> SkipInitGuard::active() { return g_skip_init; }

void HookHandle::remove() {
  if (auto t = table_.lock()) {
    std::erase_if(t->pre, [&](const auto& h) { return h.first == id_; });
    std::erase_if(t->post, [&](const auto& h) { return h.id == id_; });
  }
  table_.reset();
}

Module::Module() : hooks_(std::make_shared<detail::HookTable>()) {}
Module::~Module() = default;

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  TPU_CHECK(hook != nullptr, "{}: register_forward_pre_hook got an empty function", type_name());
  const uint64_t id = hooks_->next++;
  hooks_->pre.emplace_back(id, std::move(hook));
  return HookHandle(hooks_, id);
}

HookHandle Module::register_forward_hook(ForwardHook hook, bool always_call) {
  TPU_CHECK(hook != nullptr, "{}: register_forward_hook got an empty function", type_name());
  const uint64_t id = hooks_->next++;
  hooks_->post.push_back({id, std::move(hook), always_call});
  return HookHandle(hooks_, id);
}

bool Module::has_forward_hooks() const { return !hooks_->pre.empty() || !hooks_->post.empty(); }

Tensor Module::operator()(const Tensor& x) {
  if (!has_forward_hooks()) return forward(x);
  return call({x}, [this](std::span<const Tensor> in) { return forward(in[0]); });
}

Tensor Module::call(std::vector<Tensor> inputs, const std::function<Tensor(std::span<const Tensor>)>& body) {
  if (!has_forward_hooks()) return body(inputs);
  // Copies: a hook may add or remove hooks (of this module too) while they run.
  auto pre = hooks_->pre;
  auto post = hooks_->post;
  Tensor out;
  try {
    for (auto& [id, h] : pre) h(*this, inputs);
    out = body(inputs);
  } catch (...) {
    out = Tensor();
    for (auto& h : post)
      if (h.always) h.fn(*this, inputs, out);
    throw;
  }
  for (size_t i = 0; i < post.size(); ++i) {
    try {
      post[i].fn(*this, inputs, out);
    } catch (...) {
      Tensor none;
      for (size_t j = i + 1; j < post.size(); ++j)
        if (post[j].always) post[j].fn(*this, inputs, none);
      throw;
    }
  }
  return out;
}

Tensor Module::forward(const Tensor&) {
  fail("{}: this module has no single-tensor forward(x); call its own forward", type_name());
}

void Module::check_name(const std::string& name) const {
  TPU_CHECK(!name.empty() && name.find('.') == std::string::npos,
            "{}: invalid member name '{}' (must be non-empty and contain no '.')", type_name(), name);
  auto taken = [&](const auto& v) {
    for (const auto& [n, _] : v)
      if (n == name) return true;
    return false;
  };
  TPU_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), "{}: the name '{}' is already registered",
            type_name(), name);
}

void Module::register_parameter(const std::string& name, Tensor& param, bool requires_grad) {
  check_name(name);
  TPU_CHECK(param.defined(), "{}: parameter '{}' is an undefined tensor", type_name(), name);
  if (requires_grad) param.requires_grad_(true);
  params_.emplace_back(name, &param);
}

void Module::register_buffer(const std::string& name, Tensor& buffer) {
  check_name(name);
  TPU_CHECK(buffer.defined(), "{}: buffer '{}' is an undefined tensor", type_name(), name);
  buffers_.emplace_back(name, &buffer);
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_name(name);
  TPU_CHECK(m != nullptr, "{}: submodule '{}' is null", type_name(), name);
  children_.emplace_back(name, std::move(m));
}

void Module::replace_child(const std::string& name, std::shared_ptr<Module> m) {
  TPU_CHECK(m != nullptr, "{}: replacement of submodule '{}' is null", type_name(), name);
  for (auto& [n, c] : children_)
    if (n == name) {
      c = std::move(m);
      return;
    }
  fail("{}: no submodule named '{}' to replace", type_name(), name);
}

template <class F>
void Module::visit(const std::string& prefix, bool recurse, bool buffers, F&& f) const {
  for (const auto& [n, t] : buffers ? buffers_ : params_) f(prefix + n, *t);
  if (!recurse) return;
  for (const auto& [n, c] : children_) c->visit(prefix + n + ".", true, buffers, f);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> v;
  visit("", recurse, false, [&](const std::string& n, Tensor& t) { v.emplace_back(n, t); });
  return v;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> v;
  visit("", recurse, true, [&](const std::string& n, Tensor& t) { v.emplace_back(n, t); });
  return v;
}

std::vector<std::pair<std::string, Tensor*>> Module::parameter_slots(bool recurse) {
  std::vector<std::pair<std::string, Tensor*>> v;
  visit("", recurse, false, [&](const std::string& n, Tensor& t) { v.emplace_back(n, &t); });
  return v;
}

std::vector<std::pair<std::string, Tensor*>> Module::buffer_slots(bool recurse) {
  std::vector<std::pair<std::string, Tensor*>> v;
  visit("", recurse, true, [&](const std::string& n, Tensor& t) { v.emplace_back(n, &t); });
  return v;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> v;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m, const std::string& prefix) {
    for (const auto& [n, c] : m.children_) {
      v.emplace_back(prefix + n, c);
      walk(*c, prefix + n + ".");
    }
  };
  walk(*this, "");
  return v;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> v;
  visit("", recurse, false, [&](const std::string&, Tensor& t) { v.push_back(t); });
  return v;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

StateDict Module::state_dict() const {
  StateDict sd;
  for (bool b : {false, true})
    visit("", true, b, [&](const std::string& n, Tensor& t) { sd[n] = t.detach(); });
  return sd;
}

void Module::load_state_dict(const StateDict& sd, bool strict) {
  std::vector<std::pair<std::string, Tensor*>> slots;
  // Slots whose dtype is part of a format with more than one valid dtype take the state dict's
  // dtype instead of a conversion: int4 group scales are f32 or f16, and rounding saved f32
  // scales to f16 would change the weights.
  std::set<const Tensor*> adopt;
  std::function<void(const Module&, const std::string&)> collect = [&](const Module& m, const std::string& prefix) {
    for (const auto& [n, t] : m.params_) slots.emplace_back(prefix + n, t);
    for (const auto& [n, t] : m.buffers_) slots.emplace_back(prefix + n, t);
    if (const auto* ql = dynamic_cast<const QuantizedLinear*>(&m); ql && ql->kind == WeightQuant::int4)
      adopt.insert(&ql->weight_scale);
    for (const auto& [n, c] : m.children_) collect(*c, prefix + n + ".");
  };
  collect(*this, "");
  std::set<std::string> known;
  std::vector<std::string> missing, unexpected;
  for (const auto& [n, t] : slots) {
    known.insert(n);
    if (!sd.count(n)) missing.push_back(n);
  }
  for (const auto& [n, t] : sd)
    if (!known.count(n)) unexpected.push_back(n);
  if (strict && (!missing.empty() || !unexpected.empty()))
    fail("load_state_dict ({}): missing keys [{}], unexpected keys [{}]", type_name(), fmt::join(missing, ", "),
         fmt::join(unexpected, ", "));
  for (const auto& [n, t] : slots) {
    auto it = sd.find(n);
    if (it == sd.end()) continue;
    TPU_CHECK(it->second.defined(), "load_state_dict: '{}' is an undefined tensor", n);
    TPU_CHECK(it->second.shape() == t->shape(), "load_state_dict: '{}' has shape {} in the state dict but {} in the module",
              n, it->second.shape().str(), t->shape().str());
  }
  NoGradGuard ng;
  for (auto& [n, t] : slots) {
    auto it = sd.find(n);
    if (it == sd.end()) continue;
    const DType from = it->second.dtype();
    if (adopt.count(t) && from != t->dtype() && (from == DType::f32 || from == DType::f16))
      *t = it->second.to(t->device()).contiguous().clone();
    else
      t->copy_(it->second);
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

namespace {
template <class F>
void replace_all(std::vector<std::pair<std::string, Tensor*>>& slots, bool params, F&& convert) {
  for (auto& [n, t] : slots) {
    Tensor moved;
    {
      NoGradGuard ng;
      moved = convert(*t).detach();
    }
    if (params) moved.requires_grad_(t->requires_grad());
    *t = moved;
  }
}
}  // namespace

void Module::to(Device d) {
  replace_all(params_, true, [&](const Tensor& t) { return t.to(d); });
  replace_all(buffers_, false, [&](const Tensor& t) { return t.to(d); });
  for (auto& [n, c] : children_) c->to(d);
}

void Module::to(DType dt) {
  TPU_CHECK(is_floating(dt), "Module::to: parameters must stay floating point, got {}", dtype_name(dt));
  replace_all(params_, true, [&](const Tensor& t) { return t.to(dt); });
  for (auto& [n, c] : children_) c->to(dt);
}

void Module::zero_grad() {
  for (Tensor& p : parameters()) p.set_grad(Tensor());
}

}  // namespace tpu::nn
