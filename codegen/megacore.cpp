#include "codegen/megacore.h"

#include <algorithm>

#include "sim/builder.h"

namespace tpu::codegen {

int megacore_cores(const sim::ChipConfig& cfg, double one_core_cycles) {
  const int cores = cfg.timing.megacore;
  if (cores <= 1) return 1;
  return one_core_cycles / 2 > cfg.dma.latency_cycles ? cores : 1;
}

sim::Program split_rows(const std::string& name, int cores, int64_t rows, int64_t align,
                        const std::vector<RowOperand>& operands, const std::function<sim::Program(int64_t)>& part) {
  align = std::max<int64_t>(1, align);
  const int64_t chunk = ((rows + cores - 1) / cores + align - 1) / align * align;
  if (cores <= 1 || chunk >= rows) return part(rows);
  sim::Program p;
  p.name = name;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    sim::ProgramBuilder b;
    for (const RowOperand& o : operands)
      if (r0 && o.bytes_per_row) b.sadd(o.reg, o.reg, r0 * o.bytes_per_row);
    sim::Program core = b.finish();
    sim::Program body = part(n);
    core.name = body.name;
    core.code.insert(core.code.end(), body.code.begin(), body.code.end());
    core.finalized = false;
    core.finalize();  // loop/endloop pairs move with the prologue
    p.cores.push_back(std::move(core));
  }
  p.finalize();
  return p;
}

}  // namespace tpu::codegen
