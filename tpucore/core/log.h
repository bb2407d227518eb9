/// @file
/// Library logging: one spdlog logger named "tpucore" writing to stderr (the library never
/// prints to stdout). The level comes from TPU_LOG (trace, debug, info, warn, error, off;
/// default warn) and can be changed at run time.
#pragma once

#include <string>
#include <string_view>

namespace spdlog {
class logger;
}

namespace tpu {

/// The library's spdlog logger ("tpucore", stderr).
spdlog::logger& log();
/// Sets the level by name; an unknown name is a tpu::Error listing the accepted ones.
void set_log_level(std::string_view level);
/// What is wrong with `value` as TPU_LOG (variable, value, accepted names); empty when valid.
/// An invalid TPU_LOG is reported with this text as the logger's first warning.
std::string log_level_problem(std::string_view value);

}  // namespace tpu
