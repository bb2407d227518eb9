#include "ops/registry.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "device/driver.h"
#include "ops/fallback.h"

namespace tpu::ops {
namespace {

struct Registry {
  std::mutex mu;
  std::deque<OpDef> defs;  // stable addresses
  std::unordered_map<std::string, OpDef*> by_name;
  // What other sources register for ops not defined yet: static initialization runs sources in
  // an order the language leaves open, so registration may come first; define() applies it.
  std::unordered_map<std::string, BackwardDef> pending_backward;
  std::unordered_map<std::string, void*> pending_lowering;
  std::unordered_map<std::string, std::vector<std::pair<DeviceType, KernelFn>>> pending_kernels;
  std::array<KernelFn, kNumDeviceTypes> generic_kernels{};  // register_generic_kernel
};

// Whether a backend's generic kernel covers the op (register_generic_kernel).
bool takes_generic_kernel(const OpDef& d) { return d.cpu != nullptr && !d.has(kView); }
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

thread_local DispatchInterceptor* t_interceptor = nullptr;
thread_local int t_eager_scopes = 0;
std::atomic<DefaultInterceptorHook> g_default_interceptor{nullptr};
std::atomic<PostCallHook> g_post_hook{nullptr};
std::atomic<InplaceHook> g_inplace_hook{nullptr};
std::atomic<OpObserver*> g_observer{nullptr};

// Calls the observer's end() on every way out of the front half.
struct ObservedCall {
  OpObserver* obs;
  const OpDef& op;
  std::span<const Tensor> outs;
  ~ObservedCall() {
    if (obs) obs->end(op, outs);
  }
};

std::string devices_str(std::span<const Tensor> inputs) {
  std::string s;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i) s += ", ";
    s += inputs[i].defined() ? inputs[i].device().str() : "undefined";
  }
  return s;
}

// Float8 tensors are storage types, as in PyTorch: only conversion, copies and views take them.
void check_no_float8(const OpDef& op, std::span<const Tensor> inputs, const MetaResult& m) {
  auto refuse = [&](DType t, const char* what, size_t i) {
    fail("{}: not implemented for dtype {} ({} {}); float8 tensors support to(dtype), copies, views, printing and "
         "item(): convert to f32 or bf16 to compute",
         op.name, dtype_name(t), what, i);
  };
  for (size_t i = 0; i < inputs.size(); ++i)
    if (is_float8(inputs[i].dtype())) refuse(inputs[i].dtype(), "input", i);
  for (int i = 0; i < m.num_outputs; ++i)
    if (is_float8(m.outputs[static_cast<size_t>(i)].dtype)) refuse(m.outputs[static_cast<size_t>(i)].dtype, "output", static_cast<size_t>(i));
}

}  // namespace

const OpDef& define(OpDef def) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.by_name.find(def.name);
  if (it != r.by_name.end()) fail("internal: op '{}' is defined twice", def.name);
  r.defs.push_back(std::move(def));
  OpDef* d = &r.defs.back();
  if (auto p = r.pending_backward.find(d->name); p != r.pending_backward.end()) {
    d->backward = p->second;
    r.pending_backward.erase(p);
  }
  if (auto p = r.pending_lowering.find(d->name); p != r.pending_lowering.end()) {
    d->lowering = p->second;
    r.pending_lowering.erase(p);
  }
  if (auto p = r.pending_kernels.find(d->name); p != r.pending_kernels.end()) {
    for (const auto& [device, fn] : p->second) d->kernels[static_cast<int>(device)] = fn;
    r.pending_kernels.erase(p);
  }
  if (takes_generic_kernel(*d))
    for (size_t t = 0; t < r.generic_kernels.size(); ++t)
      if (r.generic_kernels[t] && !d->kernels[t]) d->kernels[t] = r.generic_kernels[t];
  r.by_name.emplace(d->name, d);
  return *d;
}

