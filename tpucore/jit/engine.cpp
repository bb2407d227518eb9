// The engine behind tpu::compile: signature cache (hit path), tracing and optimization (miss
// path), graph breaks (segments), and the recompile log.
#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <chrono>

#include "codegen/region_runner.h"
#include "graph/passes/passes.h"
#include "graph/printer.h"
#include "tpucore/autograd/capture.h"
#include "tpucore/defer.h"
#include "tpucore/jit/internal.h"
#include "tpucore/core/log.h"
#include "tpucore/ops.h"
#include "tpucore/profiler.h"

namespace tpu::jit::detail {

class Engine {
 public:
  explicit Engine(CompileOptions o);
  void call(std::span<const ArgSlot> args, TraceCall trace, std::vector<Tensor>& outs);
  std::vector<std::string> graphs() const;
  const std::string& scope_name() const { return scope_name_; }
  // Defer-and-fuse eager mode reuses the graph-break path (tpucore/jit/defer.cpp).
  friend Tensor flush_deferred(graph::Tracer& t, const Tensor& proxy, const std::string& why);

 private:
  struct Traced {
    std::unique_ptr<graph::Tracer> tracer;
    bool broke = false;
    std::vector<WriteBack> writes;  // inputs written in place (their outputs follow the user's)
    size_t user_outputs = 0;
    std::vector<graph::Tracer::OutputAlias> aliases;
    std::vector<GradAction> grads;  // .grad of real tensors after the function
    std::vector<GradGuard> guards;
    std::vector<char> fresh;
    std::vector<TraceGuard> trace_guards;
  };
  Traced trace(std::span<const ArgSlot> args, TraceCall tc, const std::vector<double>* numbers,
               const std::vector<DynamicDim>& pad, std::vector<Tensor>* outs, bool probe = false);
  Entry* compile(std::span<const ArgSlot> args, TraceCall tc, const std::vector<int64_t>& sig, uint64_t hash,
                 std::vector<Tensor>& outs, bool& ran);
  void run_entry(const Entry& e, std::span<const ArgSlot> args, std::vector<Tensor>& outs) const;
  Tensor on_break(graph::Tracer& t, const Tensor& proxy, const std::string& why);
  void finish_segments(Traced& t, std::vector<Tensor>& outs);
  static void add_write_backs(graph::Tracer& tr, std::vector<WriteBack>& writes);
  static void add_grad_outputs(graph::Tracer& tr, autograd::detail::GradCapture& cap, Traced& r);
  std::shared_ptr<graph::Executable> segment(const graph::Graph& g);
  graph::PassOptions pass_options() const;
  void note_compile(const std::string& reason, double ms, bool from_disk);

