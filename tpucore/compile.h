/// @file
/// tpu::compile: the tracing JIT. `auto f = tpu::compile(fn, options)` returns a callable; the
/// first call with a new signature (shapes, dtypes, devices, requires_grad of the tensor
/// arguments, values of static arguments) traces fn on proxy tensors through the same op front
/// half as eager, optimizes the graph (simplify, fold, CSE, DCE, fusion, buffer planning) and
/// caches it; later calls with the same signature run the cached, fused graph directly.
///
/// Arguments: Tensor, std::vector<Tensor>, numbers (float/int: runtime inputs unless listed in
/// options.static_args; bool: always static) and any other hashable value (static). Results:
/// Tensor, std::vector<Tensor>, or a `std::tuple` / `std::pair` of Tensors.
/// Tensors captured by fn (weights in a closure) are graph inputs bound by reference: in-place
/// updates are seen without a recompile. Reading a value while tracing (item(), to_vector())
/// is a graph break; options.fullgraph turns it into a tpu::Error. The grad mode and the layout
/// (contiguous or not) of tensor arguments are part of the key.
/// In-place ops inside fn (add_, copy_, zero_, ... on intermediates, views, arguments, captured
/// weights) are functionalized: written arguments and captured tensors are updated after each
/// run, as eager would. backward() / `autograd::grad` inside fn are traced into the same graph, the
/// leaves' .grad are set after each run, and optimizer steps trace too: a whole training step
/// (zero_grad, forward, loss, backward, step) compiles into one graph (see graph/README.md).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tpucore/core/tensor.h"

namespace tpu {

/// Marks one dimension of a tensor argument as dynamic (CompileOptions::dynamic): sizes are
/// rounded up to a power-of-two bucket so nearby sizes share one compiled graph.
struct DynamicDim {
  int arg = 0;  ///< argument index (a Tensor argument)
  int dim = 0;  ///< dimension (negative counts from the end)
};

/// Options of tpu::compile.
struct CompileOptions {
  std::string name{};               ///< shown in stats and logs; default "fn<N>"
  bool fullgraph = false;           ///< a graph break is a tpu::Error
  std::vector<int> static_args{};   ///< number arguments that are part of the cache key
  std::vector<DynamicDim> dynamic{};  ///< dims compiled once per power-of-two bucket
  int warn_after_recompiles = 8;    ///< warn (naming the changing input) past this many compiles
  bool optimize = true;             ///< simplify / fold / cse / dce
  bool fuse = true;                 ///< fusion into regions and buffer planning
  int verify = -1;                  ///< run the verifier after every pass: -1 debug builds only
  bool disk_cache = true;           ///< when TPU_CACHE_DIR is set
  /// Eager-equal numerics, as PyTorch Inductor's emulate_precision_casts: fused cpu and chip
  /// kernels round every intermediate to its traced dtype (bf16, f16) where the eager op would
  /// have materialised it, and compute each op with the eager kernel's f32 math, so results equal
  /// eager ones bit for bit on the same device. 1 on, 0 off, -1 the process default
  /// (jit::set_emulate_precision_casts). Part of the cache key.
  int emulate_precision_casts = -1;
};

namespace jit {

/// Counters of one compiled function.
struct FunctionStats {
  /// CompileOptions::name (or the default "fn<N>").
  std::string name;
  /// Traces done (first call and every recompile).
  int64_t compiles = 0;
  /// Calls served from the cache.
  int64_t hits = 0;
  /// Graph breaks met while tracing.
  int64_t breaks = 0;
  int64_t disk_hits = 0;  ///< compiles that loaded the optimized graph from TPU_CACHE_DIR
  std::vector<std::string> reasons;        ///< one per compile: "first call", "arg 0 shape ..."
  std::vector<std::string> break_reasons;  ///< distinct graph-break causes
  double compile_ms = 0;                   ///< total time spent tracing and optimizing
};
/// Counters of every compiled function (jit::stats()).
struct Stats {
  /// One entry per function.
  std::vector<FunctionStats> functions;
  /// The entry named `name`, or null.
  /// The pointer points into this snapshot: keep the Stats alive while using it (calling find
  /// on a temporary, `jit::stats().find(...)`, would dangle, so it does not compile).
  const FunctionStats* find(std::string_view name) const&;
  const FunctionStats* find(std::string_view name) const&& = delete;
};
/// A snapshot of the counters of every compiled function alive or dead in this process.
Stats stats();
/// Zeroes the counters of every function.
void reset_stats();

/// Sets the process default of CompileOptions::emulate_precision_casts (off unless the environment
/// variable TPU_EMULATE_PRECISION_CASTS is 1). Read at every call of a compiled function that
/// leaves the option at -1: changing it recompiles (the reason names it), never reuses a graph
/// compiled under the other setting.
void set_emulate_precision_casts(bool on);
/// The process default of CompileOptions::emulate_precision_casts.
bool emulate_precision_casts();

// Text and JSON of the graphs a compiled function holds (for debugging and tests).
namespace detail {

struct ArgSlot {
  enum class Kind : uint8_t { tensor, tensor_list, number, other } kind = Kind::other;
  const Tensor* tensor = nullptr;
  const std::vector<Tensor>* list = nullptr;
  double number = 0;
  bool integral = false;
  bool boolean = false;
  uint64_t other_hash = 0;
};
struct TraceCall {
  void* ctx;
  void (*fn)(void* ctx, std::span<const ArgSlot> args, std::vector<Tensor>& outs);
};
class Engine;
std::shared_ptr<Engine> make_engine(CompileOptions o);
void engine_call(Engine& e, std::span<const ArgSlot> args, TraceCall trace, std::vector<Tensor>& outs);
std::vector<std::string> engine_graphs(const Engine& e);  ///< printed optimized graphs

template <class T>
ArgSlot make_slot(const T& v) {
  using D = std::decay_t<T>;
  ArgSlot s;
  if constexpr (std::is_same_v<D, Tensor>) {
    s.kind = ArgSlot::Kind::tensor;
    s.tensor = &v;
  } else if constexpr (std::is_same_v<D, std::vector<Tensor>>) {
    s.kind = ArgSlot::Kind::tensor_list;
    s.list = &v;
  } else if constexpr (std::is_arithmetic_v<D>) {
    s.kind = ArgSlot::Kind::number;
    s.number = static_cast<double>(v);
    s.integral = std::is_integral_v<D>;
    s.boolean = std::is_same_v<D, bool>;
  } else {
    static_assert(std::is_invocable_v<std::hash<D>, const D&>,
                  "tpu::compile: a non-tensor, non-number argument must be hashable (it becomes part of the cache key)");
    s.kind = ArgSlot::Kind::other;
    s.other_hash = std::hash<D>{}(v);
  }
  return s;
}

template <class R>
void flatten_result(const R& r, std::vector<Tensor>& outs) {
  if constexpr (std::is_same_v<R, Tensor>) {
    outs.push_back(r);
  } else if constexpr (std::is_same_v<R, std::vector<Tensor>>) {
    outs.insert(outs.end(), r.begin(), r.end());
  } else {
    std::apply([&](const auto&... xs) { (flatten_result(xs, outs), ...); }, r);
  }
}

template <class R>
struct ResultBuilder;
template <>
struct ResultBuilder<Tensor> {
  static Tensor build(std::vector<Tensor>& o) { return std::move(o.at(0)); }
};
template <>
struct ResultBuilder<std::vector<Tensor>> {
  static std::vector<Tensor> build(std::vector<Tensor>& o) { return std::move(o); }
};
template <class... Ts>
struct ResultBuilder<std::tuple<Ts...>> {
  static std::tuple<Ts...> build(std::vector<Tensor>& o) {
    static_assert((std::is_same_v<Ts, Tensor> && ...), "tpu::compile: tuple results must hold Tensors");
    return [&]<size_t... I>(std::index_sequence<I...>) { return std::tuple<Ts...>(std::move(o.at(I))...); }(
        std::index_sequence_for<Ts...>{});
  }
};
template <class A, class B>
struct ResultBuilder<std::pair<A, B>> {
  static std::pair<A, B> build(std::vector<Tensor>& o) { return {std::move(o.at(0)), std::move(o.at(1))}; }
};

template <class P>
decltype(auto) rebuild_arg(const ArgSlot& s, const P& original) {
  using D = std::decay_t<P>;
  if constexpr (std::is_same_v<D, Tensor>) return static_cast<const Tensor&>(*s.tensor);
  else if constexpr (std::is_same_v<D, std::vector<Tensor>>) return static_cast<const std::vector<Tensor>&>(*s.list);
  else if constexpr (std::is_arithmetic_v<D>) return static_cast<D>(s.number);
  else return static_cast<const P&>(original);
}

}  // namespace detail
}  // namespace jit

/// The callable tpu::compile returns: call it like the wrapped function. Copies share the
/// cache. Errors while tracing (and, with fullgraph, graph breaks) are tpu::Error.
template <class F>
class Compiled {
 public:
  /// Wraps `fn` (use tpu::compile).
  Compiled(F fn, CompileOptions o) : fn_(std::make_shared<F>(std::move(fn))), engine_(jit::detail::make_engine(std::move(o))) {}

