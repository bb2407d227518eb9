#include "graph/tracer.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "tpucore/core/hooks.h"

namespace tpu::graph {
namespace {

std::atomic<uint64_t> g_epoch{1};

Tensor materialize_hook(const Tensor& proxy, const char* what) {
  TraceValue* tv = proxy.impl().trace.get();
  TPU_CHECK(tv && tv->tracer, "{}: the tensor is a traced proxy from a finished trace", what);
  return tv->tracer->on_break(proxy, what);
}

const bool g_hook_installed = (detail::set_materialize_hook(&materialize_hook), true);

const ops::OpDef& cast_def() {
  static const ops::OpDef* d = ops::find_op("to_dtype");
  TPU_CHECK(d != nullptr, "internal: op 'to_dtype' is not registered");
  return *d;
}

}  // namespace

Tracer::Tracer() : epoch_(g_epoch.fetch_add(1)) { (void)g_hook_installed; }
Tracer::~Tracer() = default;

Tensor Tracer::make_proxy(ValueId id) {
  const ValueMeta& m = graph_.meta(id);
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = m.shape;
  impl->strides = contiguous_strides(m.shape);
  impl->dtype = m.dtype;
  impl->device = m.device;
  impl->wrapped_number = m.wrapped;
  impl->contiguous = true;
  auto tv = std::make_shared<TraceValue>();
  tv->tracer = this;
  tv->epoch = epoch_;
  tv->id = id;
  impl->trace = std::move(tv);
  // Every proxy is kept (not one slot per id): a temporary proxy of an old value, made while
  // functionalizing a write into a view, must not hide the tensor that owns that value.
  proxies_.push_back(impl);
  return Tensor(std::move(impl));
}

Tensor Tracer::add_arg(const Tensor& real, int arg, int elem) {
  TPU_CHECK(real.defined(), "compile: argument {} is an undefined tensor", arg);
  TPU_CHECK(!real.is_proxy(), "compile: argument {} is a traced tensor of another trace (nested compile is not supported)",
            arg);
  ValueId id = graph_.add_input({real.shape(), real.dtype(), real.device(), false});
  sources_.push_back({InputSource::Kind::arg, arg, elem});
  real_inputs_.push_back(real);
  Tensor p = make_proxy(id);
  // An argument that requires grad is a differentiable leaf of the trace, as a captured tensor
  // is: autograd::grad and backward inside the function reach it.
  p.impl().requires_grad = real.impl().requires_grad;
  p.impl().trace->input = static_cast<int>(graph_.inputs.size()) - 1;
  p.impl().trace->input_value = id;
  input_roots_.push_back(p.impl().trace);
  return p;
}

ValueId Tracer::value_of(const Tensor& t) {
  const TensorImpl& im = t.impl();
  if (im.trace) {
    TPU_CHECK(im.trace->tracer == this && im.trace->epoch == epoch_,
              "compile: a traced tensor from another trace (or from before a graph break) was used; "
              "tensors made inside a compiled function must not be kept across calls");
    return im.trace->id;
  }
  auto it = captured_.find(&im);
  if (it != captured_.end()) return it->second->id;
  if (auto same = same_view_root(t)) {  // another handle on a captured tensor (detach(), a saved tensor)
    captured_.emplace(&im, same);
    aliases_.push_back(t);  // keeps the key alive (a freed TensorImpl's address can be reused)
    return same->id;
  }
  auto root = std::make_shared<TraceValue>();
  root->tracer = this;
  root->epoch = epoch_;
  if (im.wrapped_number) {
    root->id = graph_.add_constant(t, true);
  } else {
    root->id = graph_.add_input({t.shape(), t.dtype(), t.device(), false});
    sources_.push_back({InputSource::Kind::captured, -1, -1});
    real_inputs_.push_back(t);
    root->input = static_cast<int>(graph_.inputs.size()) - 1;
    root->input_value = root->id;
    input_roots_.push_back(root);
  }
  captured_.emplace(&im, root);
  return root->id;
}

Tensor Tracer::eager_layout(const Tensor& in) const {
  // The strides the eager tensor would have: its root's (contiguous for a value made by an op,
  // the real tensor's for an input) followed through the view ops; no storage.
  const TraceValue& tv = *in.impl().trace;
  const TraceValue& root = tv.base ? *tv.base : tv;
  auto fake = std::make_shared<TensorImpl>();
  const ValueMeta& rm = graph_.meta(root.input >= 0 ? root.input_value : root.id);
  fake->shape = rm.shape;
  fake->strides = root.input >= 0 ? real_inputs_[static_cast<size_t>(root.input)].strides() : contiguous_strides(rm.shape);
  fake->dtype = rm.dtype;
  fake->device = rm.device;
  fake->recompute_contiguous();
  Tensor t(std::move(fake));
  if (tv.base)
    for (const ViewStep& s : tv.chain) t = s.op->view(t, s.attrs, ops::TensorMeta{s.out.shape, s.out.dtype, s.out.device});
  return t;
}

bool Tracer::eager_contiguous(const Tensor& proxy) const {
  const TraceValue& tv = *proxy.impl().trace;
  if (tv.tracer != this || tv.epoch != epoch_) return false;
  if (!tv.base && tv.input < 0) return true;  // a fresh value
  return eager_layout(proxy).is_contiguous();
}

bool Tracer::eager_viewable(const ops::OpDef& view_op, const Tensor& in, const ops::Attrs& attrs) const {
  // reshape() of a traced tensor always records 'view'; eager copies when the strides do not
  // allow a view, and then the result must not alias: ask view's meta about the eager layout.
  if (!in.is_proxy()) return true;  // a real tensor was already checked by the meta function
  const TraceValue& tv = *in.impl().trace;
  if (!tv.base && tv.input < 0) return true;  // a fresh value is contiguous
  Tensor t = eager_layout(in);
  try {
    ops::MetaResult m;
    const Tensor ins[1] = {t};
    view_op.meta(ops::MetaArgs{view_op, ins, attrs}, m);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::shared_ptr<TraceValue> Tracer::same_view_root(const Tensor& t) const {
  const TensorImpl& im = t.impl();
  if (!im.storage || im.wrapped_number) return nullptr;
  for (size_t i = 0; i < real_inputs_.size(); ++i) {
    const TensorImpl& o = real_inputs_[i].impl();
    if (sources_[i].kind == InputSource::Kind::captured && o.storage == im.storage && o.offset == im.offset &&
        o.dtype == im.dtype && o.shape == im.shape && o.strides == im.strides)
      return input_roots_[i];
  }
  return nullptr;
}

bool Tracer::aliases_captured(const Tensor& t, bool write) const {
  const TensorImpl& im = t.impl();
  if (!im.storage || im.wrapped_number) return false;
  for (size_t i = 0; i < real_inputs_.size(); ++i) {
    const TensorImpl& o = real_inputs_[i].impl();
    if (o.storage != im.storage) continue;
    if (o.offset == im.offset && o.dtype == im.dtype && o.shape == im.shape && o.strides == im.strides) continue;
    if (write || input_roots_[i]->id != input_roots_[i]->input_value) return true;
  }
  return false;
}

uint64_t Tracer::real_version(const Tensor& t) const {
  auto it = captured_.find(&t.impl());
  if (it != captured_.end()) return it->second->version;
  auto same = same_view_root(t);
  return same ? same->version : 0;
}

bool Tracer::intercept(const ops::OpDef& op, std::span<const Tensor> inputs, const ops::Attrs& attrs,
                       const ops::MetaResult& meta, std::span<Tensor> outputs) {
  std::vector<ValueId> ins;
  ins.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    ValueId v = value_of(inputs[i]);
    if (!op.has(ops::kView) && meta.cast_mask && i < 32 && ((meta.cast_mask >> i) & 1u) &&
        inputs[i].dtype() != meta.cast_to) {
      // Type promotion is explicit in the graph: a cast node feeds the op.
      // A wrapped number stays one after its cast (a cpu 0-d value that may meet tensors of any
      // device, as in eager, where the kernel's front half converts it).
      const ValueMeta& m = graph_.meta(v);
      const ValueMeta cast_meta{m.shape, meta.cast_to, m.device, m.wrapped};
      ops::Attrs cast_attrs;
      cast_attrs.set("dtype", meta.cast_to);
      int n = graph_.add_node(cast_def(), {v}, cast_attrs, {cast_meta});
      v = graph_.nodes[static_cast<size_t>(n)].outputs[0];
    }
    ins.push_back(v);
  }
  // An op that computes in a wider float type than it returns (an f16 matmul runs in f32 and
  // rounds its result to f16) is recorded as the op in its compute type followed by a cast node,
  // mirroring the casts in above, so each node's dtype is what its inputs give.
  const bool casts_out = !op.has(ops::kView) && meta.cast_mask && is_floating(meta.cast_to);
  std::vector<ValueMeta> metas;
  for (int i = 0; i < meta.num_outputs; ++i) {
    const ops::TensorMeta& o = meta.outputs[static_cast<size_t>(i)];
    const bool widened = casts_out && is_floating(o.dtype) && dtype_size(o.dtype) < dtype_size(meta.cast_to);
    metas.push_back({o.shape, widened ? meta.cast_to : o.dtype, o.device, false});
  }
  int n = graph_.add_node(op, std::move(ins), attrs, metas);
  for (int i = 0; i < meta.num_outputs; ++i) {
    ValueId v = graph_.nodes[static_cast<size_t>(n)].outputs[static_cast<size_t>(i)];
    const DType want = meta.outputs[static_cast<size_t>(i)].dtype;
    if (metas[static_cast<size_t>(i)].dtype != want) {
      ValueMeta rm = metas[static_cast<size_t>(i)];
      rm.dtype = want;
      ops::Attrs cast_attrs;
      cast_attrs.set("dtype", want);
      int c = graph_.add_node(cast_def(), {v}, cast_attrs, {rm});
      v = graph_.nodes[static_cast<size_t>(c)].outputs[0];
    }
    outputs[static_cast<size_t>(i)] = make_proxy(v);
  }
  if (op.has(ops::kView) && meta.num_outputs == 1 && !inputs[0].impl().wrapped_number &&
      (op.name != "view" || eager_viewable(op, inputs[0], attrs))) {
    // The output aliases input 0: remember the family and the view ops from its root.
    TraceValue& out = *outputs[0].impl().trace;
    const TraceValue* in = inputs[0].is_proxy() ? inputs[0].impl().trace.get() : nullptr;
    std::shared_ptr<TraceValue> root = in ? (in->base ? in->base : inputs[0].impl().trace) : captured_.at(&inputs[0].impl());
    if (in && in->base) out.chain = in->chain;
    out.chain.push_back({&op, attrs, metas[0]});
    out.base = root;
    root->views.push_back(outputs[0].impl().trace);
  }
  return true;
}

void Tracer::set_outputs(std::span<const Tensor> outs) {
  graph_.outputs.clear();
  for (size_t i = 0; i < outs.size(); ++i) {
    TPU_CHECK(outs[i].defined(), "compile: output {} of the traced function is an undefined tensor", i);
    graph_.outputs.push_back(value_of(outs[i]));
  }
}

std::vector<std::pair<ValueId, std::shared_ptr<TensorImpl>>> Tracer::live_proxies() const {
  std::vector<std::pair<ValueId, std::shared_ptr<TensorImpl>>> v;
  for (const auto& w : proxies_)  // current ids: in-place writes rebind proxies
    if (auto p = w.lock(); p && p->trace) v.emplace_back(p->trace->id, std::move(p));
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return v;
}

void Tracer::fill_proxy(TensorImpl& p, const Tensor& real) {
  const TensorImpl& r = real.impl();
  p.storage = r.storage;
  p.shape = r.shape;
  p.strides = r.strides;
  p.offset = r.offset;
  p.dtype = r.dtype;
  p.device = r.device;
  p.contiguous = r.contiguous;
  p.trace.reset();
}

void Tracer::reset_segment() {
  graph_ = Graph{};
  sources_.clear();
  real_inputs_.clear();
  captured_.clear();
  aliases_.clear();
  input_roots_.clear();
  proxies_.clear();
  epoch_ = g_epoch.fetch_add(1);
}

Tensor Tracer::on_break(const Tensor& proxy, const std::string& why) {
  TPU_CHECK(!in_break_, "internal: nested graph break");
  const ValueId id = proxy.impl().trace->id;
  const Node* p = graph_.producer(id);
  // Deferred eager mode breaks at every value read: the call site (a backtrace) would cost more
  // than a small flush, so it is named only for compile's breaks.
  std::string cause = deferred_ ? fmt::format("{} on %{} (produced by '{}')", why, id, p ? p->op->name : std::string("input"))
                                : fmt::format("{} on %{} (produced by '{}') called from {}", why, id,
                                              p ? p->op->name : std::string("input"), caller_site(3));
  TPU_CHECK(static_cast<bool>(on_break_), "compile: graph break: {}", cause);
  in_break_ = true;
  struct Reset {
    bool& b;
    ~Reset() { b = false; }
  } reset{in_break_};
  Tensor keep = proxy;  // stays alive, so it is materialized with the others
  return on_break_(*this, keep, cause);
}

TraceScope::TraceScope(ops::DispatchInterceptor* t) : prev_(ops::interceptor()) { ops::set_interceptor(t); }
TraceScope::~TraceScope() { ops::set_interceptor(prev_); }

std::string caller_site(int skip) {
  void* frames[24];
  int n = backtrace(frames, 24);
  // Skip frames inside libtpucore: the first frame outside it is the user's call site.
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&caller_site), &self);
  for (int i = skip; i < n; ++i) {
    Dl_info info{};
    if (!dladdr(frames[i], &info)) continue;
    if (info.dli_fbase == self.dli_fbase) continue;
    std::string name = "?";
    if (info.dli_sname) {
      int st = 0;
      char* dm = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &st);
      name = st == 0 && dm ? dm : info.dli_sname;
      std::free(dm);
    }
    if (name.size() > 120) name = name.substr(0, 117) + "...";
    const char* file = info.dli_fname ? info.dli_fname : "?";
    const char* base = file;
    for (const char* c = file; *c; ++c)
      if (*c == '/') base = c + 1;
    return fmt::format("{} ({}+0x{:x})", name, base,
                       static_cast<uintptr_t>(static_cast<char*>(frames[i]) - static_cast<char*>(info.dli_fbase)));
  }
  return "an unknown site";
}

}  // namespace tpu::graph