  CompileOptions opts_;
  std::string scope_name_;  // "compiled:<name>": the profiler row of this function's calls
  std::shared_ptr<StatsRecord> stats_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_;
  size_t last_hit_ = 0;
  std::vector<char> static_args_;
  bool breaks_mode_ = false;
  bool dynamic_off_ = false;
  bool emulate_ = false;  // emulate_precision_casts of the call in progress (set under mu_)
  std::string guard_reason_;  // why a cache entry with the same signature did not apply
  std::unordered_map<uint64_t, std::shared_ptr<graph::Executable>> segments_;
};

namespace {

std::array<std::atomic<GraphCompiler>, kNumDeviceTypes> g_graph_compilers{};

// The graph as one program of the device its inputs live on, when that device's driver compiles
// whole graphs; null otherwise or when it declines (logged).
std::shared_ptr<GraphProgram> compile_for_device(const graph::Graph& g, const std::string& name) {
  for (graph::ValueId v : g.inputs) {
    const Device d = g.meta(v).device;
    if (d.is_cpu()) continue;
    GraphCompiler c = g_graph_compilers[static_cast<size_t>(d.type)].load();
    if (!c) return nullptr;
    try {
      return c(g);
    } catch (const Error& e) {
      log().info("compile '{}': {} runs the graph node by node: {}", name, d.str(), e.what());
      return nullptr;
    }
  }
  return nullptr;
}
std::atomic<int> g_counter{0};
thread_local std::vector<int64_t> t_sig;

// A number argument fed to the graph: it replaced wrapped 0-d constants, so it is wrapped too
// (it may meet tensors of any device, with the type promotion of a number).
Tensor scalar_input(double v, DType dt) {
  Tensor t = tpu::scalar_tensor(Scalar(v), TensorOptions(dt));
  t.impl().wrapped_number = true;
  return t;
}

// Zero-pads t along dim to n.
Tensor pad_to(const Tensor& t, int dim, int64_t n) {
  Shape s = t.shape();
  if (s[dim] == n) return t;
  s[dim] = n;
  Tensor p = tpu::zeros(s, TensorOptions(t.dtype(), t.device()));
  Tensor dst = p.narrow(dim, 0, t.shape()[dim]);
  dst.copy_(t);
  return p;
}
}  // namespace

Engine::Engine(CompileOptions o) : opts_(std::move(o)) {
  if (opts_.name.empty()) opts_.name = fmt::format("fn{}", g_counter.fetch_add(1));
  scope_name_ = fmt::format("compiled:{}", opts_.name);
  stats_ = register_stats(opts_.name);
  TPU_CHECK(opts_.emulate_precision_casts >= -1 && opts_.emulate_precision_casts <= 1,
            "compile('{}'): emulate_precision_casts must be 1 (on), 0 (off) or -1 (the process default), got {}",
            opts_.name, opts_.emulate_precision_casts);
  emulate_ = resolve_emulate(opts_.emulate_precision_casts);
  for (int a : opts_.static_args) {
    TPU_CHECK(a >= 0 && a < 64, "compile: static_args entry {} is out of range", a);
    if (static_args_.size() <= static_cast<size_t>(a)) static_args_.resize(static_cast<size_t>(a) + 1, 0);
    static_args_[static_cast<size_t>(a)] = 1;
  }
}

graph::PassOptions Engine::pass_options() const {
  graph::PassOptions p;
  p.fold = p.simplify = p.cse = opts_.optimize;
  p.fuse = p.plan = opts_.fuse;
  p.emulate_precision_casts = emulate_;
#ifdef NDEBUG
  p.verify = opts_.verify == 1;
#else
  p.verify = opts_.verify != 0;
#endif
  return p;
}

void Engine::note_compile(const std::string& reason, double ms, bool from_disk) {
  int64_t n;
  {
    std::lock_guard<std::mutex> lk(stats_->mu);
    n = ++stats_->s.compiles;
    stats_->s.reasons.push_back(reason);
    stats_->s.compile_ms += ms;
    if (from_disk) ++stats_->s.disk_hits;
  }
  log().debug("compile '{}': compile #{} ({:.2f} ms{}): {}", opts_.name, n, ms, from_disk ? ", graph from disk cache" : "",
              reason);
  if (opts_.warn_after_recompiles > 0 && n == opts_.warn_after_recompiles + 1)
    log().warn("compile '{}': recompiled {} times; the changing input: {} (mark the dim dynamic or the number static?)",
               opts_.name, n - 1, reason);
}

Engine::Traced Engine::trace(std::span<const ArgSlot> args, TraceCall tc, const std::vector<double>* numbers,
                             const std::vector<DynamicDim>& pad, std::vector<Tensor>* outs, bool probe) {
  Traced r;
  r.tracer = std::make_unique<graph::Tracer>();
  graph::Tracer& tr = *r.tracer;
  size_t count = 0;
  for (const ArgSlot& a : args) count += a.kind == ArgSlot::Kind::tensor ? 1 : 0;
  std::vector<Tensor> proxies;
  proxies.reserve(count);
  std::vector<std::vector<Tensor>> lists;
  lists.reserve(args.size());
  std::vector<ArgSlot> slots(args.begin(), args.end());
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSlot& a = args[i];
    if (a.kind == ArgSlot::Kind::tensor) {
      Tensor real = *a.tensor;
      for (const DynamicDim& d : pad)
        if (d.arg == static_cast<int>(i)) {
          int dim = d.dim < 0 ? d.dim + real.dim() : d.dim;
          real = pad_to(real, dim, bucket_size(real.shape()[dim]));
        }
      proxies.push_back(tr.add_arg(real, static_cast<int>(i)));
      slots[i].tensor = &proxies.back();
    } else if (a.kind == ArgSlot::Kind::tensor_list) {
      std::vector<Tensor> l;
      for (size_t k = 0; k < a.list->size(); ++k) l.push_back(tr.add_arg((*a.list)[k], static_cast<int>(i), static_cast<int>(k)));
      lists.push_back(std::move(l));
      slots[i].list = &lists.back();
    } else if (a.kind == ArgSlot::Kind::number && numbers) {
      slots[i].number = (*numbers)[i];
    }
  }
  tr.set_break_handler([this, &r, probe](graph::Tracer& t, const Tensor& p, const std::string& why) {
    r.broke = true;
    if (probe) fail("compile: probe trace stopped at a graph break");
    return on_break(t, p, why);
  });
  std::vector<Tensor> result;
  {
    graph::TraceScope scope(&tr);
    TraceGuardScope guard_scope(&r.trace_guards);
    autograd::detail::GradCapture cap;
    autograd::detail::GradCaptureScope capture(&cap);
    struct Restore {  // tracing leaves no traced tensor in a .grad, also when fn throws
      autograd::detail::GradCapture& c;
      ~Restore() { c.restore(); }
    } restore{cap};
    tc.fn(tc.ctx, slots, result);
    tr.set_outputs(result);
    r.user_outputs = result.size();
    r.aliases = tr.output_aliases(result);
    r.fresh = tr.fresh_outputs(result);
    add_write_backs(tr, r.writes);
    add_grad_outputs(tr, cap, r);
    // Gradients that a backward inside fn left on tensor arguments (not padded ones: their
    // gradient has the padded shape).
    auto arg_grad = [&](const Tensor& p) {
      const auto& m = p.impl().autograd;
      if (!p.impl().requires_grad || !m || !m->grad.defined() || !m->grad.is_proxy()) return;
      GradAction a;
      a.kind = GradAction::Kind::arg_output;
      a.input = p.impl().trace->input;
      a.output = static_cast<int>(tr.graph().outputs.size());
      tr.graph().outputs.push_back(tr.value_id(m->grad));
      r.grads.push_back(std::move(a));
    };
    if (pad.empty()) {
      for (const Tensor& p : proxies) arg_grad(p);
      for (const auto& l : lists)
        for (const Tensor& p : l) arg_grad(p);
    }
  }
  if (outs) *outs = std::move(result);
  return r;
}

