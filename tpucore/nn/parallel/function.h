// Custom differentiable functions for the sharded layers (internal to tpucore/nn/parallel): an
// output computed by plain C++ under no-grad (a collective, a copy out of a gathered buffer) gets
// an autograd node whose backward is a closure, e.g. all-reduce forward / identity backward.
#pragma once

#include <functional>
#include <span>

#include "tpucore/core/tensor.h"
#include "tpucore/ops.h"

namespace tpu::nn::parallel::detail {

// grad_outputs: one per output (zeros where an output received none); fill grad_inputs[i] for
// the inputs that need one (leave it undefined for no gradient).
using CustomBackward = std::function<void(std::span<const Tensor> grad_outputs, std::span<Tensor> grad_inputs)>;

// When grad mode is on and some input requires grad, gives the floating outputs a history whose
// backward calls fn; otherwise does nothing. Outputs must be fresh tensors (not the inputs).
// name (a string literal) names the node (autograd::grad_fn_name, error messages). Traced
// (tpu::compile) inputs are a tpu::Error unless `traceable`: fn then runs on traced tensors when
// backward is traced, and must only call traceable ops and collectives (fully_shard's hooks).
void attach_backward(const char* name, std::span<const Tensor> inputs, std::span<Tensor> outputs, CustomBackward fn,
                     bool traceable = false);

// A new tensor handle on t's data without history (the output of an identity function).
Tensor fresh_alias(const Tensor& t);

// True while this thread records ops (a tpu::compile trace): collectives become graph nodes.
bool recording();

// A buffer a collective writes: `empty` eagerly; while recording a `zeros` node (an `empty`
// tensor is real even then, and written in place it would become a captured input of the graph).
Tensor collective_buffer(const Shape& shape, TensorOptions o);

}  // namespace tpu::nn::parallel::detail
