// Shared pieces of meta functions: broadcasting, type promotion, dim lists.
#pragma once

#include <span>
#include <vector>

#include "ops/registry.h"

namespace tpu::ops {

// Broadcast shape of all inputs (error names the op and the shapes).
Shape broadcast_inputs(const OpDef& op, std::span<const Tensor> inputs);
// PyTorch result_type over the inputs (wrapped scalars and 0-d tensors rank lower).
DType result_type(std::span<const Tensor> inputs);
// The common device of the inputs, ignoring wrapped scalars (they live on the cpu).
Device common_device(std::span<const Tensor> inputs);
// Normalizes a dim list for a tensor of ndim dims: wraps negatives, rejects duplicates;
// an empty list means all dims.
std::vector<int> normalize_dims(const std::vector<int64_t>& dims, int ndim, const char* op);
// Shape after reducing `dims` (normalized) with or without keepdim.
Shape reduced_shape(const Shape& in, const std::vector<int>& dims, bool keepdim);
// "f32 [2, 3] on cpu" for messages.
std::string describe(const Tensor& t);
// A grouped matmul's group counts (read from group_sizes) checked: each >= 0, summing to the
// `rows` of x; the error names `op`.
void check_group_counts(const char* op, const std::vector<int64_t>& counts, int64_t rows);

}  // namespace tpu::ops
