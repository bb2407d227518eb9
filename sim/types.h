// Basic value types of the simulated chip: memory spaces, element types, bf16 rounding.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tpu::sim {

enum class Space : uint8_t { hbm, vmem };
enum class DType : uint8_t { f32, bf16, i32, i8 };

inline constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i8: return 1;
  }
  return 1;
}
inline constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i8: return "i8";
  }
  return "?";
}
inline std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "i32") return DType::i32;
  if (s == "i8") return DType::i8;
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

}  // namespace tpu::sim
