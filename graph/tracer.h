// The tracer: an ops::DispatchInterceptor that records every op call (after the op's own meta
// function checked the arguments and inferred the outputs) into a Graph, and hands back proxy
// tensors (no storage, TensorImpl::trace set). Real tensors met as op inputs become graph
// inputs (captured by reference); wrapped numbers become constants. Reading a proxy's value
// (item(), to_vector()) calls the break handler: a graph break.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/ir.h"

namespace tpu {
namespace graph {
class Tracer;
// One view op applied to a value (replayed when the tensor it views is written in place).
struct ViewStep {
  const ops::OpDef* op = nullptr;
  ops::Attrs attrs;
  ValueMeta out;
};
}  // namespace graph
// Set on proxy tensors (declared in tpucore/tensor.h); shared by aliases of one TensorImpl
// (detach(), autograd's saved tensors). In-place writes are functionalized: `id` moves to the
// value computed out of place and `version` is bumped (so a saved proxy detects the write).
// A proxy made by a view op records the tensor family it views (`base`, a root) and the view ops
// from the root's value; a write into the view rewrites the root, and every live view of a root
// is re-derived when the root changes. The tracer also keeps a root per captured real tensor.
struct TraceValue {
  graph::Tracer* tracer = nullptr;
  uint64_t epoch = 0;
  graph::ValueId id = graph::kNoValue;
  uint64_t version = 0;
  std::shared_ptr<TraceValue> base;             // views: the root they alias
  std::vector<graph::ViewStep> chain;           // views: view ops from the root's value
  std::vector<std::weak_ptr<TraceValue>> views;  // roots: views made of them
  int input = -1;                               // roots: graph input it stands for (args, captured)
  graph::ValueId input_value = graph::kNoValue;  // roots with an input: the input's value id
};
}  // namespace tpu

namespace tpu::graph {

// Where a graph input comes from.
struct InputSource {
  enum class Kind : uint8_t { arg, captured } kind = Kind::captured;
  int arg = -1;   // argument index (kind arg)
  int elem = -1;  // element of a tensor-list argument, or -1
};

class Tracer : public ops::DispatchInterceptor {
 public:
  // Called on a graph break with the proxy whose value is needed and a description of the
  // cause; returns the real value. Without a handler a break is a tpu::Error.
  using BreakHandler = std::function<Tensor(Tracer&, const Tensor& proxy, const std::string& why)>;

  Tracer();
  ~Tracer() override;
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // A graph input for argument `arg` (element `elem` of a list); returns its proxy.
  Tensor add_arg(const Tensor& real, int arg, int elem = -1);
  // Records the outputs of the traced function.
  void set_outputs(std::span<const Tensor> outs);

  bool intercept(const ops::OpDef& op, std::span<const Tensor> inputs, const ops::Attrs& attrs,
                 const ops::MetaResult& meta, std::span<Tensor> outputs) override;

  // copy_ while tracing (every in-place op ends in one): records the new value of `self` (src
  // broadcast and cast to self's dtype) out of place and rebinds self, its base and its views.
  void functional_copy(const Tensor& self, const Tensor& src);
  // Graph inputs written in place (input position, value to write back), in input order. Fails
  // when a written input shares storage with another input (aliasing the graph cannot see).
  std::vector<std::pair<int, ValueId>> mutations() const;
  // For each traced output: the graph input it is (or views, with the view ops) when it aliases
  // a written input, so the caller can return the real tensor instead of a copy.
  struct OutputAlias {
    int output = 0, input = -1;
    std::vector<ViewStep> chain;
  };
  std::vector<OutputAlias> output_aliases(std::span<const Tensor> outs) const;
  // Per traced output: 1 when it is (a view of) a tensor made inside the function, which must not
  // come back as a caller's tensor even when the optimizer reduced it to an input (x * 1 -> x).
  std::vector<char> fresh_outputs(std::span<const Tensor> outs) const;

  // Writes traced so far into the captured tensor t (or another handle on the same view of its
  // memory); autograd adds it to the storage version of saved tensors.
  uint64_t real_version(const Tensor& t) const;
  // Whether the eager tensor behind a proxy of this trace would be contiguous (contiguous() then
  // returns it instead of recording a copy, as eager does).
  bool eager_contiguous(const Tensor& proxy) const;
  // The value of a tensor in this trace (a real tensor becomes a captured input).
  ValueId value_id(const Tensor& t) { return value_of(t); }

