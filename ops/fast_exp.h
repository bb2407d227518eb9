// A branch-free single-precision exp that compilers vectorize inside plain loops (glibc's
// expf is not vectorized without -ffast-math). Range reduction x = n ln2 + r with |r| <=
// ln2/2 (ln2 split in two parts), a degree-6 polynomial for e^r, and 2^n put into the
// exponent bits. Accurate to about 2 ulp over the whole float range; exp(-inf) = 0,
// exp(+inf) = inf, NaN stays NaN; results below ~2.5e-38 (x < -86.64) flush to zero.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace tpu::ops {

inline float fast_exp(float x) {
  const float hi = 88.72283935546875f, lo = -86.64f;  // n stays in [-125, 128]
  float xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  // n = round(x / ln2) via the 1.5 * 2^23 trick (exact for |x / ln2| < 2^22).
  const float magic = 12582912.0f;
  float n = xc * 1.44269504088896341f + magic;
  n -= magic;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n as 2 * 2^(n-1) so that n = 128 (just below overflow) stays representable.
  const int32_t e = static_cast<int32_t>(n) + 126;
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(e) << 23);
  float y = (p * scale) * 2.0f;
  y = x > hi ? std::numeric_limits<float>::infinity() : y;
  y = x < lo ? 0.0f : y;
  y = x != x ? x : y;
  return y;
}

}  // namespace tpu::ops
