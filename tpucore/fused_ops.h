/// @file
/// Fused ops of a decoder step (registry ops like those of tpucore/ops.h; cpu kernels; other
/// devices run them through the host fallback; differentiable): each equals an op chain
/// bit for bit on the cpu, in one pass and one call. nn::GatedMLP and the models' decoder layers
/// use them for eager cpu tensors outside tracing and autograd, and the chains elsewhere.
#pragma once

#include <optional>
#include <utility>

#include "tpucore/core/tensor.h"

namespace tpu {

/// silu(gate) * up: gate and up of one floating dtype and one shape (any strides); silu(gate) is
/// rounded to the dtype before the product, as the chain mul(silu(gate), up) stores it.
Tensor silu_mul(const Tensor& gate, const Tensor& up);
/// (rotary_embedding(q, cos, sin), rotary_embedding(k, cos, sin)) in one call: the query and key
/// heads of an attention rotated by the same tables (checked as rotary_embedding checks them).
std::pair<Tensor, Tensor> rotary_embedding_qk(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin);
/// (h, y) with h = x + residual and y = rms_norm(h, {n}, weight, eps) over the last dim n: x and
/// residual of one floating dtype and one shape, weight [n]; eps unset: f32's machine epsilon (as
/// rms_norm). The norm reads h as rounded to the dtype, as the chain does.
std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                       std::optional<double> eps = std::nullopt);

}  // namespace tpu
