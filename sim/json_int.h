// Internal, header-only: reads an integer from a JSON value that came from outside (a file, a
// request). Every reader of outside JSON in the project goes through it: the simulator's (program
// JSON, ICI config) and the runtime's above it (graph JSON, checkpoint config, tokenizer,
// tpu-serve requests), which is why it lives in the bottom layer and needs only nlohmann/json.
//
// nlohmann's get<int64_t>() alone is not safe on such input: on a float such as 4.7e23 it is an
// out-of-range float-to-integer conversion (undefined behaviour), and on an unsigned integer past
// INT64_MAX it wraps to a negative number. The caller words the error, naming its file and field.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

namespace tpu::detail {

// The value when `v` is a JSON integer within [lo, hi]; nothing for anything else (a float, even an
// integral one such as 2.0, a string, null, or an integer outside the range).
inline std::optional<int64_t> json_int(const nlohmann::json& v, int64_t lo = std::numeric_limits<int64_t>::min(),
                                       int64_t hi = std::numeric_limits<int64_t>::max()) {
  if (!v.is_number_integer()) return std::nullopt;
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    x = static_cast<int64_t>(u);
  } else {
    x = v.get<int64_t>();
  }
  if (x < lo || x > hi) return std::nullopt;
  return x;
}

}  // namespace tpu::detail
