/// @file
/// The options of the StableHLO export (tpucore/export.h): which function name and attribute
/// syntax the module is written with, and the StableHLO version it targets. Kept apart (it needs
/// nothing else) so the public header and graph/stablehlo.h share it; installed with the public
/// headers.
#pragma once

#include <cstdint>
#include <string>

namespace tpu {

inline constexpr const char* kStableHloVersion = "1.0";

enum class StableHloSyntax : uint8_t { current, mlir14 };

struct StableHloOptions {
  std::string function_name = "main";
  StableHloSyntax syntax = StableHloSyntax::current;
};

}  // namespace tpu
