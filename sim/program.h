// Program: a list of instructions. `finalize()` pairs loop/endloop, fills default strides
// and checks everything that does not depend on a chip config; errors name the instruction.
#pragma once
#include <string>
#include <vector>

#include "sim/isa.h"

namespace tpu::sim {

struct ChipConfig;

struct Program {
  std::string name;
  std::vector<Instr> code;
  bool finalized = false;

  // Idempotent. Throws SimError("instruction #i (text): why").
  void finalize();
  // Checks against a chip (register/semaphore/MXU/DMA-queue indices, MXU tile sizes).
  void check_against(const ChipConfig& cfg) const;
  bool operator==(const Program& o) const { return code == o.code; }
};

// "instruction #12 (vadd dst=vmem[0]:f32 ...)": used in every error about one instruction.
std::string describe_instr(const Program& p, size_t index);

}  // namespace tpu::sim
