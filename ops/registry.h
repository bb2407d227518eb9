// The op registry. Each op is declared once, as one OpDef: its name and arity, the meta
// function (argument checks + output shape/dtype, which also runs on traced proxy tensors),
// the reference CPU kernel, and slots that later layers fill: per-device kernels registered by
// backends, the backward formula, and the lowering rule used by codegen.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "ops/attrs.h"
#include "tpucore/core/tensor.h"

namespace tpu::ops {

inline constexpr int kMaxOutputs = 4;

struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};

// Filled by an op's meta function.
struct MetaResult {
  std::array<TensorMeta, kMaxOutputs> outputs;
  int num_outputs = 1;
  // Inputs whose bit is set in cast_mask are converted to cast_to before the kernel runs
  // (type promotion happens once, here, not in each kernel).
  uint32_t cast_mask = 0;
  DType cast_to = DType::f32;
  // For view ops: output i aliases input alias_of[i] (or -1).
  TensorMeta& out(int i = 0) { return outputs[static_cast<size_t>(i)]; }
};

struct MetaArgs {
  const struct OpDef& op;
  std::span<const Tensor> inputs;
  const Attrs& attrs;
};

struct KernelArgs {
  const struct OpDef& op;
  std::span<const Tensor> inputs;  // after the casts requested by the meta function
  std::span<Tensor> outputs;       // allocated by the front half: contiguous, on the op's device
  const Attrs& attrs;
};

using MetaFn = void (*)(const MetaArgs&, MetaResult&);
struct BackwardArgs;
// Derivative formula: given the gradients of the outputs, fills grad_inputs[i] for every input i
// whose bit is set in args.needs (left undefined: no gradient flows there). Written in terms of
// other tpu ops, so it runs on any device and traces.
using BackwardFn = void (*)(const BackwardArgs&, std::span<Tensor> grad_inputs);
// Which inputs/outputs the formula reads, given the mask of inputs that need a gradient (so an
// op saves only what its backward will use; inputs beyond bit 31 follow bit 31).
using SavesFn = void (*)(uint32_t needs, uint32_t& save_inputs, uint32_t& save_outputs);
struct BackwardDef {
  BackwardFn fn = nullptr;
  uint32_t save_inputs = 0;   // used when saves is null
  uint32_t save_outputs = 0;
  SavesFn saves = nullptr;
};
using KernelFn = void (*)(const KernelArgs&);
// View ops make their output as a view of input 0 instead of running a kernel.
using ViewFn = Tensor (*)(const Tensor& self, const Attrs& attrs, const TensorMeta& out);

enum OpFlags : uint32_t {
  kNone = 0,
  kElementwise = 1u << 0,  // output element i depends only on input elements i (after broadcast)
  kReduction = 1u << 1,
  kView = 1u << 2,         // output aliases input 0 (no data movement)
  kCreation = 1u << 3,     // no tensor inputs
  kRandom = 1u << 4,       // reads the random generator
  kNonDifferentiable = 1u << 5,
  kVariadic = 1u << 6,     // any number of tensor inputs (cat, stack)
  kFloat8 = 1u << 7,       // takes or returns float8 tensors (data movement); other ops refuse them
};

struct OpDef {
  std::string name;
  int num_inputs = 1;          // -1 with kVariadic
  uint32_t flags = kNone;
  MetaFn meta = nullptr;
  KernelFn cpu = nullptr;      // the reference kernel
  ViewFn view = nullptr;       // for kView ops
  std::string doc;             // one line: what the op computes
  // Filled by backends / later layers (inversion of dependency: ops/ includes none of them).
  std::array<KernelFn, kNumDeviceTypes> kernels{};
  BackwardDef backward{};      // autograd formula, set by the autograd layer (set_backward)
  void* lowering = nullptr;    // codegen rule, set by codegen

  bool has(OpFlags f) const { return (flags & f) != 0; }
};

// Registers an op (at most once per name); returns the stored definition.
const OpDef& define(OpDef def);
// Looks an op up by name; nullptr when unknown.
const OpDef* find_op(std::string_view name);
// Every registered op, in registration order.
std::vector<const OpDef*> all_ops();
// Lets a backend install its kernel for an op.
void register_kernel(std::string_view op, DeviceType device, KernelFn fn);
// Lets a backend run every op that has a cpu kernel (views excepted) through one kernel of its
// own (pjrt: each op exported as StableHLO and compiled by the plugin): installed on the ops
// defined now, and on every such op defined later that registered no kernel of its own there.
void register_generic_kernel(DeviceType device, KernelFn fn);
// Registrations (kernels, lowerings, backward formulas) made for op names that no define() has
// matched: registration may run before the op's definition during static initialization, so it
// is kept until then; once the program runs, a name left here is a misspelt or removed op.
std::vector<std::string> undefined_registrations();
// Lets codegen install an op's lowering rule (OpDef::lowering; the type is codegen's).
void set_lowering(std::string_view op, void* rule);

