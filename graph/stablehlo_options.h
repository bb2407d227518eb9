/// @file
/// The options of the StableHLO export (tpucore/export.h): which function name and attribute
/// syntax the module is written with, and the StableHLO version it targets. Kept apart (it needs
/// nothing else) so the public header and graph/stablehlo.h share it; installed with the public
/// headers.
#pragma once

#include <cstdint>
#include <string>

namespace tpu {

/// The StableHLO version the export targets.
inline constexpr const char* kStableHloVersion = "1.0";

/// The attribute syntax of the module: StableHLO's current one, or the older one MLIR 14 parses.
enum class StableHloSyntax : uint8_t { current, mlir14 };

/// Options of tpu::export_stablehlo.
struct StableHloOptions {
  /// Name of the exported function.
  std::string function_name = "main";
  /// Attribute syntax.
  StableHloSyntax syntax = StableHloSyntax::current;
};

}  // namespace tpu