void Engine::add_grad_outputs(graph::Tracer& tr, autograd::detail::GradCapture& cap, Traced& r) {
  graph::Graph& g = tr.graph();
  for (const autograd::detail::LeafGradSlot& s : cap.slots()) {
    std::shared_ptr<TensorImpl> owner = s.owner.lock();
    if (!owner) continue;
    if (s.guarded)
      r.guards.push_back({s.owner, s.meta.get(), s.initial,
                          fmt::format("{}{}", dtype_name(owner->dtype), owner->shape.str())});
    const Tensor& now = s.meta->grad;
    GradAction a;
    a.meta = s.meta;
    if (!now.defined()) {
      if (!s.initial.defined()) continue;
      a.kind = GradAction::Kind::clear;
    } else if (now.is_proxy()) {
      a.kind = GradAction::Kind::output;
      a.output = static_cast<int>(g.outputs.size());
      g.outputs.push_back(tr.value_id(now));
    } else {
      if (now.is_same(s.initial)) continue;
      a.kind = GradAction::Kind::tensor;
      a.tensor = now;
    }
    r.grads.push_back(std::move(a));
  }
}

void Engine::add_write_backs(graph::Tracer& tr, std::vector<WriteBack>& writes) {
  writes.clear();
  graph::Graph& g = tr.graph();
  for (auto [input, v] : tr.mutations()) {
    writes.push_back({input, static_cast<int>(g.outputs.size())});
    g.outputs.push_back(v);
  }
}

