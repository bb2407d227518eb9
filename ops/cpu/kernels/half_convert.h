// Runs of IEEE f16 values to and from f32, vectorized (vcvtph2ps / vcvtps2ph: 16 values per
// instruction with AVX-512, 8 with F16C) with a portable loop elsewhere. The results are those
// of tpu::f16's own conversions bit for bit: a chunk holding a NaN or an Inf goes through them
// (the instructions keep NaN payloads, f16(float) returns one quiet NaN).
#pragma once

#include <cstdint>
#include <type_traits>

#include "tpucore/core/half.h"

namespace tpu::kernels {

// dst[i] = src[i] widened to f32 (exact), for n contiguous values.
void f16_to_f32(const uint16_t* src, float* dst, int64_t n);
// dst[i] = f16(src[i]) (nearest even, overflow to Inf), for n contiguous values.
void f32_to_f16(const float* src, uint16_t* dst, int64_t n);

// The F16C paths whatever the CPU (tests; only call when the CPU has AVX2 and F16C).
void f16_to_f32_f16c(const uint16_t* src, float* dst, int64_t n);
void f32_to_f16_f16c(const float* src, uint16_t* dst, int64_t n);

// n values of element type T at byte stride `stride` from p, as f32 into dst (contiguous f16
// runs by f16_to_f32; other types and strides one by one).
template <class T>
inline void load_run_f32(const char* p, int64_t stride, int64_t n, float* dst) {
  if constexpr (std::is_same_v<T, f16>) {
    if (stride == int64_t{sizeof(f16)}) return f16_to_f32(reinterpret_cast<const uint16_t*>(p), dst, n);
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(*reinterpret_cast<const T*>(p + i * stride));
}

// n f32 values of src stored as T at byte stride `stride` from p (T(float) rounding).
template <class T>
inline void store_run_f32(char* p, int64_t stride, int64_t n, const float* src) {
  if constexpr (std::is_same_v<T, f16>) {
    if (stride == int64_t{sizeof(f16)}) return f32_to_f16(src, reinterpret_cast<uint16_t*>(p), n);
  }
  for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p + i * stride) = T(src[i]);
}

}  // namespace tpu::kernels
