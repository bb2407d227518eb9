// Defer-and-fuse eager mode (tpucore/defer.h): a tracer installed for a scope records eager op
// calls; a flush runs the recording through the jit's graph-break path (passes, segment cache).
#include "tpucore/defer.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <exception>

#include "graph/tracer.h"
#include "tpucore/autograd.h"
#include "tpucore/core/env.h"
#include "tpucore/core/hooks.h"
#include "tpucore/core/log.h"
#include "tpucore/core/parallel.h"
#include "tpucore/jit/internal.h"

namespace tpu {
namespace detail {
namespace {

bool deferred_hook(const Tensor& proxy) {
  const TraceValue* tv = proxy.impl().trace.get();
  return tv && tv->tracer && tv->tracer->deferred();
}
const bool g_hook_installed = (set_proxy_deferred_hook(&deferred_hook), true);

size_t default_max_nodes() {
  static const size_t n = static_cast<size_t>(env_int("TPU_DEFER_MAX_NODES", 1, 1 << 20, "512").value_or(512));
  return n;
}

class DeferTracer final : public graph::Tracer {
 public:
  explicit DeferTracer(size_t max_nodes) : max_nodes_(max_nodes) {
    (void)g_hook_installed;
    set_deferred(true);
    set_break_handler([](graph::Tracer& t, const Tensor& p, const std::string& why) {
      return static_cast<DeferTracer&>(t).run(p, why);
    });
  }

  bool intercept(const ops::OpDef& op, std::span<const Tensor> inputs, const ops::Attrs& attrs,
                 const ops::MetaResult& meta, std::span<Tensor> outputs) override {
    if (in_copy()) return Tracer::intercept(op, inputs, attrs, meta, outputs);  // part of one write
    bool eager = op.has(ops::kRandom);
    if (!eager && is_grad_enabled()) {
      for (const Tensor& t : inputs) eager |= t.requires_grad();
    }
    if (eager) {
      // A random op flushes (the recording before it runs in program order); an op that runs
      // eagerly because of autograd flushes only when it depends on the recording: a recorded
      // input, or real memory the recording reads or writes (the op may write its inputs). Else
      // it runs now and the recording stays pending (cross_entropy's eager ops between its
      // recorded target checks cost one flush each before).
      if (pending() && (op.has(ops::kRandom) || depends_on_recording(inputs)))
        flush(fmt::format("'{}' runs eagerly", op.name));
      return false;  // ops::call runs it (its proxy inputs are real now)
    }
    if (graph().nodes.size() >= max_nodes_) flush(fmt::format("{} recorded ops (the limit)", max_nodes_));
    for (const Tensor& t : inputs)
      if (!t.is_proxy()) before_real_access(t, false);
    return Tracer::intercept(op, inputs, attrs, meta, outputs);
  }

  void before_real_access(const Tensor& t, bool write) override {
    if (aliases_captured(t, write)) flush("another view of memory the recording writes");
  }

  // Whether a flush has anything to do: recorded ops, captured tensors (a copy_ of equal shape and
  // dtype records no op, only a write-back), or proxies (inputs' views) to fill.
  bool pending() const { return !graph().nodes.empty() || !real_inputs().empty() || !live_proxies().empty(); }

  void flush(const std::string& why) {
    if (pending()) run(Tensor(), why);
  }

  bool flushing() const { return flushing_; }

  // Whether an op run eagerly now would read a recorded value, or real memory that the pending
  // recording reads or writes (its captured inputs, their views included).
  bool depends_on_recording(std::span<const Tensor> inputs) const {
    for (const Tensor& t : inputs) {
      if (!t.defined()) continue;
      if (t.is_proxy()) return true;
      const Storage* mem = t.impl().storage.get();
      if (!mem) continue;
      for (const Tensor& in : real_inputs())
        if (in.impl().storage.get() == mem) return true;
    }
    return false;
  }

  Tensor run(const Tensor& proxy, const std::string& why) {
    struct Busy {
      bool& b;
      explicit Busy(bool& f) : b(f) { b = true; }
      ~Busy() { b = false; }
    } busy(flushing_);
    try {
      return jit::detail::flush_deferred(*this, proxy, why);
    } catch (const std::exception& e) {
      // The recording is dropped: its tensors now fail clearly ("a finished trace"); new ops work.
      for (auto& [id, impl] : live_proxies())
        if (impl->trace) impl->trace->tracer = nullptr;
      reset_segment();
      throw Error(fmt::format("deferred eager: flush ({}) failed: {}", why, e.what()));
    }
  }

