#include "tpucore/core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "tpucore/core/error.h"

namespace tpu {
namespace {

spdlog::level::level_enum parse_level(std::string_view s, bool strict) {
  if (s == "trace") return spdlog::level::trace;
  if (s == "debug") return spdlog::level::debug;
  if (s == "info") return spdlog::level::info;
  if (s == "warn" || s == "warning") return spdlog::level::warn;
  if (s == "error") return spdlog::level::err;
  if (s == "off") return spdlog::level::off;
  if (strict) fail("set_log_level: unknown level '{}' (expected trace, debug, info, warn, error or off)", s);
  return spdlog::level::warn;
}

}  // namespace

spdlog::logger& log() {
  static spdlog::logger* l = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto* lg = new spdlog::logger("tpucore", sink);  // leaked: usable during static destruction
    lg->set_pattern("[tpucore %^%l%$] %v");
    const char* env = std::getenv("TPU_LOG");
    lg->set_level(env ? parse_level(env, false) : spdlog::level::warn);
    if (env) {
      const std::string problem = log_level_problem(env);
      if (!problem.empty()) lg->warn("{}", problem);
    }
    return lg;
  }();
  return *l;
}

std::string log_level_problem(std::string_view value) {
  static const char* const names[] = {"trace", "debug", "info", "warn", "warning", "error", "off"};
  for (const char* n : names)
    if (value == n) return {};
  return fmt::format("TPU_LOG='{}' is not a log level: expected trace, debug, info, warn, error or off; using warn",
                     value);
}

void set_log_level(std::string_view level) { log().set_level(parse_level(level, true)); }

}  // namespace tpu
