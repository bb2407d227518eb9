/// @file
/// 8-bit floating point storage types (the OCP 8-bit floating point formats, as PyTorch's
/// float8_e4m3fn and float8_e5m2).
///
/// - f8e4m3 ("E4M3", the "fn" variant): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits;
///   no infinities, one NaN per sign (S.1111.111), largest finite value 448, smallest
///   subnormal 2^-9.
/// - f8e5m2 ("E5M2", IEEE-like): 1 sign, 5 exponent bits (bias 15), 2 mantissa bits;
///   infinities (S.11111.00) and NaNs (S.11111.xx, xx != 0), largest finite value 57344,
///   smallest subnormal 2^-16.
///
/// Conversion from f32 (and so from bf16 and f16, which widen to f32 exactly) rounds to
/// nearest, ties to even, with subnormals kept. Overflow follows PyTorch's (non-saturating)
/// casts to its float8 types:
/// - f8e4m3: a magnitude that rounds above 448 becomes NaN (so |x| > 464 gives NaN while 464,
///   the midpoint between 448 and the missing 480, rounds to even 448); infinities become NaN.
/// - f8e5m2: a magnitude that rounds above 57344 becomes infinity (|x| >= 61440, the midpoint
///   to the missing 65536, gives inf), as IEEE rounding does.
/// - NaN gives the NaN pattern S.1111.111 (e4m3) or S.11111.11 (e5m2), keeping the sign.
///
/// The saturating conversions (`from_f32_saturating`, the OCP spec's saturation mode, used by
/// quantization) clamp instead: a magnitude beyond the largest finite value, infinities
/// included, becomes ±448 (e4m3) or ±57344 (e5m2); NaN stays NaN.
///
/// Conversion to f32 is exact.
#pragma once

#include <cstdint>

#include "tpucore/core/half.h"

namespace tpu {

/// OCP FP8 E4M3 (PyTorch's float8_e4m3fn): finite values up to ±448, NaN = S.1111.111.
struct f8e4m3 {
  /// The raw 8 bits (sign, 4 exponent bits, 3 mantissa bits).
  uint8_t bits = 0;
  f8e4m3() = default;
  /// `f` rounded to nearest even (overflow gives NaN, see the file comment).
  explicit f8e4m3(float f) : bits(from_f32(f)) {}
  /// The f8e4m3 with raw bits `b`.
  static f8e4m3 from_bits(uint8_t b) {
    f8e4m3 r;
    r.bits = b;
    return r;
  }
  /// The largest finite value.
  static constexpr float kMax = 448.0f;

  /// The bits of `f` rounded to nearest even; magnitudes rounding above 448, infinities and
  /// NaN give NaN (S.1111.111).
  static uint8_t from_f32(float f) {
    uint32_t a = f32_bits(f);
    const uint32_t sign = a & 0x80000000u;
    a ^= sign;
    uint8_t r;
    if (a >= 0x43f00000u) {  // 480.0f and beyond (inf, NaN): the rounded value is past 448
      r = 0x7f;
    } else if (a < 0x3c800000u) {  // below 2^-6, the smallest normal: a multiple of 2^-9
      // Adding 2^14 (whose ulp is 2^-9) makes the f32 adder round to the subnormal step.
      const uint32_t step = 141u << 23;
      r = static_cast<uint8_t>(f32_bits(bits_f32(a) + bits_f32(step)) - step);
    } else {
      // Rebias the exponent (127 -> 7) and round the 20 dropped mantissa bits to even; a
      // carry into the exponent is correct, and 464 < |x| < 480 carries into 0x7f (NaN).
      const uint32_t odd = (a >> 20) & 1u;
      a += (static_cast<uint32_t>(7 - 127) << 23) + 0x7ffffu + odd;
      r = static_cast<uint8_t>(a >> 20);
    }
    return static_cast<uint8_t>(r | (sign >> 24));
  }
  /// As from_f32, but magnitudes beyond 448 (infinities included) become ±448; NaN stays NaN.
  static uint8_t from_f32_saturating(float f) {
    const uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint8_t>(0x7f | ((u >> 24) & 0x80u));
    if ((u & 0x7fffffffu) > 0x43e00000u) return static_cast<uint8_t>(0x7e | ((u >> 24) & 0x80u));
    return from_f32(f);
  }
  /// The exact f32 value.
  float to_f32() const {
    const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
    const uint32_t exp = (bits >> 3) & 0xfu, mant = bits & 0x7u;
    if (exp == 0xf && mant == 0x7) return bits_f32(sign | 0x7fc00000u);  // NaN
    if (exp == 0) {
      const float v = static_cast<float>(mant) * 0.001953125f;  // mant * 2^-9
      return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 120u) << 23) | (mant << 20));
  }
  /// Converts to f32 (exact).
  operator float() const { return to_f32(); }
};

/// OCP FP8 E5M2 (PyTorch's float8_e5m2): finite values up to ±57344, infinities and NaNs.
struct f8e5m2 {
  /// The raw 8 bits (sign, 5 exponent bits, 2 mantissa bits).
  uint8_t bits = 0;
  f8e5m2() = default;
  /// `f` rounded to nearest even (overflow gives infinity, see the file comment).
  explicit f8e5m2(float f) : bits(from_f32(f)) {}
  /// The f8e5m2 with raw bits `b`.
  static f8e5m2 from_bits(uint8_t b) {
    f8e5m2 r;
    r.bits = b;
    return r;
  }
  /// The largest finite value.
  static constexpr float kMax = 57344.0f;

  /// The bits of `f` rounded to nearest even; magnitudes rounding above 57344 give infinity,
  /// NaN gives S.11111.11.
  static uint8_t from_f32(float f) {
    uint32_t a = f32_bits(f);
    const uint32_t sign = a & 0x80000000u;
    a ^= sign;
    uint8_t r;
    if (a >= 0x47800000u) {  // 65536.0f and beyond: infinity, or NaN for a NaN
      r = a > 0x7f800000u ? 0x7f : 0x7c;
    } else if (a < 0x38800000u) {  // below 2^-14, the smallest normal: a multiple of 2^-16
      const uint32_t step = 134u << 23;  // 2^7, whose ulp is 2^-16
      r = static_cast<uint8_t>(f32_bits(bits_f32(a) + bits_f32(step)) - step);
    } else {
      // Rebias (127 -> 15) and round the 21 dropped bits to even; 61440 <= |x| carries into
      // the infinity pattern 0x7c.
      const uint32_t odd = (a >> 21) & 1u;
      a += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffffu + odd;
      r = static_cast<uint8_t>(a >> 21);
    }
    return static_cast<uint8_t>(r | (sign >> 24));
  }
  /// As from_f32, but magnitudes beyond 57344 (infinities included) become ±57344; NaN stays NaN.
  static uint8_t from_f32_saturating(float f) {
    const uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint8_t>(0x7f | ((u >> 24) & 0x80u));
    if ((u & 0x7fffffffu) > 0x47600000u) return static_cast<uint8_t>(0x7b | ((u >> 24) & 0x80u));
    return from_f32(f);
  }
  /// The exact f32 value.
  float to_f32() const {
    const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
    const uint32_t exp = (bits >> 2) & 0x1fu, mant = bits & 0x3u;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant ? 0x400000u | (mant << 21) : 0u));  // inf / NaN
    if (exp == 0) {
      const float v = static_cast<float>(mant) * 1.52587890625e-5f;  // mant * 2^-16
      return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 21));
  }
  /// Converts to f32 (exact).
  operator float() const { return to_f32(); }
};

}  // namespace tpu
