// The hook through which the core Tensor asks the tracer (graph/) for the value of a traced
// proxy tensor (item(), to_vector()): a graph break. The core never includes graph/.
#pragma once

#include "tpucore/tensor.h"

namespace tpu::detail {

using MaterializeHook = Tensor (*)(const Tensor& proxy, const char* what);
void set_materialize_hook(MaterializeHook h);
// Returns the real value of a proxy (via the tracer) or fails with a clear tpu::Error.
Tensor materialize_proxy(const Tensor& proxy, const char* what);

}  // namespace tpu::detail
