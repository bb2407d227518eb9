// nn::Module: a tree of named parameters, buffers and submodules (as torch.nn.Module).
//
//   struct Block : tpu::nn::Module {
//     std::shared_ptr<tpu::nn::Linear> fc = register_module("fc", std::make_shared<tpu::nn::Linear>(8, 8));
//     tpu::Tensor scale = tpu::ones({8});
//     Block() { register_parameter("scale", scale); }
//     tpu::Tensor forward(const tpu::Tensor& x) override { return fc->forward(x) * scale; }
//   };
//
// A module registers its parameter members by reference, so to(), load_state_dict() and
// optimizers see the same tensors; modules are therefore neither copyable nor movable and live
// in shared_ptrs. Names are dotted paths ("layers.0.weight").
//
// Forward hooks (as torch.nn.Module's) run around a forward called through operator()(x) or
// call(): pre-hooks see and may replace the inputs, hooks after it see the inputs and may replace
// the output. Parallelism is applied from outside through them (nn::parallel::fully_shard,
// nn::parallel::parallelize_module). Calling forward() directly skips them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tpucore/core/tensor.h"

namespace tpu::nn {

/// Parameters and buffers by dotted name.
using StateDict = std::map<std::string, Tensor>;

class Module;

/// Runs before a hooked forward: may replace the inputs (e.g. cast them, or gather them).
using ForwardPreHook = std::function<void(Module& module, std::vector<Tensor>& inputs)>;
/// Runs after a hooked forward: may replace the output. A hook registered with always_call also
/// runs when the forward (or a hook before it) threw; the output is then undefined and the
/// error propagates after the hooks ran.
using ForwardHook = std::function<void(Module& module, std::span<const Tensor> inputs, Tensor& output)>;

namespace detail {
struct HookTable;
}

/// Removes the hook it was returned for (once; later calls and a destroyed module are no-ops).
/// Dropping the handle keeps the hook.
class HookHandle {
 public:
  /// A handle that removes nothing.
  HookHandle() = default;
  /// Internal: made by Module::register_forward_pre_hook and register_forward_hook.
  HookHandle(std::weak_ptr<detail::HookTable> table, uint64_t id) : table_(std::move(table)), id_(id) {}
  /// Unregisters the hook.
  void remove();

 private:
  std::weak_ptr<detail::HookTable> table_;
  uint64_t id_ = 0;
};

/// While alive, the layers of tpu::nn created on this thread (Linear, Embedding) make their
/// weights uninitialised (`empty`) in `dtype` instead of random f32: for loaders that overwrite
/// every parameter (models::load_causal_lm), which then skip the random fill and the f32 copy.
class SkipInitGuard {
 public:
  /// Starts skipping (nested guards: the innermost one's dtype counts).
  explicit SkipInitGuard(DType dtype = DType::f32);
  /// Restores the previous state.
  ~SkipInitGuard();
  /// Not copyable (a scope guard).
  SkipInitGuard(const SkipInitGuard&) = delete;
  /// Not copyable (a scope guard).
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;
  /// The dtype of uninitialised weights while a guard is alive on this thread; nullopt otherwise.
  static std::optional<DType> active();

 private:
  std::optional<DType> previous_;
};

/// A node of the module tree (see the file comment).
class Module {
 public:
  /// An empty module.
  Module();
  /// Destroys the module (its hooks with it).
  virtual ~Module();
  /// Not copyable: members are registered by reference.
  Module(const Module&) = delete;
  /// Not copyable: members are registered by reference.
  Module& operator=(const Module&) = delete;

  /// The single-tensor forward of layers; modules with other signatures define their own.
  virtual Tensor forward(const Tensor& x);
  /// forward(x) with the forward hooks around it.
  Tensor operator()(const Tensor& x);
  /// A forward of any signature with the hooks around it: `body` computes the output from the
  /// (possibly replaced) tensor inputs; other arguments it captures.
  Tensor call(std::vector<Tensor> inputs, const std::function<Tensor(std::span<const Tensor>)>& body);
  /// The module's kind, for messages ("Linear", "Attention", ...).
  virtual std::string type_name() const { return "Module"; }

  /// Registers a hook run before every hooked forward, after those registered before it.
  HookHandle register_forward_pre_hook(ForwardPreHook hook);
  /// Registers a hook run after every hooked forward, after those registered before it; with
  /// always_call also when the forward threw (to undo what a pre-hook set up).
  HookHandle register_forward_hook(ForwardHook hook, bool always_call = false);
  /// Whether any forward hook is registered on this module (not its children).
  bool has_forward_hooks() const;

  /// Every parameter, depth first in registration order (children after the module's own).
  std::vector<Tensor> parameters(bool recurse = true) const;
  /// The parameters with their dotted names.
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  /// The buffers with their dotted names.
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  /// The direct submodules with their names.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  /// Replaces the child registered as `name` by `m` (a tpu::Error when there is none or m is
  /// null); a typed member that points to the old child is the caller's to update.
  void replace_child(const std::string& name, std::shared_ptr<Module> m);
  /// Every submodule below this one (not itself) with its dotted name, depth first.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;
  /// Elements of all parameters.
  int64_t num_parameters() const;

  /// Parameters and buffers by dotted name (detached; the live tensors stay in the module).
  StateDict state_dict() const;
  /// Copies values into the module's tensors (converted to their dtype and device). Missing or
  /// unexpected keys (when strict) and shape mismatches are a tpu::Error naming them.
  void load_state_dict(const StateDict& sd, bool strict = true);

  /// Sets training mode on this module and every submodule.
  void train(bool on = true);
  /// train(false).
  void eval() { train(false); }
  /// Whether the module is in training mode.
  bool is_training() const { return training_; }
  /// Moves every parameter and buffer to a device; parameters stay leaves that require grad.
  /// Create optimizers after moving (they hold the parameter tensors).
  void to(Device d);
  /// Converts every parameter to a floating dtype (buffers keep theirs).
  void to(DType t);
  /// Drops every parameter's gradient.
  void zero_grad();

  /// The registered member tensors themselves (not copies), by dotted name: for wrappers that
  /// replace parameters while a forward runs (nn::parallel::fully_shard, tensor parallelism).
  std::vector<std::pair<std::string, Tensor*>> parameter_slots(bool recurse = true);
  /// The registered buffer members themselves, by dotted name.
  std::vector<std::pair<std::string, Tensor*>> buffer_slots(bool recurse = true);

 protected:
  /// Registers a member tensor by reference (it must outlive the module's use of it: a member).
  void register_parameter(const std::string& name, Tensor& param, bool requires_grad = true);
  /// Registers a member buffer (not trained, saved in the state dict) by reference.
  void register_buffer(const std::string& name, Tensor& buffer);
  /// Registers a submodule under `name` and returns it.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void check_name(const std::string& name) const;
  template <class F>
  void visit(const std::string& prefix, bool recurse, bool buffers, F&& f) const;

  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, Tensor*>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::shared_ptr<detail::HookTable> hooks_;
  bool training_ = true;
};

}  // namespace tpu::nn
