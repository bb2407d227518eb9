// Hooks through which the core (Tensor, ops/) reaches upper layers without including them: the
// value of a traced proxy tensor (item(), to_vector()) is a graph break, copy_ while tracing
// (the end of every in-place op) is functionalized by the tracer, and autograd records device
// moves of tensors that require grad.
#pragma once

#include "tpucore/core/tensor.h"

namespace tpu::detail {

using MaterializeHook = Tensor (*)(const Tensor& proxy, const char* what);
void set_materialize_hook(MaterializeHook h);
// Returns the real value of a proxy (via the tracer) or fails with a clear tpu::Error.
Tensor materialize_proxy(const Tensor& proxy, const char* what);

// copy_(self, src) while a tracer is installed or when either tensor is a proxy: the tracer
// records the write out of place (fails with a clear tpu::Error when no tracer is active).
using TracedCopyHook = void (*)(const Tensor& self, const Tensor& src);
void set_traced_copy_hook(TracedCopyHook h);
void traced_copy(const Tensor& self, const Tensor& src);

// contiguous() of a traced proxy: true when the eager tensor would already be contiguous (then
// contiguous() returns it, an alias, as in eager); false when no tracer is active.
using ProxyContiguousHook = bool (*)(const Tensor& proxy);
void set_proxy_contiguous_hook(ProxyContiguousHook h);
bool proxy_eager_contiguous(const Tensor& proxy);

// to(device) of a tensor that requires grad: autograd records it (the gradient moves back).
using DeviceCopyHook = void (*)(const Tensor& src, Tensor& dst);
void set_device_copy_hook(DeviceCopyHook h);
void on_device_copy(const Tensor& src, Tensor& dst);

// Whether a proxy belongs to a deferred eager recording (tpucore/defer.h): then printing it or
// moving it to another device reads its value (materialize_proxy) as eager would.
using ProxyDeferredHook = bool (*)(const Tensor& proxy);
void set_proxy_deferred_hook(ProxyDeferredHook h);
bool proxy_deferred(const Tensor& proxy);

// Host access to a real tensor's memory (Tensor::raw_data, to(device)): a deferred eager
// recording that reads or writes that memory is flushed first, so the access sees (and a raw
// write cannot reorder with) the ops recorded before it. A deferred proxy is materialized.
using DeferredAccessHook = void (*)(const Tensor& t);
void set_deferred_access_hook(DeferredAccessHook h);
void before_host_access(const Tensor& t);

}  // namespace tpu::detail
