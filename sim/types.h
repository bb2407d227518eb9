// Basic value types of the simulated chip: memory spaces, element types, bf16 rounding.
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>
#include <optional>
#include <string_view>

namespace tpu::sim {

enum class Space : uint8_t { hbm, vmem };
// f8e4m3: OCP FP8 E4M3 ("fn": no infinities, 0x7f/0xff NaN, saturating at +-448), one byte.
enum class DType : uint8_t { f32, bf16, i32, i8, f8e4m3 };

inline constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i8: return 1;
    case DType::f8e4m3: return 1;
  }
  return 1;
}
inline constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i8: return "i8";
    case DType::f8e4m3: return "f8e4m3";
  }
  return "?";
}
inline std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "i32") return DType::i32;
  if (s == "i8") return DType::i8;
  if (s == "f8e4m3") return DType::f8e4m3;
  return std::nullopt;
}
inline constexpr std::string_view space_name(Space s) { return s == Space::hbm ? "hbm" : "vmem"; }

// bf16 <-> f32. f32 -> bf16 rounds to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return uint16_t((u >> 16) | 0x40u);
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return uint16_t((u + rounding) >> 16);
}
inline float bf16_bits_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round an f32 to the nearest bf16 value, returned as f32.
inline float round_to_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

// e4m3 <-> f32. Decoding is exact; f32 -> e4m3 rounds to nearest even and saturates to +-448
// (the OCP spec's saturating conversion); NaN stays NaN (0x7f, sign kept).
inline float e4m3_bits_to_f32(uint8_t b) {
  const int exp = (b >> 3) & 0xf, mant = b & 7;
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (exp == 15 && mant == 7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(float(mant), -9);
  return sign * std::ldexp(1.0f + float(mant) / 8.0f, exp - 7);
}
// The e4m3 value nearest f (ties to even), as f32; +-448 past the range.
inline float round_to_e4m3(float f) {
  if (std::isnan(f)) return f;
  const float a = std::fabs(f);
  if (a >= 448.0f) return std::copysign(448.0f, f);
  if (a == 0.0f) return f;
  int e = 0;
  std::frexp(a, &e);                             // a = m 2^e, m in [0.5, 1)
  const int q = (e - 1 < -6 ? -6 : e - 1) - 3;   // the spacing of e4m3 values near a: 2^q
  const float r = std::ldexp(std::nearbyint(std::ldexp(a, -q)), q);
  return std::copysign(r > 448.0f ? 448.0f : r, f);
}
inline uint8_t f32_to_e4m3_bits(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return uint8_t(sign | 0x7f);
  const float a = std::fabs(round_to_e4m3(f));
  if (a == 0.0f) return sign;
  int e = 0;
  std::frexp(a, &e);
  const int E = e - 1;
  if (E < -6) return uint8_t(sign | int(std::ldexp(a, 9)));  // subnormal: multiples of 2^-9
  return uint8_t(sign | ((E + 7) << 3) | int((std::ldexp(a, -E) - 1.0f) * 8.0f));
}

}  // namespace tpu::sim