  Graph& graph() { return graph_; }
  const Graph& graph() const { return graph_; }
  // Per graph input: where it comes from and the real tensor seen while tracing.
  const std::vector<InputSource>& sources() const { return sources_; }
  const std::vector<Tensor>& real_inputs() const { return real_inputs_; }

  void set_break_handler(BreakHandler h) { on_break_ = std::move(h); }
  // Defer-and-fuse eager mode: printing or moving a proxy of this tracer reads its value (a
  // flush) instead of showing "<traced>" / failing as inside compile.
  void set_deferred(bool on) { deferred_ = on; }
  bool deferred() const { return deferred_; }
  // Inside functional_copy: the ops it records are one write (a deferred flush must wait).
  bool in_copy() const { return copy_depth_ > 0; }
  // Graph-break support: the values whose proxies are still alive (in value-id order).
  std::vector<std::pair<ValueId, std::shared_ptr<TensorImpl>>> live_proxies() const;
  // Another TensorImpl sharing a proxy's TraceValue (detach(), autograd's saved tensors): it is
  // materialized with the others at a graph break (deferred eager mode reads it afterwards).
  void add_alias(std::shared_ptr<TensorImpl> impl) {
    if (impl->trace && impl->trace->tracer == this && impl->trace->epoch == epoch_) proxies_.push_back(std::move(impl));
  }
  // Whether real tensor t shares memory with a captured input through another view, when t is
  // written (write) or that input was written in the recording (read): such a recording could
  // not be run as one graph (see mutations()).
  bool aliases_captured(const Tensor& t, bool write) const;
  // Deferred eager mode: called before a real tensor is read or written by a recorded op; the
  // defer tracer flushes when aliases_captured(t, write).
  virtual void before_real_access(const Tensor& t, bool write) {
    (void)t;
    (void)write;
  }
  // Starts a new segment: an empty graph; old proxies must have been materialized.
  void reset_segment();
  // Makes a proxy real in place (storage, strides) so user code can keep using it.
  static void fill_proxy(TensorImpl& proxy, const Tensor& real);
  Tensor on_break(const Tensor& proxy, const std::string& why);

 private:
  ValueId value_of(const Tensor& t);
  Tensor make_proxy(ValueId id);
  std::shared_ptr<TraceValue> root_of(const Tensor& t);
  std::shared_ptr<TraceValue> same_view_root(const Tensor& t) const;
  bool eager_viewable(const ops::OpDef& view_op, const Tensor& in, const ops::Attrs& attrs) const;
  Tensor eager_layout(const Tensor& proxy) const;  // family root (captures real tensors)
  void rebind_root(TraceValue& root, ValueId v, const TraceValue* skip);
  ValueId replay(ValueId v, const std::vector<ViewStep>& chain);
  ValueId scatter_into_root(const TraceValue& root, const std::vector<ViewStep>& chain, ValueId v, const Tensor& self);
  ValueId coerce_source(const Tensor& self, const Tensor& src);

  Graph graph_;
  uint64_t epoch_;
  std::vector<InputSource> sources_;
  std::vector<Tensor> real_inputs_;
  std::unordered_map<const TensorImpl*, std::shared_ptr<TraceValue>> captured_;  // real tensor -> root
  std::vector<std::shared_ptr<TraceValue>> input_roots_;  // per graph input (args and captured)
  std::vector<Tensor> aliases_;  // other handles on captured tensors met while tracing
  std::vector<std::weak_ptr<TensorImpl>> proxies_;  // every proxy made in this segment
  BreakHandler on_break_;
  bool in_break_ = false;
  bool deferred_ = false;
  int copy_depth_ = 0;
};

// Runs a recorded view step on a real tensor.
Tensor apply_view_step(const Tensor& x, const ViewStep& s);

// Installs a tracer as this thread's interceptor for a scope (restores the previous one).
class TraceScope {
 public:
  explicit TraceScope(ops::DispatchInterceptor* t);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  ops::DispatchInterceptor* prev_;
};

// Human-readable name of the function that called into the library at a break (best effort).
std::string caller_site(int skip);

}  // namespace tpu::graph
