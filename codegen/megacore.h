// Megacore in codegen: on a chip whose TensorCores run as one device (timing.megacore > 1: TPU
// v4, v5p), a kernel's independent work is split between the cores as XLA does, one program
// part per core (sim::Program::cores): a matmul's output tiles (M blocks, else N panels), the
// rows of elementwise and row-wise kernels. Each part has its own MXUs, vector units, DMA queues
// and VMEM; the HBM bandwidth is shared. Small kernels stay on core 0 (see megacore_cores).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "sim/config.h"
#include "sim/program.h"

namespace tpu::codegen {

// Cores to split a kernel over: cfg.timing.megacore when half of the one-core estimate
// (`one_core_cycles`: its streaming compute or HBM time, whichever is longer) exceeds a core's
// fixed pipeline start (one DMA latency: below it a split saves less than the second core's
// first load costs), else 1.
int megacore_cores(const sim::ChipConfig& cfg, double one_core_cycles);

// An operand whose HBM address register advances by `bytes_per_row` for each row a core skips.
struct RowOperand {
  int reg = 0;
  int64_t bytes_per_row = 0;
};

// `rows` rows over `cores` cores in contiguous chunks (multiples of `align` rows): core c runs
// `part(its rows)` after advancing the operand registers to its first row. One core, or a split
// that leaves one chunk: part(rows) itself.
sim::Program split_rows(const std::string& name, int cores, int64_t rows, int64_t align,
                        const std::vector<RowOperand>& operands, const std::function<sim::Program(int64_t)>& part);

}  // namespace tpu::codegen