Tensor Engine::on_break(graph::Tracer& t, const Tensor& proxy, const std::string& why) {
  TPU_CHECK(!opts_.fullgraph, "compile('{}'): graph break with fullgraph=true: {}", opts_.name, why);
  emulate_ = resolve_emulate(opts_.emulate_precision_casts);  // the defer engine's flushes come here directly
  {
    std::lock_guard<std::mutex> lk(stats_->mu);
    ++stats_->s.breaks;
    auto& br = stats_->s.break_reasons;
    if (std::find(br.begin(), br.end(), why) == br.end()) br.push_back(why);
  }
  log().debug("compile '{}': graph break: {}", opts_.name, why);
  breaks_mode_ = true;
  auto live = t.live_proxies();
  graph::Graph& tg = t.graph();
  tg.outputs.clear();
  for (auto& [id, impl] : live) tg.outputs.push_back(id);
  std::vector<WriteBack> writes;
  add_write_backs(t, writes);
  std::vector<Tensor> results;
  std::shared_ptr<graph::Executable> exe;
  {
    graph::TraceScope off(nullptr);
    exe = segment(tg);
    exe->run(t.real_inputs(), results);
    apply_writes(t.real_inputs(), results, writes, live.size(), {});
  }
  // Roots first: inputs (written back or not) stay the caller's tensors; then views of a root
  // that is an input or still alive become real views of it, so they keep aliasing.
  std::unordered_map<const TraceValue*, Tensor> root_real;
  std::vector<std::pair<size_t, std::shared_ptr<TraceValue>>> views;
  std::unordered_map<const Storage*, const TraceValue*> owner;  // storage -> the family using it
  for (const Tensor& in : t.real_inputs())
    if (in.storage()) owner[in.storage().get()] = nullptr;
  // The cached segment's constants (recorded or folded, e.g. ones(n)) are returned as they are:
  // a tensor holding one would share it with every later flush of this segment, and an
  // in-place write to it would change them all. Like inputs, they are copied.
  for (const graph::Value& v : exe->graph().values)
    if (v.kind == graph::ValueKind::constant && v.constant.storage()) owner[v.constant.storage().get()] = nullptr;
  // A value the optimizer turned into an input (x * 1 -> x) or shared by two tensors (CSE) is
  // copied, so that a later in-place write cannot reach another tensor.
  auto own = [&](Tensor r, const TraceValue* fam) {
    if (!r.storage()) return r;
    auto [it, fresh] = owner.emplace(r.storage().get(), fam);
    if (fresh || it->second == fam) return r;
    graph::TraceScope off(nullptr);
    NoGradGuard ng;
    r = tpu::clone(r);
    owner.emplace(r.storage().get(), fam);
    return r;
  };
  for (size_t i = 0; i < live.size(); ++i) {
    std::shared_ptr<TraceValue> tv = live[i].second->trace;
    if (tv->base) {
      views.emplace_back(i, std::move(tv));
      continue;
    }
    const int in = tv->input;
    graph::Tracer::fill_proxy(*live[i].second, in >= 0 ? t.real_inputs()[static_cast<size_t>(in)] : own(results[i], tv.get()));
    root_real[tv.get()] = Tensor(live[i].second);
  }
  for (auto& [i, tv] : views) {
    const TraceValue* root = tv->base.get();
    Tensor base = root->input >= 0 ? t.real_inputs()[static_cast<size_t>(root->input)] : Tensor();
    if (auto it = root_real.find(root); !base.defined() && it != root_real.end()) base = it->second;
    Tensor real;
    if (!base.defined()) real = own(results[i], tv.get());
    if (base.defined()) {
      graph::TraceScope off(nullptr);
      real = base;
      for (const graph::ViewStep& s : tv->chain) real = graph::apply_view_step(real, s);
    }
    graph::Tracer::fill_proxy(*live[i].second, real);
  }
  t.reset_segment();
  return Tensor(proxy.impl_ptr());
}

