/// @file
/// 16-bit floating point storage types. Conversions from f32 round to nearest even;
/// NaN stays NaN (quiet), Inf stays Inf.
#pragma once

#include <cstdint>
#include <cstring>

namespace tpu {

/// The IEEE bits of `f`.
inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
/// The float whose IEEE bits are `u`.
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// bfloat16: the top half of an IEEE f32.
struct bf16 {
  /// The raw 16 bits (the top half of the f32).
  uint16_t bits = 0;
  bf16() = default;
  /// `f` rounded to nearest even.
  explicit bf16(float f) : bits(from_f32(f)) {}
  /// The bf16 with raw bits `b`.
  static bf16 from_bits(uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
  /// The bits of `f` rounded to nearest even (a NaN stays a quiet NaN).
  static uint16_t from_f32(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>((u + rounding) >> 16);
  }
  /// The exact f32 value.
  float to_f32() const { return bits_f32(static_cast<uint32_t>(bits) << 16); }
  /// Converts to f32 (exact).
  operator float() const { return to_f32(); }
};

/// IEEE binary16.
struct f16 {
  /// The raw 16 bits (sign, 5 exponent bits, 10 mantissa bits).
  uint16_t bits = 0;
  f16() = default;
  /// `f` rounded to nearest even (overflow gives Inf).
  explicit f16(float f) : bits(from_f32(f)) {}
  /// The f16 with raw bits `b`.
  static f16 from_bits(uint16_t b) {
    f16 r;
    r.bits = b;
    return r;
  }
  /// The bits of `f` rounded to nearest even (subnormals kept; overflow gives Inf; NaN stays NaN).
  static uint16_t from_f32(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
    if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow / Inf
    if (a < 0x38800000u) {
      // Result is subnormal or zero: scale to a multiple of 2^-24 with round-to-nearest-even
      // done by the f32 adder (adding 0.5 shifts the value into the low mantissa bits).
      float af = bits_f32(a);
      float r = af + 0.5f;  // 0.5 = 2^-1; ulp at 0.5 is 2^-24, the f16 subnormal step
      uint32_t rb = f32_bits(r) - 0x3f000000u;
      return static_cast<uint16_t>(sign | rb);
    }
    // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
    uint32_t mant_odd = (a >> 13) & 1u;
    a += 0xc8000fffu + mant_odd;  // -(112 << 23) + 0xfff + odd
    return static_cast<uint16_t>(sign | (a >> 13));
  }
  /// The exact f32 value.
  float to_f32() const {
    uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    uint32_t exp = (bits >> 10) & 0x1fu;
    uint32_t mant = bits & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
    if (exp == 0) {
      // zero or subnormal: mant * 2^-24
      float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
      return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  }
  /// Converts to f32 (exact).
  operator float() const { return to_f32(); }
};

}  // namespace tpu
