// Library logging: one spdlog logger named "tpucore" writing to stderr (the library never
// prints to stdout). The level comes from TPU_LOG (trace, debug, info, warn, error, off;
// default warn) and can be changed at run time.
#pragma once

#include <string_view>

namespace spdlog {
class logger;
}

namespace tpu {

spdlog::logger& log();
// Sets the level by name; an unknown name is a tpu::Error listing the accepted ones.
void set_log_level(std::string_view level);

}  // namespace tpu
