#include "tpucore/autograd/capture.h"

namespace tpu::autograd::detail {
namespace {
thread_local GradCapture* t_capture = nullptr;
}

void GradCapture::touch(const std::shared_ptr<AutogradMeta>& m, bool read) {
  if (!m) return;
  std::shared_ptr<TensorImpl> owner = m->owner.lock();
  if (!owner || owner->trace) return;  // traced tensors' gradients live and die in the trace
  if (index_.count(m.get())) return;
  index_.emplace(m.get(), slots_.size());
  slots_.push_back({m, owner, m->grad, read});
}

void GradCapture::restore() {
  for (LeafGradSlot& s : slots_) s.meta->grad = s.initial;
}

GradCapture* grad_capture() { return t_capture; }

GradCaptureScope::GradCaptureScope(GradCapture* c) : prev_(t_capture) { t_capture = c; }
GradCaptureScope::~GradCaptureScope() { t_capture = prev_; }

}  // namespace tpu::autograd::detail
