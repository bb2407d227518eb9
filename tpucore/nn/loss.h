/// @file
/// Losses (as torch.nn.functional): cross_entropy with label smoothing and ignore_index,
/// nll_loss, mse_loss. Inputs are [N, C] (or [..., C] with targets [...]); targets are integer
/// class indices.
#pragma once

#include "tpucore/core/tensor.h"

namespace tpu::nn {

enum class Reduction { mean, sum, none };

struct CrossEntropyOptions {
  int64_t ignore_index = -100;   ///< targets equal to it add nothing (mean divides by the others)
  double label_smoothing = 0.0;  ///< in [0, 1]: the target distribution is (1-e) one-hot + e uniform
  Reduction reduction = Reduction::mean;
};

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o = {});
/// Negative log likelihood of log-probabilities.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100,
                Reduction reduction = Reduction::mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);

}  // namespace tpu::nn