// Installs the derivative formula of an op (the autograd layer calls it for every op family).
// An op that is not defined yet receives it when it is defined (static initialization order).
void set_backward(std::string_view op, BackwardDef def);

// What a derivative formula sees: the call's attrs, the metadata of every input, the inputs and
// outputs the formula asked to save (others undefined), and one gradient per output
// (undefined when that output received none).
struct BackwardArgs {
  const OpDef& op;
  const Attrs& attrs;
  std::span<const TensorMeta> input_meta;
  std::span<const Tensor> inputs;
  std::span<const Tensor> outputs;
  std::span<const Tensor> grad_outputs;
  uint32_t needs = 0;  // bit i: input i needs a gradient (inputs beyond 31 follow bit 31)
  bool needs_grad(size_t i) const { return (needs >> (i < 31 ? i : 31)) & 1u; }
};

// Interceptor used by the tracer: when active (or when any input is a proxy), op calls are
// recorded instead of executed. Set by the graph layer.
class DispatchInterceptor {
 public:
  virtual ~DispatchInterceptor() = default;
  // Returns true when it handled the call (outputs filled with proxies).
  virtual bool intercept(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs, const MetaResult& meta,
                         std::span<Tensor> outputs) = 0;
};
void set_interceptor(DispatchInterceptor* i);  // thread-local
DispatchInterceptor* interceptor();
// Called by an op call on a thread with no interceptor; may return one to install for the thread
// (TPU_EAGER=defer: the thread's deferred eager recording, made once). Unset: one atomic load.
using DefaultInterceptorHook = DispatchInterceptor* (*)();
void set_default_interceptor_hook(DefaultInterceptorHook h);
// Op calls run eagerly on this thread for a scope (data movement whose result is read at once,
// e.g. to(device) of a real tensor): no interceptor, and the default hook installs none.
class EagerScope {
 public:
  EagerScope();
  ~EagerScope();
  EagerScope(const EagerScope&) = delete;
  EagerScope& operator=(const EagerScope&) = delete;

 private:
  DispatchInterceptor* prev_;
};

// Called after an eager op ran, with its inputs and outputs (autograd records its tape here).
using PostCallHook = void (*)(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs,
                              std::span<Tensor> outputs);
void set_post_call_hook(PostCallHook h);
// Called by every in-place op (add_, copy_, fill_, ...) before it writes self, with the op's
// public name; `op` is the out-of-place op computing the new value from `inputs` (inputs[0] is
// self), or null for copy_ (inputs = {src}) and fill_ (no inputs).
// Autograd refuses in-place writes that would corrupt a gradient and records differentiable ones;
// it returns true when it performed the write itself.
using InplaceHook = bool (*)(const char* name, const OpDef* op, Tensor& self, std::span<const Tensor> inputs,
                             const Attrs& attrs);
void set_inplace_hook(InplaceHook h);
InplaceHook inplace_hook();

// Observer of eager op calls (the profiler): begin() before the op's casts and kernel run,
// end() after them (also when the op throws; then `outputs` is empty). Not called for traced
// calls. One observer at a time; unset it is one relaxed atomic load per call.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void begin(const OpDef& op, std::span<const Tensor> inputs) = 0;
  virtual void end(const OpDef& op, std::span<const Tensor> outputs) = 0;
};
void set_op_observer(OpObserver* o);

// ---- the shared front half ----
// Checks arguments (via meta), casts inputs, allocates outputs, and runs the kernel of the
// inputs' device. Mixed devices are a tpu::Error naming the op.
void call(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs, std::span<Tensor> outputs);
Tensor call(const OpDef& op, std::initializer_list<Tensor> inputs, const Attrs& attrs = {});

// Allocates an uninitialized contiguous tensor.
using tpu::empty_tensor;  // (tpucore/core/tensor.h)

}  // namespace tpu::ops

// Declares an op once: `TPU_DEFINE_OP(add_op, {.name = "add", ...});` makes a function
// add_op() returning the OpDef, registered when the library loads.
#define TPU_DEFINE_OP(fn, ...)                                             \
  static const ::tpu::ops::OpDef& fn() {                                   \
    static const ::tpu::ops::OpDef& d = ::tpu::ops::define(::tpu::ops::OpDef __VA_ARGS__); \
    return d;                                                              \
  }                                                                        \
  [[maybe_unused]] static const bool fn##_registered = (fn(), true)
