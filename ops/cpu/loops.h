// Strided elementwise iteration for cpu kernels: N operands (output first) over one shape,
// each with its own byte strides (0 for broadcast dims). Dims are coalesced, the flat range
// is split over the thread pool for large work, and the callback gets runs along the
// innermost dim so that contiguous runs compile to tight, vectorizable loops.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tpucore/core/parallel.h"
#include "tpucore/core/tensor.h"

namespace tpu::ops::cpu {

// Elements per parallel chunk: below this an op runs on the calling thread only.
inline constexpr int64_t kParallelGrain = 32768;

// Byte strides of t viewed at out_shape (broadcast dims get stride 0).
Shape broadcast_byte_strides(const Tensor& t, const Shape& out_shape);
// Byte pointer to the first element of a cpu tensor.
inline char* byte_ptr(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

template <int N>
struct Layout {
  int ndim = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[N][kMaxDims];
};

// Coalesces dims that are contiguous in every operand and drops size-1 dims.
template <int N>
Layout<N> coalesce(const Shape& shape, const std::array<Shape, N>& strides) {
  Layout<N> L;
  for (int d = 0; d < shape.ndim(); ++d) {
    if (shape[d] == 1) continue;
    if (L.ndim > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k)
        if (L.strides[k][L.ndim - 1] != strides[k][d] * shape[d]) merge = false;
      if (merge) {
        L.sizes[L.ndim - 1] *= shape[d];
        for (int k = 0; k < N; ++k) L.strides[k][L.ndim - 1] = strides[k][d];
        continue;
      }
    }
    L.sizes[L.ndim] = shape[d];
    for (int k = 0; k < N; ++k) L.strides[k][L.ndim] = strides[k][d];
    ++L.ndim;
  }
  if (L.ndim == 0) {  // 0-d or all size-1: one element
    L.ndim = 1;
    L.sizes[0] = 1;
    for (int k = 0; k < N; ++k) L.strides[k][0] = 0;
  }
  return L;
}

// fn(std::array<char*, N> ptrs, std::array<int64_t, N> inner_byte_strides, int64_t n)
template <int N, class F>
void for_each_run(const Shape& shape, const std::array<char*, N>& base, const std::array<Shape, N>& byte_strides,
                  F&& fn, int64_t grain = kParallelGrain) {
  const int64_t total = shape.numel();
  if (total == 0) return;
  const Layout<N> L = coalesce<N>(shape, byte_strides);
  const int nd = L.ndim;
  const int64_t inner = L.sizes[nd - 1];
  std::array<int64_t, N> inner_strides;
  for (int k = 0; k < N; ++k) inner_strides[k] = L.strides[k][nd - 1];
  parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    // Multi-index of `begin`.
    int64_t idx[kMaxDims];
    int64_t rem = begin;
    for (int d = nd - 1; d >= 0; --d) {
      idx[d] = rem % L.sizes[d];
      rem /= L.sizes[d];
    }
    std::array<char*, N> p;
    for (int k = 0; k < N; ++k) {
      char* q = base[k];
      for (int d = 0; d < nd; ++d) q += idx[d] * L.strides[k][d];
      p[k] = q;
    }
    int64_t pos = begin;
    while (pos < end) {
      int64_t run = inner - idx[nd - 1];
      if (run > end - pos) run = end - pos;
      fn(p, inner_strides, run);
      pos += run;
      if (pos >= end) break;
      // Advance to the start of the next run.
      idx[nd - 1] += run;
      for (int k = 0; k < N; ++k) p[k] += run * inner_strides[k];
      for (int d = nd - 1; d > 0 && idx[d] == L.sizes[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
        for (int k = 0; k < N; ++k) p[k] += L.strides[k][d - 1] - L.sizes[d] * L.strides[k][d];
      }
    }
  });
}

// out = f(in) elementwise; out contiguous with out's shape, in broadcast to it.
template <class TO, class TI, class F>
void unary_map(const Tensor& out, const Tensor& in, F f, int64_t grain = kParallelGrain) {
  std::array<char*, 2> base{byte_ptr(out), byte_ptr(in)};
  std::array<Shape, 2> st{broadcast_byte_strides(out, out.shape()), broadcast_byte_strides(in, out.shape())};
  for_each_run<2>(out.shape(), base, st, [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
    TO* o = reinterpret_cast<TO*>(p[0]);
    const char* a = p[1];
    if (s[0] == sizeof(TO) && s[1] == sizeof(TI)) {
      const TI* ai = reinterpret_cast<const TI*>(a);
      for (int64_t i = 0; i < n; ++i) o[i] = f(ai[i]);
    } else if (s[0] == sizeof(TO) && s[1] == 0) {
      const TI v = *reinterpret_cast<const TI*>(a);
      for (int64_t i = 0; i < n; ++i) o[i] = f(v);
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<TO*>(p[0] + i * s[0]) = f(*reinterpret_cast<const TI*>(a + i * s[1]));
    }
  }, grain);
}

