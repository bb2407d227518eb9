/// @file
/// tpu::export_stablehlo: a traced function (or a compiled one) as a StableHLO module in MLIR text, generic
/// form ("stablehlo.add"(%a, %b) : (...) -> ...), the way go-xla writes it, for a PJRT plugin
/// (libtpu, a CPU plugin) to compile.
///
/// Version: the ops and attribute encodings of StableHLO 1.0 (the spec of openxla/stablehlo,
/// stable since 2024: dense i64 arrays written `array<i64: ...>`, enum attributes
/// `#stablehlo<comparison_direction LT>`, `#stablehlo.dot<...>` dimension numbers). No VHLO
/// portable artifact is written; a consumer parses the text with a StableHLO of version >= 1.0.
/// StableHloSyntax::mlir14 writes the same module in the attribute syntax MLIR 14 parses
/// (`dense<[..]> : tensor<Nxi64>`, `#stablehlo<"comparison_direction LT">`), which is what the
/// test checks with Debian's mlir-opt-14 (StableHLO ops are unregistered there, so only the
/// generic structure, the SSA form and the types are checked, not the ops' semantics).
///
/// Ops: elementwise arithmetic and math (erf, hence exact gelu, decomposed with a polynomial of
/// absolute error <= 1.5e-7), compare/select/clamp, convert, views (reshape, transpose,
/// broadcast_in_dim, slice), concatenate, dot_general (matmul with batch broadcasting, linear),
/// reduce (sum, mean, prod, amax, amin, all, any), softmax / log_softmax / layer_norm / rms_norm /
/// rotary_embedding / scaled_dot_product_attention decomposed, var / std (two passes), arange
/// (iota), full; index_select and embedding as `stablehlo.gather` (one collapsed dim, full
/// slices), gather(x, dim, index) as a point gather over full coordinates (iota for the other
/// dims), scatter_add as `stablehlo.scatter` with an add region. Out-of-range ids in an exported
/// module follow StableHLO (gather clamps each start index into the operand, scatter skips the
/// update), where tpucore's kernels raise a tpu::Error; eager ops on a pjrt device check the ids
/// on the host first and raise that error. Any other op (argmax, random, ...) makes the export a
/// tpu::Error naming every such op.
/// Tensors the function captures (weights in a closure) and constants are written as
/// `stablehlo.constant`s; the example inputs become the function's arguments, in order.
#pragma once

#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "graph/stablehlo_options.h"
#include "tpucore/compile.h"
#include "tpucore/core/error.h"

namespace tpu {

namespace detail {
/// Traces fn with proxies of `example_inputs` and writes the module (tpucore/jit/export.cpp).
std::string export_traced(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& example_inputs, const StableHloOptions& opt);
}  // namespace detail

namespace detail {
template <class T>
struct is_compiled : std::false_type {};
template <class F>
struct is_compiled<Compiled<F>> : std::true_type {};
}  // namespace detail

/// Traces fn (called with the proxies of `example_inputs`, returning a Tensor or a
/// std::vector<Tensor>) and writes the module; the inputs' shapes and dtypes become the
/// argument types. A graph break (reading a value inside fn) or an op without a StableHLO
/// counterpart is a tpu::Error naming it.
template <class F>
  requires(!::tpu::detail::is_compiled<std::decay_t<F>>::value) && std::is_invocable_v<F&, const std::vector<Tensor>&>
std::string export_stablehlo(F&& fn, const std::vector<Tensor>& example_inputs, const StableHloOptions& opt = {}) {
  using R = std::decay_t<std::invoke_result_t<F&, const std::vector<Tensor>&>>;
  return ::tpu::detail::export_traced(
      [&fn](const std::vector<Tensor>& in) {
        if constexpr (std::is_same_v<R, Tensor>) return std::vector<Tensor>{fn(in)};
        else return std::vector<Tensor>(fn(in));
      },
      example_inputs, opt);
}

namespace detail {
template <size_t>
using TensorArg = const Tensor&;
/// Calls fn with the tensors of `a` as its N arguments when it takes N Tensors.
template <class F, size_t N>
bool call_with_tensors(const F& fn, const std::vector<Tensor>& a, std::vector<Tensor>& outs) {
  return [&]<size_t... I>(std::index_sequence<I...>) {
    if constexpr (std::is_invocable_v<const F&, TensorArg<I>...>) {
      if (a.size() != N) return false;
      auto r = fn(a[I]...);
      jit::detail::flatten_result(r, outs);
      return true;
    } else {
      return false;
    }
  }(std::make_index_sequence<N>{});
}
}  // namespace detail

/// A tpu::compile'd function taking 1 to 8 Tensor arguments: the function it wraps, traced with
/// `example_inputs` as its arguments (the module is the function's graph before the JIT's passes).
template <class F>
std::string export_stablehlo(const Compiled<F>& f, const std::vector<Tensor>& example_inputs,
                             const StableHloOptions& opt = {}) {
  const F& fn = f.function();
  return ::tpu::detail::export_traced(
      std::function<std::vector<Tensor>(const std::vector<Tensor>&)>([&fn](const std::vector<Tensor>& a) {
        std::vector<Tensor> outs;
        const bool ok = [&]<size_t... N>(std::index_sequence<N...>) {
          return (::tpu::detail::call_with_tensors<F, N + 1>(fn, a, outs) || ...);
        }(std::make_index_sequence<8>{});
        TPU_CHECK(ok, "export_stablehlo: the compiled function does not take {} Tensor argument(s)", a.size());
        return outs;
      }),
      example_inputs, opt);
}

}  // namespace tpu
