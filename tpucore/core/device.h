/// @file
/// Device identifiers: "cpu", "sim", "sim:1", "tpu:0", "pjrt:0".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tpu {

/// The kind of a device: the host cpu, the chip simulator, a real chip through a plugin
/// driver, or a PJRT plugin.
enum class DeviceType : uint8_t { cpu = 0, sim = 1, tpu = 2, pjrt = 3 };
/// Number of DeviceType values.
inline constexpr int kNumDeviceTypes = 4;

/// Where a tensor lives: a type and an index ("sim:1" is the simulator's device 1). Converts
/// implicitly from strings, so ops accept "cpu", "sim", "sim:1", "tpu:0" or "pjrt:0".
struct Device {
  /// The kind of device.
  DeviceType type = DeviceType::cpu;
  /// The device number within its kind (0 when the string gives none).
  int index = 0;

  Device() = default;
  /// Device `i` of kind `t`.
  Device(DeviceType t, int i = 0) : type(t), index(i) {}
  /// Parses a device string; a bad one is a tpu::Error naming it and the accepted forms.
  Device(const char* s);
  /// Parses a device string, as Device(const char*).
  Device(std::string_view s);
  /// Parses a device string, as Device(const char*).
  Device(const std::string& s) : Device(std::string_view(s)) {}

  /// True for the host cpu.
  bool is_cpu() const { return type == DeviceType::cpu; }
  std::string str() const;  ///< "cpu", "sim:0"
  /// Same type and index.
  friend bool operator==(const Device& a, const Device& b) { return a.type == b.type && a.index == b.index; }
  /// Not operator==.
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

/// "cpu", "sim", "tpu" or "pjrt".
std::string_view device_type_name(DeviceType t);

}  // namespace tpu