 private:
  size_t max_nodes_;
  bool flushing_ = false;
};

thread_local DeferState* t_current = nullptr;

}  // namespace

struct DeferState {
  DeferTracer tracer;
  DeferState* prev;
  explicit DeferState(size_t max_nodes) : tracer(max_nodes), prev(t_current) {
    ops::set_interceptor(&tracer);
    t_current = this;
  }
  ~DeferState() {
    // Proxies left by a failed flush must not point at the tracer being destroyed.
    for (auto& [id, impl] : tracer.live_proxies())
      if (impl->trace) impl->trace->tracer = nullptr;
    ops::set_interceptor(nullptr);
    t_current = prev;
  }
  DeferState(const DeferState&) = delete;
  DeferState& operator=(const DeferState&) = delete;
};

namespace {
// Host access to memory (Tensor::raw_data, to(device)): a deferred proxy is read (a flush); a
// real tensor whose memory the pending recording reads or writes flushes it first, so a raw
// read sees the recorded writes and a raw write does not overtake the recorded reads.
void access_hook(const Tensor& t) {
  const TensorImpl& im = t.impl();
  if (!im.storage) {
    if (im.trace && deferred_hook(t)) (void)materialize_proxy(t, "data()");
    return;
  }
  DeferState* st = t_current;
  if (!st || st->tracer.flushing()) return;  // not recording, or the flush's own kernels
  const Storage* mem = im.storage.get();
  for (const Tensor& in : st->tracer.real_inputs())
    if (in.storage().get() == mem) {
      st->tracer.flush("host access to a tensor the recording uses");
      return;
    }
}
const bool g_access_installed = (set_deferred_access_hook(&access_hook), true);

// TPU_EAGER=defer: every thread records from its first op call on (installed once per thread;
// never flushed at thread exit: values are flushed when read).
struct EnvState {
  std::unique_ptr<DeferState> state;
};
ops::DispatchInterceptor* env_interceptor() {
  thread_local EnvState env;
  if (env.state || in_parallel_region()) return nullptr;  // kernels' worker chunks stay eager  // installed once; a null interceptor now is a scope's choice
  env.state = std::make_unique<DeferState>(default_max_nodes());
  return &env.state->tracer;
}
const bool g_env_mode = [] {
  const char* e = std::getenv("TPU_EAGER");
  const std::string v = e ? e : "";
  if (v == "defer") ops::set_default_interceptor_hook(&env_interceptor);
  else if (!v.empty() && v != "plain") log().warn("TPU_EAGER='{}' is not 'defer' or 'plain'; eager ops run as usual", v);
  return v == "defer";
}();
// In env mode, starts this thread's recording now (a guard or a query before the first op).
void ensure_env_started() {
  if (g_env_mode && ops::interceptor() == nullptr) (void)env_interceptor();
}
}  // namespace

}  // namespace detail

bool eager_defer_env() { return detail::g_env_mode; }

DeferredEager::DeferredEager(size_t max_nodes) : uncaught_(std::uncaught_exceptions()) {
  (void)detail::g_access_installed;
  detail::ensure_env_started();
  if (ops::interceptor() != nullptr) return;  // tracing (compile) or already deferred
  state_ = std::make_unique<detail::DeferState>(max_nodes ? max_nodes : detail::default_max_nodes());
}

DeferredEager::~DeferredEager() noexcept(false) {
  if (!state_) return;
  std::unique_ptr<detail::DeferState> st = std::move(state_);  // uninstalled when this returns
  try {
    st->tracer.flush("end of the DeferredEager scope");
  } catch (const std::exception& e) {
    if (std::uncaught_exceptions() > uncaught_) {
      log().error("{}", e.what());
      return;
    }
    throw;
  }
}

void DeferredEager::flush() {
  if (state_) state_->tracer.flush("flush()");
}

void flush_deferred() {
  if (detail::t_current) detail::t_current->tracer.flush("flush_deferred()");
}

EagerIfDeferred::EagerIfDeferred() {
  auto* t = dynamic_cast<graph::Tracer*>(ops::interceptor());
  if (!t || !t->deferred()) return;
  flush_deferred();
  prev_ = t;
  ops::set_interceptor(nullptr);
}

EagerIfDeferred::~EagerIfDeferred() {
  if (prev_) ops::set_interceptor(static_cast<graph::Tracer*>(prev_));
}

bool eager_deferred() {
  detail::ensure_env_started();
  return detail::t_current != nullptr;
}

}  // namespace tpu
