// Per-thread scratch for the host GEMM / GEMV kernels: 64-byte aligned (a SIMD row or AMX tile
// row that straddles two cache lines costs two accesses), grown on demand, kept for reuse.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace tpu::kernels::detail {

class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() { std::free(data_); }
  // At least `bytes` bytes (the contents are not kept when it grows). Throws std::bad_alloc.
  void* get(size_t bytes) {
    if (bytes > cap_) {
      std::free(data_);
      cap_ = (bytes + 63) / 64 * 64;
      data_ = std::aligned_alloc(64, cap_);
      if (!data_) {
        cap_ = 0;
        throw std::bad_alloc();
      }
    }
    return data_;
  }
  template <class T>
  T* get_as(size_t n) {
    return static_cast<T*>(get(n * sizeof(T)));
  }

 private:
  void* data_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace tpu::kernels::detail
