// Vectorized f32 max/min of a contiguous run with NaN propagation. GCC does not vectorize a
// plain `v > m ? v : m` loop without -ffast-math (NaN and signed-zero rules), so this is
// written with the compiler's generic vector extension (128-bit vectors, which every x86-64
// target has) and gives the same result as the scalar rule: the extremum,
// or NaN when any element is NaN.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

namespace tpu::ops::reduce {

typedef float F32x4 __attribute__((vector_size(16)));
typedef int32_t I32x4 __attribute__((vector_size(16)));

template <bool kMax>
inline F32x4 pick(F32x4 v, F32x4 m) {
  if constexpr (kMax) return v > m ? v : m;
  else return v < m ? v : m;
}

// 4 accumulators of 4 lanes (native 128-bit vectors lower to maxps/minps; wider generic
// vectors are split badly on a baseline target).
template <bool kMax>
inline float extremum_f32(const float* p, int64_t n, float init) {
  float r = init;
  bool nan = init != init;
  int64_t i = 0;
  if (n >= 16) {
    F32x4 m0, m1, m2, m3, v0, v1, v2, v3;
    std::memcpy(&m0, p, 16);
    std::memcpy(&m1, p + 4, 16);
    std::memcpy(&m2, p + 8, 16);
    std::memcpy(&m3, p + 12, 16);
    I32x4 bad = (m0 != m0) | (m1 != m1) | (m2 != m2) | (m3 != m3);
    for (i = 16; i + 16 <= n; i += 16) {
      std::memcpy(&v0, p + i, 16);
      std::memcpy(&v1, p + i + 4, 16);
      std::memcpy(&v2, p + i + 8, 16);
      std::memcpy(&v3, p + i + 12, 16);
      m0 = pick<kMax>(v0, m0);
      m1 = pick<kMax>(v1, m1);
      m2 = pick<kMax>(v2, m2);
      m3 = pick<kMax>(v3, m3);
      bad |= (v0 != v0) | (v1 != v1) | (v2 != v2) | (v3 != v3);
    }
    m0 = pick<kMax>(m1, m0);
    m2 = pick<kMax>(m3, m2);
    m0 = pick<kMax>(m2, m0);
    for (int j = 0; j < 4; ++j) {
      nan |= bad[j] != 0;
      r = (kMax ? m0[j] > r : m0[j] < r) ? m0[j] : r;
    }
  }
  for (; i < n; ++i) {
    nan |= p[i] != p[i];
    r = (kMax ? p[i] > r : p[i] < r) ? p[i] : r;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : r;
}

}  // namespace tpu::ops::reduce