Tensor flush_deferred(graph::Tracer& t, const Tensor& proxy, const std::string& why) {
  // One engine per thread: its segment cache is what repeated deferred loops hit.
  thread_local Engine eng([] {
    CompileOptions o;
    o.name = "eager:defer";
    o.disk_cache = false;
    o.warn_after_recompiles = 1 << 30;  // each distinct recorded graph compiles once: no warning
    return o;
  }());
  return eng.on_break(t, proxy, why);
}

void Engine::finish_segments(Traced& t, std::vector<Tensor>& outs) {
  graph::TraceScope off(nullptr);
  const std::shared_ptr<graph::Executable> exe = segment(t.tracer->graph());
  exe->run(t.tracer->real_inputs(), outs);
  apply_grads(t.tracer->real_inputs(), outs, t.grads);
  apply_writes(t.tracer->real_inputs(), outs, t.writes, t.user_outputs, t.aliases);
  unalias_outputs(t.tracer->real_inputs(), outs, t.fresh, &exe->graph());
}

std::shared_ptr<graph::Executable> Engine::segment(const graph::Graph& g) {
  const uint64_t h = graph::hash_combine(graph::structural_hash(g), emulate_ ? 1 : 0);
  auto it = segments_.find(h);
  if (it != segments_.end()) {
    stats_->hits.fetch_add(1, std::memory_order_relaxed);
    return it->second;
  }
  auto t0 = std::chrono::steady_clock::now();
  graph::Graph opt = g;
  graph::optimize(opt, pass_options());
  auto exe = std::make_shared<graph::Executable>(std::move(opt), &codegen::run_region_on_chip);
  segments_.emplace(h, exe);
  note_compile(fmt::format("graph segment {:016x} ({} nodes)", h, g.nodes.size()),
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(), false);
  return exe;
}

void Engine::run_entry(const Entry& e, std::span<const ArgSlot> args, std::vector<Tensor>& outs) const {
  std::vector<Tensor> ins;
  ins.reserve(e.bindings.size());
  for (const InputBinding& b : e.bindings) {
    switch (b.kind) {
      case InputBinding::Kind::arg: {
        const ArgSlot& a = args[static_cast<size_t>(b.arg)];
        ins.push_back(b.elem >= 0 ? (*a.list)[static_cast<size_t>(b.elem)] : *a.tensor);
        break;
      }
      case InputBinding::Kind::captured: ins.push_back(b.captured); break;
      case InputBinding::Kind::scalar: ins.push_back(scalar_input(args[static_cast<size_t>(b.arg)].number, b.dtype)); break;
    }
  }
  for (const DynamicDim& d : e.dynamic_in) {
    for (size_t i = 0; i < e.bindings.size(); ++i) {
      const InputBinding& b = e.bindings[i];
      if (b.kind == InputBinding::Kind::arg && b.arg == d.arg && b.elem < 0)
        ins[i] = pad_to(ins[i], d.dim, bucket_size(ins[i].shape()[d.dim]));
    }
  }
  if (e.program) e.program->run(ins, outs);
  else e.exe->run(ins, outs);
  apply_grads(ins, outs, e.grads);
  apply_writes(ins, outs, e.writes, e.user_outputs, e.aliases);
  unalias_outputs(ins, outs, e.fresh, e.exe ? &e.exe->graph() : nullptr);
  for (const DynamicOut& d : e.dynamic_outs) {
    const int64_t real = args[static_cast<size_t>(d.arg)].tensor->shape()[d.arg_dim];
    outs[static_cast<size_t>(d.output)] = outs[static_cast<size_t>(d.output)].narrow(d.dim, 0, real);
  }
}