  /// Runs the compiled graph for these arguments, tracing and compiling first when their
  /// signature is new; returns what fn returns.
  template <class... Args>
  auto operator()(const Args&... args) const {
    using R = std::decay_t<std::invoke_result_t<F&, const Args&...>>;
    std::array<jit::detail::ArgSlot, sizeof...(Args)> slots{jit::detail::make_slot(args)...};
    struct Ctx {
      F* fn;
      std::tuple<const Args&...> orig;
    } ctx{fn_.get(), std::tuple<const Args&...>(args...)};
    jit::detail::TraceCall tc{&ctx, [](void* c, std::span<const jit::detail::ArgSlot> s, std::vector<Tensor>& outs) {
                                auto* cx = static_cast<Ctx*>(c);
                                R r = [&]<size_t... I>(std::index_sequence<I...>) -> R {
                                  return (*cx->fn)(jit::detail::rebuild_arg(s[I], std::get<I>(cx->orig))...);
                                }(std::index_sequence_for<Args...>{});
                                jit::detail::flatten_result(r, outs);
                              }};
    std::vector<Tensor> outs;
    jit::detail::engine_call(*engine_, slots, tc, outs);
    return jit::detail::ResultBuilder<R>::build(outs);
  }

  /// The optimized graphs this function holds, printed (one per cached signature).
  std::vector<std::string> graphs() const { return jit::detail::engine_graphs(*engine_); }
  /// The wrapped function (tpu::export_stablehlo traces it, tpucore/export.h).
  const F& function() const { return *fn_; }

 private:
  std::shared_ptr<F> fn_;
  std::shared_ptr<jit::detail::Engine> engine_;
};

/// Wraps `fn` into a compiled callable (see the file's description); nothing is traced before
/// the first call.
template <class F>
Compiled<std::decay_t<F>> compile(F&& fn, CompileOptions o = {}) {
  return Compiled<std::decay_t<F>>(std::forward<F>(fn), std::move(o));
}

}  // namespace tpu
