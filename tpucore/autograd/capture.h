// The .grad of real leaf tensors while a compiled function is traced (internal to tpucore).
// A traced backward accumulates traced gradients into the leaves' .grad, and a traced optimizer
// reads and clears them. The compile engine installs a GradCapture for the trace: autograd
// reports every access to the .grad of a real tensor; at the end of the trace the engine makes
// the final gradients graph outputs (assigned to .grad after each run), guards the cache entry
// on the initial state the trace read (defined or not, which tensor), and restores the initial
// state so that tracing itself leaves no traced tensors behind.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "tpucore/autograd/node.h"

namespace tpu::autograd::detail {

struct LeafGradSlot {
  std::shared_ptr<AutogradMeta> meta;
  std::weak_ptr<TensorImpl> owner;
  Tensor initial;        // .grad when the trace first touched it
  bool guarded = false;  // the trace read it before writing it
};

class GradCapture {
 public:
  // Called before .grad of a real tensor's metadata is read (read = true) or replaced.
  void touch(const std::shared_ptr<AutogradMeta>& m, bool read);
  std::vector<LeafGradSlot>& slots() { return slots_; }
  // Puts every touched .grad back to its initial value.
  void restore();

 private:
  std::vector<LeafGradSlot> slots_;
  std::unordered_map<const AutogradMeta*, size_t> index_;
};

// The capture of this thread's current trace, or null.
GradCapture* grad_capture();

class GradCaptureScope {
 public:
  explicit GradCaptureScope(GradCapture* c);
  ~GradCaptureScope();
  GradCaptureScope(const GradCaptureScope&) = delete;
  GradCaptureScope& operator=(const GradCaptureScope&) = delete;

 private:
  GradCapture* prev_;
};

// Reports an access to m's .grad to the active capture (no-op when none).
inline void touch_grad(const std::shared_ptr<AutogradMeta>& m, bool read) {
  if (GradCapture* c = grad_capture()) c->touch(m, read);
}

}  // namespace tpu::autograd::detail
