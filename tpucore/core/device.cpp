#include "tpucore/core/device.h"

#include <charconv>

#include "tpucore/core/error.h"

namespace tpu {

std::string_view device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::cpu: return "cpu";
    case DeviceType::sim: return "sim";
    case DeviceType::tpu: return "tpu";
    case DeviceType::pjrt: return "pjrt";
  }
  return "?";
}

Device::Device(const char* s) : Device(std::string_view(s ? s : "")) {}

Device::Device(std::string_view s) {
  std::string_view kind = s, idx;
  auto colon = s.find(':');
  if (colon != std::string_view::npos) {
    kind = s.substr(0, colon);
    idx = s.substr(colon + 1);
  }
  if (kind == "cpu") type = DeviceType::cpu;
  else if (kind == "sim") type = DeviceType::sim;
  else if (kind == "tpu") type = DeviceType::tpu;
  else if (kind == "pjrt") type = DeviceType::pjrt;
  else
    fail("Device: invalid device string '{}' (expected 'cpu', 'sim', 'sim:N', 'tpu:N' or 'pjrt:N')", s);
  index = 0;
  if (colon != std::string_view::npos) {
    int v = -1;
    auto [p, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), v);
    TPU_CHECK(!idx.empty() && ec == std::errc() && p == idx.data() + idx.size() && v >= 0 && v < 1024,
              "Device: invalid device index in '{}' (expected a number from 0 to 1023 after ':')", s);
    TPU_CHECK(type != DeviceType::cpu || v == 0, "Device: invalid device '{}': there is one cpu device, 'cpu' (or 'cpu:0')", s);
    index = v;
  }
}

std::string Device::str() const {
  if (type == DeviceType::cpu) return "cpu";
  return std::string(device_type_name(type)) + ":" + std::to_string(index);
}

}  // namespace tpu
