// When the layers take the fused decoder ops (tpucore/fused_ops.h) instead of their op chains:
// eager cpu tensors only, outside tracing, dispatch interceptors and autograd (the fused ops
// have no chip lowering of their own), so every other executor and the recorded backward graph
// see the chains they know. Not installed.
#pragma once

#include <initializer_list>

#include "ops/registry.h"
#include "tpucore/autograd.h"
#include "tpucore/core/tensor.h"

namespace tpu::nn::detail {

inline bool fused_path_ok(std::initializer_list<const Tensor*> ts) {
  if (ops::interceptor() != nullptr) return false;
  const bool grad = is_grad_enabled();
  for (const Tensor* t : ts) {
    if (!t->defined() || t->is_proxy() || t->device().type != DeviceType::cpu) return false;
    if (grad && t->requires_grad()) return false;
  }
  return true;
}

}  // namespace tpu::nn::detail