void Engine::call(std::span<const ArgSlot> args, TraceCall tc, std::vector<Tensor>& outs) {
  std::unique_lock<std::mutex> lk(mu_);
  emulate_ = resolve_emulate(opts_.emulate_precision_casts);
  if (breaks_mode_) {  // functions with graph breaks are re-traced; segments are cached
    Traced t = trace(args, tc, nullptr, {}, nullptr);
    finish_segments(t, outs);
    return;
  }
  const std::vector<DynamicDim>* dyn = opts_.dynamic.empty() || dynamic_off_ ? nullptr : &opts_.dynamic;
  std::vector<int64_t>& sig = t_sig;
  build_signature(args, SigOptions{&static_args_, dyn, emulate_}, sig);
  const uint64_t h = hash_signature(sig);
  const Entry* hit = nullptr;
  std::string guard_failed;
  auto guards_hold = [&](const Entry& e) {
    if (e.guards.empty() && e.trace_guards.empty()) return true;
    std::string why = check_guards(e.guards);
    if (why.empty()) why = check_trace_guards(e.trace_guards);
    if (why.empty()) return true;
    if (guard_failed.empty()) guard_failed = why;
    return false;
  };
  if (last_hit_ < entries_.size() && entries_[last_hit_]->hash == h && entries_[last_hit_]->sig == sig &&
      guards_hold(*entries_[last_hit_])) {
    hit = entries_[last_hit_].get();
  } else {
    for (size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i]->hash == h && entries_[i]->sig == sig && guards_hold(*entries_[i])) {
        hit = entries_[i].get();
        last_hit_ = i;
        break;
      }
  }
  if (hit) {
    lk.unlock();
    stats_->hits.fetch_add(1, std::memory_order_relaxed);
    run_entry(*hit, args, outs);
    return;
  }
  bool ran = false;
  std::vector<int64_t> sig_copy = sig;
  guard_reason_ = guard_failed;
  compile(args, tc, sig_copy, h, outs, ran);
}

