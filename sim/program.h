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
  // Megacore: when not empty, one part per TensorCore of the device (part i runs on core i,
  // each with its own scalar unit, registers, semaphores, MXUs, vector units, DMA queues and
  // VMEM; HBM and its bandwidth are shared) and `code` must be empty. sim/README.md, "Megacore".
  std::vector<Program> cores;
  bool finalized = false;

  bool megacore() const { return !cores.empty(); }

  // Idempotent. Throws SimError("instruction #i (text): why").
  void finalize();
  // Checks against a chip (register/semaphore/MXU/DMA-queue indices, MXU tile sizes).
  void check_against(const ChipConfig& cfg) const;
  bool operator==(const Program& o) const { return code == o.code && cores == o.cores; }
};

// "instruction #12 (vadd dst=vmem[0]:f32 ...)": used in every error about one instruction.
std::string describe_instr(const Program& p, size_t index);

}  // namespace tpu::sim
