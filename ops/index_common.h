// Shared pieces of the indexing and joining ops (cat, stack, index_select, gather,
// scatter_add, embedding, masked_fill, tril/triu, one_hot): index dtype and range checks
// that run before any index is used, and raw strided block copies of element bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/registry.h"

namespace tpu::ops::indexing {

// An index tensor must hold integers: i32 (also i8 / u8). Anything else (floats, bool) is a
// tpu::Error naming the op, the argument and the dtype.
void check_index_dtype(const char* op, const char* arg, const Tensor& index);

// Checks every value of a cpu i32 tensor (any strides) lies in [0, size); otherwise throws a
// tpu::Error naming the op, the bad value, the dim and its size (`what` describes the indexed
// tensor, e.g. "x of shape [4, 5]"). Runs before a kernel reads through any index, and never
// throws from inside a worker thread.
void check_index_range(const char* op, const Tensor& index, int64_t size, int64_t dim, const std::string& what);

// The values of a cpu i32 tensor in row-major order.
std::vector<int32_t> read_indices(const Tensor& index);

// Byte strides of a cpu tensor (one per dim).
Shape byte_strides(const Tensor& t);

// Copies a block of `shape` elements of `es` bytes from src to dst, each with its own byte
// strides. The layout is fixed once; operator() copies one block (serially), so a kernel can
// move many equally shaped rows (index_select, embedding) cheaply.
class BlockCopy {
 public:
  BlockCopy(const Shape& shape, const Shape& dst_strides, const Shape& src_strides, size_t es);
  void operator()(char* dst, const char* src) const;
  int64_t numel() const { return numel_; }

 private:
  cpu::Layout<2> L_;
  size_t es_;
  int64_t numel_;
};

// Copies n elements of es bytes between strided runs (memcpy when both are contiguous).
void copy_elements(char* dst, int64_t dst_stride, const char* src, int64_t src_stride, int64_t n, size_t es);

// Copies a strided region (same dtype) with memcpy of contiguous runs; parallel over the
// elements when large (inline when already inside a parallel region).
void strided_copy(const Shape& shape, char* dst, const Shape& dst_strides, const char* src, const Shape& src_strides,
                  size_t es);

}  // namespace tpu::ops::indexing
