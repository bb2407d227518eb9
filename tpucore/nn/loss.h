/// @file
/// Losses (as torch.nn.functional): cross_entropy with label smoothing and ignore_index,
/// nll_loss, mse_loss. Inputs are [N, C] (or [..., C] with targets [...]); targets are integer
/// class indices.
#pragma once

#include "tpucore/core/tensor.h"

namespace tpu::nn {

/// How a loss reduces the per-element losses: their mean, their sum, or none (per element).
enum class Reduction { mean, sum, none };

/// Options of cross_entropy.
struct CrossEntropyOptions {
  int64_t ignore_index = -100;   ///< targets equal to it add nothing (mean divides by the others)
  double label_smoothing = 0.0;  ///< in [0, 1]: the target distribution is (1-e) one-hot + e uniform
  /// How the per-sample losses are reduced.
  Reduction reduction = Reduction::mean;
};

/// Cross entropy of unnormalized `logits` [N, C] (or [..., C]) against integer class indices
/// `target` [N] (or [...]); mismatched shapes or a target out of [0, C) are a tpu::Error.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o = {});
/// Negative log likelihood of log-probabilities.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100,
                Reduction reduction = Reduction::mean);
/// Mean squared error (input - target)^2, reduced as asked; the shapes must be equal (else a tpu::Error).
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);

}  // namespace tpu::nn