Entry* Engine::compile(std::span<const ArgSlot> args, TraceCall tc, const std::vector<int64_t>& sig_in, uint64_t hash,
                       std::vector<Tensor>& outs, bool& ran) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> sig = sig_in;
  std::string reason = "first call";
  if (!guard_reason_.empty()) {
    reason = guard_reason_;
    guard_reason_.clear();
  } else if (!entries_.empty()) {
    reason = describe_change(entries_[std::min(last_hit_, entries_.size() - 1)]->sig, sig);
    if (reason.empty()) reason = "signature changed";
  }
  std::vector<DynamicDim> pad;
  if (!opts_.dynamic.empty() && !dynamic_off_) {
    for (const DynamicDim& d : opts_.dynamic) {
      TPU_CHECK(d.arg >= 0 && static_cast<size_t>(d.arg) < args.size() && args[static_cast<size_t>(d.arg)].kind == ArgSlot::Kind::tensor,
                "compile('{}'): dynamic dim names arg {}, which is not a tensor argument", opts_.name, d.arg);
      const int nd = args[static_cast<size_t>(d.arg)].tensor->dim();
      TPU_CHECK(d.dim >= -nd && d.dim < nd, "compile('{}'): dynamic dim {} is out of range for arg {} of {} dims", opts_.name,
                d.dim, d.arg, nd);
      pad.push_back({d.arg, d.dim < 0 ? d.dim + nd : d.dim});
    }
  }
  Traced a = trace(args, tc, nullptr, pad, nullptr);
  if (a.broke) {
    finish_segments(a, outs);
    ran = true;
    return nullptr;
  }
  graph::Graph g = a.tracer->graph();
  auto e = std::make_unique<Entry>();
  e->writes = a.writes;
  e->user_outputs = a.user_outputs;
  e->aliases = a.aliases;
  e->grads = a.grads;
  e->guards = a.guards;
  e->fresh = a.fresh;
  e->trace_guards = a.trace_guards;
  for (const WriteBack& w : a.writes)
    for (const DynamicDim& d : pad)
      TPU_CHECK(!(a.tracer->sources()[static_cast<size_t>(w.input)].kind == graph::InputSource::Kind::arg &&
                  a.tracer->sources()[static_cast<size_t>(w.input)].arg == d.arg),
                "compile('{}'): argument {} has a dynamic dim and is written in place; in-place writes into dynamic "
                "arguments are not supported",
                opts_.name, d.arg);
  const auto& src = a.tracer->sources();
  for (size_t i = 0; i < src.size(); ++i) {
    InputBinding b;
    if (src[i].kind == graph::InputSource::Kind::arg) {
      b.kind = InputBinding::Kind::arg;
      b.arg = src[i].arg;
      b.elem = src[i].elem;
    } else {
      b.kind = InputBinding::Kind::captured;
      b.captured = a.tracer->real_inputs()[i];
    }
    e->bindings.push_back(std::move(b));
  }
  // Number arguments: runtime inputs when a second trace shows they only feed 0-d constants.
  std::vector<double> alt;
  bool any_number = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSlot& s = args[i];
    double v = s.number;
    if (s.kind == ArgSlot::Kind::number && !s.boolean && !(i < static_args_.size() && static_args_[i])) {
      any_number = true;
      v = s.integral ? v + 7919 : v * 1.6180339887 + 0.7853981;
    }
    alt.push_back(v);
  }
  if (any_number) {
    // The probe trace may fail (the other value is invalid for fn) or break: then static.
    Traced b;
    try {
      b = trace(args, tc, &alt, pad, nullptr, true);
    } catch (const Error&) {
      b.broke = true;
    }
    std::vector<std::pair<int, DType>> bound;
    std::vector<int> must_static = b.broke ? std::vector<int>{} : bind_scalar_args(g, b.tracer->graph(), args, alt, bound);
    if (b.broke)
      for (size_t i = 0; i < args.size(); ++i)
        if (args[i].kind == ArgSlot::Kind::number && !args[i].boolean) must_static.push_back(static_cast<int>(i));
    if (!must_static.empty()) {
      for (int i : must_static) {
        if (static_args_.size() <= static_cast<size_t>(i)) static_args_.resize(static_cast<size_t>(i) + 1, 0);
        static_args_[static_cast<size_t>(i)] = 1;
        log().debug("compile '{}': number arg {} changes the graph beyond a constant; it is now static (part of the key)",
                    opts_.name, i);
      }
      const std::vector<DynamicDim>* dyn = pad.empty() ? nullptr : &opts_.dynamic;
      build_signature(args, SigOptions{&static_args_, dyn, emulate_}, sig);
      hash = hash_signature(sig);
    } else {
      for (auto& [arg, dt] : bound) {
        InputBinding ib;
        ib.kind = InputBinding::Kind::scalar;
        ib.arg = arg;
        ib.dtype = dt;
        e->bindings.push_back(ib);
      }
    }
  }
  // Dynamic dims: outputs that follow a padded dim are cut back after each run.
  if (!pad.empty()) {
    std::vector<std::pair<int, int>> in_dims;
    for (const DynamicDim& d : pad)
      for (size_t i = 0; i < src.size(); ++i)
        if (src[i].kind == graph::InputSource::Kind::arg && src[i].arg == d.arg && src[i].elem < 0)
          in_dims.emplace_back(static_cast<int>(i), d.dim);
    std::string why;
    auto follow = follow_dynamic_dims(g, in_dims, why);
    if (!follow) {
      log().info("compile '{}': dynamic dims disabled (compiling exact sizes): {}", opts_.name, why);
      dynamic_off_ = true;
      build_signature(args, SigOptions{&static_args_, nullptr, emulate_}, sig);
      return compile(args, tc, sig, hash_signature(sig), outs, ran);
    }
    for (auto& [out, dim] : *follow) {
      // Which padded input dim does it follow? All pads share one bucket rule; pick by size.
      for (const DynamicDim& d : pad) {
        const Tensor& t = *args[static_cast<size_t>(d.arg)].tensor;
        if (bucket_size(t.shape()[d.dim]) == g.meta(g.outputs[static_cast<size_t>(out)]).shape[dim]) {
          e->dynamic_outs.push_back({out, dim, d.arg, d.dim});
          break;
        }
      }
    }
    e->dynamic_in = pad;
  }
  // A device's whole-graph compiler (pjrt) knows nothing of emulate_precision_casts: under it the
  // graph runs its ops one by one, as eager does.
  if (!emulate_) e->program = compile_for_device(g, opts_.name);
  // Optimize (or load the optimized graph from the disk cache).
  bool from_disk = false;
  const uint64_t key = graph::hash_combine(graph::hash_combine(graph::structural_hash(g), emulate_ ? 1 : 0),
                                           std::hash<std::string>{}(kCompilerVersion));
  std::optional<graph::Graph> opt;
  if (opts_.disk_cache && disk_cache_enabled()) opt = disk_cache_load(key, g);
  if (opt && opt->emulate_precision_casts != emulate_) {  // a hash collision: never a graph of the other mode
    log().warn("compile '{}': the disk cache entry was compiled with emulate_precision_casts {}; rebuilding it",
               opts_.name, opt->emulate_precision_casts ? "on" : "off");
    opt.reset();
  }
  if (opt) {
    from_disk = true;
  } else {
    opt = g;
    graph::optimize(*opt, pass_options());
    if (opts_.disk_cache && disk_cache_enabled()) disk_cache_store(key, *opt);
  }
  e->exe = std::make_shared<graph::Executable>(std::move(*opt), &codegen::run_region_on_chip);
  e->sig = sig;
  e->hash = hash;
  entries_.push_back(std::move(e));
  last_hit_ = entries_.size() - 1;
  note_compile(reason, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(), from_disk);
  Entry* ent = entries_.back().get();
  run_entry(*ent, args, outs);
  ran = true;
  return ent;
}

std::vector<std::string> Engine::graphs() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::string> v;
  for (const auto& e : entries_) v.push_back(graph::to_text(e->exe->graph()));
  return v;
}

void set_graph_compiler(DeviceType t, GraphCompiler c) { g_graph_compilers[static_cast<size_t>(t)].store(c); }

std::shared_ptr<Engine> make_engine(CompileOptions o) { return std::make_shared<Engine>(std::move(o)); }
void engine_call(Engine& e, std::span<const ArgSlot> args, TraceCall trace, std::vector<Tensor>& outs) {
  // A deferred eager recording (tpucore/defer.h) runs first: the arguments and the tensors the
  // function captures are then real and hold every write recorded before the call.
  tpu::flush_deferred();
  auto* rec = dynamic_cast<graph::Tracer*>(ops::interceptor());
  std::optional<ops::EagerScope> eager;  // the compiled graph's own op calls run, not recorded
  if (rec && rec->deferred()) eager.emplace();
  profiler::RecordScope scope(e.scope_name());  // one atomic load unless a profile records
  e.call(args, trace, outs);
}
std::vector<std::string> engine_graphs(const Engine& e) { return e.graphs(); }

}  // namespace tpu::jit::detail
