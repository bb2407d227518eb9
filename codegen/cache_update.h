// KV cache write at a runtime position: kv_cache_write_(cache, src, pos) stores src [B, H, T, D]
// into cache [B, H, C, D] at positions [pos, pos + T) of dim 2 (a dynamic-update-slice), in
// place, and returns the cache itself (an alias, as PyTorch's index_copy_ returns self). The
// position is a one-element integer tensor on the cache's device, read when the op runs, so a
// compiled decode step takes it as a runtime input: one trace and one chip program serve every
// position.
//
// On `sim` (and `tpu:N` devices that run generated programs) the op is one program of one
// strided DMA per batch row, HBM to HBM, writing only the T new positions (r2 holds the
// position; the program is cached per shapes and strides). On other devices it is
// copy_(narrow(cache, 2, pos, T), src).
//
// The op is recorded by tpu::compile as an ordinary node (it is not a copy_ into the cache, so
// no full-size functionalized value and write-back): its result must be what later ops read
// (the old cache value is gone once it ran).
#pragma once

#include "tpucore/core/tensor.h"

namespace tpu::codegen {

// cache: contiguous 4-D; src: the cache's dtype and device, shape [B, H, T, D] matching the
// cache but for T, last dim contiguous; pos: one integer (i32 or i64), 0 <= pos <= C - T. A
// violation is a tpu::Error naming it.
Tensor kv_cache_write_(const Tensor& cache, const Tensor& src, const Tensor& pos);

// The position as an i64 [1] tensor on `device` for kv_cache_write_, its value remembered on the
// host (until the tensor is written or freed), so a chip need not be waited for to read it back.
Tensor position_tensor(int64_t pos, Device device);

// The host value of a position tensor (remembered by position_tensor or an earlier read, else
// read from its device), checked to lie in [0, limit] (else a tpu::Error naming `op`).
int64_t read_cache_position(const Tensor& pos, int64_t limit, const char* op);

}  // namespace tpu::codegen