const OpDef* find_op(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.by_name.find(std::string(name));
  return it == r.by_name.end() ? nullptr : it->second;
}

std::vector<std::string> undefined_registrations() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  std::vector<std::string> v;
  for (const auto& [name, b] : r.pending_backward) v.push_back(name + " (backward)");
  for (const auto& [name, l] : r.pending_lowering) v.push_back(name + " (lowering)");
  for (const auto& [name, k] : r.pending_kernels) v.push_back(name + " (kernel)");
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<const OpDef*> all_ops() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  std::vector<const OpDef*> v;
  for (auto& d : r.defs) v.push_back(&d);
  return v;
}

void register_kernel(std::string_view op, DeviceType device, KernelFn fn) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.by_name.find(std::string(op));
  if (it == r.by_name.end()) r.pending_kernels[std::string(op)].emplace_back(device, fn);
  else it->second->kernels[static_cast<int>(device)] = fn;
}

void register_generic_kernel(DeviceType device, KernelFn fn) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.generic_kernels[static_cast<int>(device)] = fn;
  for (OpDef& d : r.defs)
    if (takes_generic_kernel(d)) d.kernels[static_cast<int>(device)] = fn;
}

void set_lowering(std::string_view op, void* rule) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.by_name.find(std::string(op));
  if (it == r.by_name.end()) r.pending_lowering[std::string(op)] = rule;
  else it->second->lowering = rule;
}

void set_backward(std::string_view op, BackwardDef def) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.by_name.find(std::string(op));
  if (it == r.by_name.end()) r.pending_backward[std::string(op)] = def;
  else it->second->backward = def;
}

void set_interceptor(DispatchInterceptor* i) { t_interceptor = i; }
DispatchInterceptor* interceptor() { return t_interceptor; }
EagerScope::EagerScope() : prev_(t_interceptor) {
  t_interceptor = nullptr;
  ++t_eager_scopes;
}
EagerScope::~EagerScope() {
  --t_eager_scopes;
  t_interceptor = prev_;
}
void set_default_interceptor_hook(DefaultInterceptorHook h) { g_default_interceptor.store(h); }
void set_post_call_hook(PostCallHook h) { g_post_hook.store(h); }
void set_inplace_hook(InplaceHook h) { g_inplace_hook.store(h); }
InplaceHook inplace_hook() { return g_inplace_hook.load(std::memory_order_relaxed); }
void set_op_observer(OpObserver* o) { g_observer.store(o); }

static const OpDef& cast_op() {
  static const OpDef* d = find_op("to_dtype");
  if (!d) fail("internal: the cast op 'to_dtype' is not registered");
  return *d;
}

