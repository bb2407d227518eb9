// Stats of one run: cycles and time, busy cycles per unit, MXU utilization, FLOPs, HBM
// traffic, achieved FLOP/s, MFU and arithmetic intensity. Printable and JSON-able.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tpu::sim {

struct UnitStats {
  std::string name;
  double busy_cycles = 0;
  uint64_t instructions = 0;
};

// The work a run counted, which the calibrated timing model (timing_model.h) prices.
struct CoreWork {
  double mxu_stream_cycles = 0;  // streaming cycles summed over the core's MXUs (padding included)
  double vector_cycles = 0;      // busy cycles of the core's busiest of vpu, eup, xlu
  double mxu_weight_cycles = 0;  // weight-load cycles summed over the core's MXUs
  double xlu_cycles = 0;         // busy cycles of the cross-lane unit (row reductions, transposes)
  double narrow_store_bytes = 0; // bytes vector ops wrote as 16-bit results (packed stores)
  double dmas = 0;               // DMAs issued
};
struct CountedWork {
  std::vector<CoreWork> cores;           // one per TensorCore the program ran on (1 unless megacore)
  uint64_t compulsory_read_bytes = 0;    // HBM bytes read at least once
  uint64_t compulsory_written_bytes = 0; // HBM bytes written at least once
  uint64_t traffic_bytes = 0;            // all HBM bytes moved (read + written)
  uint64_t compulsory_bytes() const { return compulsory_read_bytes + compulsory_written_bytes; }
};

struct Stats {
  std::string chip;
  bool timing_only = false;
  double clock_ghz = 1;
  double cycles = 0;                // total, in the chip's timing model (see timing_model)
  double ideal_cycles = 0;          // the event timeline's total (last unit done)
  std::string timing_model = "ideal";  // "ideal" or "calibrated" (config.h, TimingConfig)
  double seconds = 0;               // cycles / clock
  uint64_t instructions = 0;        // dynamic instructions executed (incl. loop control)
  uint64_t static_instructions = 0; // program length
  std::vector<UnitStats> units;     // scalar, mxu0.., mxu0.weights.., vpu, eup, xlu, dma0..
  double mxu_flops = 0;             // 2*m*k*n per matmul
  double vector_elements = 0;       // elements produced by vector/eup/xlu ops
  uint64_t hbm_bytes_read = 0;
  uint64_t hbm_bytes_written = 0;
  uint64_t dma_bytes = 0;           // all DMA traffic (incl. vmem->vmem)
  double peak_flops = 0;            // of the simulated core for the run's MXU modes (bf16 if none)
  std::string mxu_modes;            // modes of the run's matmuls: "bf16", "f32", "i8", "bf16+i8", ...
  double mxu_peak_cycles = 0;       // cycles the run's matmuls take at their modes' peak rates
  double hbm_bytes_per_cycle = 0;   // configured
  double mxu_busy_fraction = 0;     // sum of MXU streaming cycles / (cycles * MXUs)
  double mfu = 0;                   // mxu_peak_cycles / cycles (per-mode peaks)
  double flops_per_second = 0;      // achieved
  double arithmetic_intensity = 0;  // mxu_flops / HBM bytes
  double hbm_bandwidth_fraction = 0;  // HBM bytes / (cycles * configured bytes per cycle)
  uint64_t races = 0;               // race-checker reports (0 if the checker is off)
  bool race_check = false;
  CountedWork work;                 // what the calibrated model priced (compulsory bytes: calibrated chips only)
};

std::string format_report(const Stats& s);
nlohmann::json stats_to_json(const Stats& s);

}  // namespace tpu::sim
