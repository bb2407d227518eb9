// Chip: one simulated TensorCore with its HBM and VMEM. Create it from a config, copy bytes
// between host and HBM/VMEM, run programs (functional or timing-only) and read the stats,
// trace and race reports. Memory persists across runs (a driver allocates in HBM).
//
//   tpu::sim::Chip chip(tpu::sim::preset_config("v5e"));
//   chip.write_hbm(0, host_ptr, bytes);
//   auto res = chip.run(program, {.timing_only = false, .trace = true});
//   fmt::print("{}", tpu::sim::format_report(res.stats));
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sim/config.h"
#include "sim/memory.h"
#include "sim/program.h"
#include "sim/stats.h"
#include "sim/trace.h"

namespace tpu::sim {

#ifdef NDEBUG
inline constexpr bool kRaceCheckDefault = false;
#else
inline constexpr bool kRaceCheckDefault = true;
#endif

struct RunOptions {
  bool timing_only = false;   // skip the arithmetic and data movement; same cycle counts
  bool race_check = kRaceCheckDefault;
  bool fail_on_race = false;  // throw SimError at the first race instead of collecting reports
  bool trace = false;
  size_t max_trace_events = size_t(1) << 21;
  uint64_t max_instructions = uint64_t(1) << 40;  // guard against runaway loops
  // Initial values of scalar registers r0, r1, ... (the rest start at 0): a program's
  // arguments, e.g. the HBM addresses of its operands, so one loaded program serves any buffers.
  std::vector<int64_t> registers{};
};

// A race: `second` touched bytes that the DMA `first` (not yet waited on) writes or reads.
struct RaceReport {
  size_t first = 0, second = 0;  // static instruction indices
  std::string kind;              // "read-after-write", "write-after-write", "write-after-read"
  std::string message;           // names both instructions and the memory range
};

struct RunResult {
  Stats stats;
  Trace trace;
  std::vector<RaceReport> races;
  std::vector<int64_t> registers;  // scalar registers at the end
};

class Chip {
 public:
  explicit Chip(const ChipConfig& cfg);
  // Preset name, JSON file path or JSON text.
  static Chip create(const std::string& preset_or_json);
  Chip(Chip&&) noexcept;
  Chip& operator=(Chip&&) noexcept;
  ~Chip();

  const ChipConfig& config() const { return cfg_; }
  uint64_t hbm_size() const { return hbm_->size(); }
  uint64_t vmem_size() const { return vmem_->size(); }

  // Host access; out-of-range ranges throw SimError.
  void write_hbm(uint64_t addr, const void* src, uint64_t bytes);
  void read_hbm(uint64_t addr, void* dst, uint64_t bytes) const;
  void fill_hbm(uint64_t addr, uint8_t value, uint64_t bytes);
  void write_vmem(uint64_t addr, const void* src, uint64_t bytes);
  void read_vmem(uint64_t addr, void* dst, uint64_t bytes) const;

  // Finalizes a copy if needed, checks the program against this chip, runs it.
  RunResult run(const Program& prog, const RunOptions& opt = {});

  Memory& hbm() { return *hbm_; }
  Memory& vmem() { return *vmem_; }
  // Core `core`'s VMEM on a megacore device (0 is vmem(); the others are made on first use).
  Memory& vmem(int core);

 private:
  ChipConfig cfg_;
  std::unique_ptr<Memory> hbm_, vmem_;
  std::vector<std::unique_ptr<Memory>> core_vmem_;  // cores 1.. of a megacore device
};

}  // namespace tpu::sim
