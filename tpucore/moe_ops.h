/// @file
/// The ops of mixture-of-experts layers (registry ops like those of tpucore/ops.h; cpu kernels,
/// autograd; other devices run them through the counted host fallback): top-k, the dropless
/// routing sort, token permute / unpermute, and the grouped (ragged) matmul over tokens sorted
/// by expert. nn::SparseMoE (tpucore/nn/moe.h) composes them.
#pragma once

#include <cstdint>
#include <tuple>

#include "tpucore/core/tensor.h"

namespace tpu {

/// The k largest entries of x along `dim`, largest first (NaN counts as the largest; equal values
/// in index order), and their indices (i64), as torch.topk with sorted=True.
std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1);
/// Rows of x [T, K] sorted by group times their group's matrix: rows [o_e, o_e + n_e) (o_e the
/// sum of the counts before group e) times w[e], with w [E, K, N], or [E, N, K] with
/// transpose_w (each group's weight stored as a Linear's, x w[e]^T). group_sizes: E integer
/// counts (i64/i32), >= 0 and summing to T, read when the op runs (a new routing needs no new
/// program). f32/bf16 accumulate in f32. Differentiable in x and w. -> [T, N].
Tensor grouped_matmul(const Tensor& x, const Tensor& w, const Tensor& group_sizes, bool transpose_w = false);
/// The weight gradient of grouped_matmul: per group x_e^T dy_e [E, K, N] (transpose_w: dy_e^T x_e,
/// [E, N, K]); zero for an empty group. x [T, K], dy [T, N].
Tensor grouped_matmul_weight_grad(const Tensor& x, const Tensor& dy, const Tensor& group_sizes,
                                  bool transpose_w = false);
/// Dropless routing's sort: the S = numel flat slots of expert_ids (token t's j-th choice of
/// [T, k] ids is slot t * k + j) stably sorted by expert id -> (order [S] i32, group_sizes [E]
/// i32). Ids outside [0, num_experts) are a tpu::Error.
std::tuple<Tensor, Tensor> moe_sort(const Tensor& expert_ids, int64_t num_experts);
/// Tokens gathered in expert order: row i of the result is x[order[i] / top_k]; x [T, H], order
/// a permutation of [0, T * top_k) (moe_sort's) -> [T * top_k, H]. Differentiable in x.
Tensor moe_permute(const Tensor& x, const Tensor& order, int64_t top_k);
/// The inverse of moe_permute with each token's choices summed by its routing weights:
/// out[t] = sum_j weights[t, j] y[i] where order[i] = t * top_k + j; y [T * top_k, H], weights
/// [T, top_k] (undefined: weights of one) -> [T, H], accumulated in f32. Differentiable in y and
/// weights.
Tensor moe_unpermute(const Tensor& y, const Tensor& order, const Tensor& weights, int64_t top_k);
/// Inclusive prefix sums of x along `dim`, as torch.cumsum: out[.., i, ..] = x[.., 0, ..] + ... +
/// x[.., i, ..]. Integers sum exactly (wrapping as their dtype does) and keep their dtype, bool
/// counts as i64; f32/bf16/f16 accumulate in f32 in index order. Differentiable (the gradient
/// is the reverse prefix sum of the output's gradient).
Tensor cumsum(const Tensor& x, int64_t dim);

}  // namespace tpu