void call(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs, std::span<Tensor> outputs) {
  if (!op.has(kVariadic)) {
    TPU_CHECK(static_cast<int>(inputs.size()) == op.num_inputs, "{}: expected {} tensor input(s), got {}", op.name,
              op.num_inputs, inputs.size());
  } else {
    TPU_CHECK(!inputs.empty(), "{}: expected at least one tensor, got an empty list", op.name);
  }
  bool any_proxy = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TPU_CHECK(inputs[i].defined(), "{}: input {} is an undefined tensor", op.name, i);
    any_proxy |= inputs[i].is_proxy();
  }
  for (size_t i = 1; i < inputs.size(); ++i) {
    if (inputs[i].device() != inputs[0].device()) {
      // A wrapped scalar lives on the cpu and may meet a tensor of any device.
      if (!inputs[i].impl().wrapped_number && !inputs[0].impl().wrapped_number)
        fail("{}: expected all tensors on the same device, got {}", op.name, devices_str(inputs));
    }
  }
  MetaResult m;
  op.meta(MetaArgs{op, inputs, attrs}, m);
  if (!op.has(kView) && !op.has(kFloat8)) check_no_float8(op, inputs, m);
  // Every op's result shape (views included) within the element limit, named after the op.
  for (int i = 0; i < m.num_outputs; ++i) (void)checked_numel(m.out(i).shape, op.name.c_str());
  TPU_CHECK(outputs.size() >= static_cast<size_t>(m.num_outputs), "internal: {}: {} output slot(s) for {} output(s)",
            op.name, outputs.size(), m.num_outputs);

  if (!t_interceptor && t_eager_scopes == 0) {
    if (DefaultInterceptorHook h = g_default_interceptor.load(std::memory_order_relaxed)) t_interceptor = h();
  }
  if (DispatchInterceptor* ic = t_interceptor; ic || any_proxy) {
    if (ic && ic->intercept(op, inputs, attrs, m, outputs)) {
      // Traced calls are recorded by autograd too, so a backward inside a trace is traced.
      if (PostCallHook h = g_post_hook.load(std::memory_order_relaxed))
        h(op, inputs, attrs, outputs.subspan(0, static_cast<size_t>(m.num_outputs)));
      return;
    }
    // A deferred eager recording may decline an op after flushing (its proxies are real now).
    if (any_proxy) any_proxy = std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.is_proxy(); });
    TPU_CHECK(!any_proxy, "{}: a traced (proxy) tensor was used outside of tracing", op.name);
  }

  ObservedCall observed{g_observer.load(std::memory_order_relaxed), op, {}};
  if (observed.obs) observed.obs->begin(op, inputs);
  if (op.has(kView)) {
    outputs[0] = op.view(inputs[0], attrs, m.out(0));
  } else {
    // Type promotion: cast the marked inputs once, here.
    std::array<Tensor, 4> small_cast;
    std::vector<Tensor> big_cast;
    std::span<const Tensor> ins = inputs;
    if (m.cast_mask) {
      std::span<Tensor> dst;
      if (inputs.size() <= small_cast.size()) {
        dst = std::span<Tensor>(small_cast.data(), inputs.size());
      } else {
        big_cast.resize(inputs.size());
        dst = std::span<Tensor>(big_cast);
      }
      for (size_t i = 0; i < inputs.size(); ++i) {
        const Tensor& t = inputs[i];
        if (i < 32 && (m.cast_mask >> i) & 1u && t.dtype() != m.cast_to) {
          Tensor out[1];
          Attrs ca{{"dtype", m.cast_to}};
          Tensor in1[1] = {t};
          call(cast_op(), in1, ca, out);
          dst[i] = std::move(out[0]);
        } else {
          dst[i] = t;
        }
      }
      ins = dst;
    }
    Device dev = m.out(0).device;
    for (int i = 0; i < m.num_outputs; ++i) outputs[i] = empty_tensor(m.out(i).shape, m.out(i).dtype, m.out(i).device);
    KernelFn k = op.kernels[static_cast<int>(dev.type)];
    if (!k && dev.type == DeviceType::cpu) k = op.cpu;
    if (k) {
      k(KernelArgs{op, ins, outputs.subspan(0, static_cast<size_t>(m.num_outputs)), attrs});
    } else {
      TPU_CHECK(op.cpu != nullptr, "{}: no kernel for device '{}' and no cpu kernel to fall back on", op.name, dev.str());
      run_on_host(op, ins, attrs, outputs.subspan(0, static_cast<size_t>(m.num_outputs)));
    }
  }
  observed.outs = outputs.subspan(0, static_cast<size_t>(m.num_outputs));
  if (PostCallHook h = g_post_hook.load(std::memory_order_relaxed))
    h(op, inputs, attrs, outputs.subspan(0, static_cast<size_t>(m.num_outputs)));
}

Tensor call(const OpDef& op, std::initializer_list<Tensor> inputs, const Attrs& attrs) {
  Tensor out[kMaxOutputs];
  call(op, std::span<const Tensor>(inputs.begin(), inputs.size()), attrs, out);
  return std::move(out[0]);
}

}  // namespace tpu::ops
