/// @file
/// Device identifiers: "cpu", "sim", "sim:1", "tpu:0", "pjrt:0".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tpu {

enum class DeviceType : uint8_t { cpu = 0, sim = 1, tpu = 2, pjrt = 3 };
inline constexpr int kNumDeviceTypes = 4;

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  Device() = default;
  Device(DeviceType t, int i = 0) : type(t), index(i) {}
  /// Parses a device string; a bad one is a tpu::Error naming it and the accepted forms.
  Device(const char* s);
  Device(std::string_view s);
  Device(const std::string& s) : Device(std::string_view(s)) {}

  bool is_cpu() const { return type == DeviceType::cpu; }
  std::string str() const;  ///< "cpu", "sim:0"
  friend bool operator==(const Device& a, const Device& b) { return a.type == b.type && a.index == b.index; }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

std::string_view device_type_name(DeviceType t);

}  // namespace tpu
