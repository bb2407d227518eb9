#include "tpucore/core/env.h"

#include <spdlog/spdlog.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "tpucore/core/log.h"

namespace tpu {

EnvInt parse_env_int(const char* name, const char* text, int64_t lo, int64_t hi) {
  std::string_view s(text ? text : "");
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi)
    return {std::nullopt, fmt::format("{}='{}' is not accepted: expected a whole number from {} to {}", name,
                                      text ? text : "", lo, hi)};
  return {v, {}};
}

std::optional<int64_t> env_int(const char* name, int64_t lo, int64_t hi, const char* fallback) {
  const char* s = std::getenv(name);
  if (!s || !*s) return std::nullopt;
  EnvInt r = parse_env_int(name, s, lo, hi);
  if (!r.value) log().warn("{}; {}", r.problem, fallback);
  return r.value;
}

}  // namespace tpu