// out = f(a, b) elementwise with broadcasting.
template <class TO, class TA, class TB, class F>
void binary_map(const Tensor& out, const Tensor& a, const Tensor& b, F f, int64_t grain = kParallelGrain) {
  std::array<char*, 3> base{byte_ptr(out), byte_ptr(a), byte_ptr(b)};
  std::array<Shape, 3> st{broadcast_byte_strides(out, out.shape()), broadcast_byte_strides(a, out.shape()),
                          broadcast_byte_strides(b, out.shape())};
  for_each_run<3>(out.shape(), base, st, [&](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t n) {
    TO* o = reinterpret_cast<TO*>(p[0]);
    if (s[0] == sizeof(TO) && s[1] == sizeof(TA) && s[2] == sizeof(TB)) {
      const TA* x = reinterpret_cast<const TA*>(p[1]);
      const TB* y = reinterpret_cast<const TB*>(p[2]);
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    } else if (s[0] == sizeof(TO) && s[1] == sizeof(TA) && s[2] == 0) {
      const TA* x = reinterpret_cast<const TA*>(p[1]);
      const TB y = *reinterpret_cast<const TB*>(p[2]);
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y);
    } else if (s[0] == sizeof(TO) && s[1] == 0 && s[2] == sizeof(TB)) {
      const TA x = *reinterpret_cast<const TA*>(p[1]);
      const TB* y = reinterpret_cast<const TB*>(p[2]);
      for (int64_t i = 0; i < n; ++i) o[i] = f(x, y[i]);
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<TO*>(p[0] + i * s[0]) =
            f(*reinterpret_cast<const TA*>(p[1] + i * s[1]), *reinterpret_cast<const TB*>(p[2] + i * s[2]));
    }
  }, grain);
}

// out = f(a, b, c) elementwise with broadcasting (where, clamp with tensors, ...).
template <class TO, class TA, class TB, class TC, class F>
void ternary_map(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, F f,
                 int64_t grain = kParallelGrain) {
  std::array<char*, 4> base{byte_ptr(out), byte_ptr(a), byte_ptr(b), byte_ptr(c)};
  std::array<Shape, 4> st{broadcast_byte_strides(out, out.shape()), broadcast_byte_strides(a, out.shape()),
                          broadcast_byte_strides(b, out.shape()), broadcast_byte_strides(c, out.shape())};
  for_each_run<4>(out.shape(), base, st, [&](std::array<char*, 4> p, std::array<int64_t, 4> s, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      *reinterpret_cast<TO*>(p[0] + i * s[0]) =
          f(*reinterpret_cast<const TA*>(p[1] + i * s[1]), *reinterpret_cast<const TB*>(p[2] + i * s[2]),
            *reinterpret_cast<const TC*>(p[3] + i * s[3]));
  }, grain);
}

// Value conversion between our element types (through float for the 16-bit floats).
// True for the storage float types that convert through f32 (bf16, f16, f8e4m3, f8e5m2).
template <class T>
inline constexpr bool is_narrow_float_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16> ||
                                          std::is_same_v<T, f8e4m3> || std::is_same_v<T, f8e5m2>;

template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (is_narrow_float_v<To>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<float>(v) != 0.0f;
  } else if constexpr (is_narrow_float_v<From>) {
    return convert<To>(v.to_f32());  // saturating float -> int below
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    // Out-of-range float -> int is undefined in C++; saturate (and NaN -> 0) instead.
    if (!(v == v)) return To(0);
    if (v >= static_cast<From>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    if (v <= static_cast<From>(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    return static_cast<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

// Compute type of an element type: float for the float types, int64 for i64, int32 for the
// other ints, bool for bool.
template <class T>
using compute_t = std::conditional_t<
    std::is_same_v<T, bf16> || std::is_same_v<T, f16> || std::is_same_v<T, float>, float,
    std::conditional_t<std::is_same_v<T, bool>, bool, std::conditional_t<std::is_same_v<T, int64_t>, int64_t, int32_t>>>;

}  // namespace tpu::ops::cpu
