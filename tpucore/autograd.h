/// @file
/// Reverse-mode automatic differentiation of eager tensors (semantics as PyTorch).
///
///   Tensor w = tpu::randn({4, 3}).requires_grad_();
///   Tensor loss = tpu::matmul(x, w).relu().sum();   // every op is recorded while grad mode is on
///   loss.backward();                                  // w.grad() now holds d loss / d w
///
/// Recording happens in the op registry's post-call hook: an op whose inputs require grad gets a
/// node holding the tensors its derivative formula (OpDef::backward) needs; its floating point
/// outputs require grad. backward() walks the nodes in reverse topological order, calls the
/// formulas (ordinary tpu ops, so they run on any device), reduces broadcast gradients and casts
/// them to each input's dtype, and accumulates into the leaves' .grad(). Without retain_graph the
/// saved tensors are freed as the walk passes; a second backward through them is an error.
/// In-place ops bump a version counter shared by every view of a storage; a saved tensor written
/// in place after it was saved makes backward fail instead of returning wrong gradients.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tpucore/core/tensor.h"

namespace tpu {

/// Grad mode is thread-local and on by default.
bool is_grad_enabled();
/// Turns grad mode on or off for this thread.
void set_grad_enabled(bool on);

/// Turns recording off for its scope (for evaluation and for optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// Turns recording on (or to `on`) for its scope.
class GradModeGuard {
 public:
  /// Sets grad mode to `on` until the guard goes out of scope.
  explicit GradModeGuard(bool on = true) : prev_(is_grad_enabled()) { set_grad_enabled(on); }
  ~GradModeGuard() { set_grad_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

namespace autograd {

/// Backward from several roots at once; grads[i] may be undefined for a one-element root.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {}, bool retain_graph = false,
              bool create_graph = false);

/// Gradients of the roots with respect to `inputs`, returned instead of accumulated into .grad().
/// An input the roots do not depend on is an error unless allow_unused (then undefined).
std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grads = {}, bool retain_graph = false, bool create_graph = false,
                         bool allow_unused = false);

/// Name of the op that recorded t (empty for leaves and tensors without history).
std::string grad_fn_name(const Tensor& t);

/// Calls fn(grad) once per backward pass (backward(), not autograd::grad) after the last gradient
/// of that pass has been accumulated into leaf's .grad(), as torch's
/// register_post_accumulate_grad_hook; grad is the leaf's .grad() tensor itself. Hooks run on the
/// thread running backward, in the order the leaves finish. Returns an id for remove.
int register_post_accumulate_grad_hook(const Tensor& leaf, std::function<void(const Tensor& grad)> fn);
/// Removes the hook `id` (from register_post_accumulate_grad_hook) of `leaf`.
void remove_post_accumulate_grad_hook(const Tensor& leaf, int id);
/// For each of `leaves`, whether a gradient of `root` can reach it (root's recorded graph
/// reaches the leaf); e.g. to find parameters a forward pass did not use.
std::vector<bool> reachable_leaves(const Tensor& root, const std::vector<Tensor>& leaves);

}  // namespace autograd
}  // namespace tpu
