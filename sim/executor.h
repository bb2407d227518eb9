// Internal: runs one program on one chip. See sim/README.md for the timing model.
#pragma once
#include "sim/chip.h"

namespace tpu::sim::detail {

RunResult execute(Chip& chip, const Program& prog, const RunOptions& opt);

}  // namespace tpu::sim::detail
