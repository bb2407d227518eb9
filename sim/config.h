// ChipConfig: the figures that define a simulated TensorCore (one device). Parsed from JSON
// (see presets.h for the named presets); every field is validated and a bad value is a
// SimError naming the field.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tpu::sim {

struct MxuConfig {
  int count = 1;                  // MXUs per core
  int rows = 8;                   // R: contraction (K) depth of the array
  int cols = 8;                   // C: output columns (N) of the array
  double fill_cycles = 8;         // pipeline fill before the first result row
  double drain_cycles = 8;        // pipeline drain after the last LHS row enters
  double weight_load_cycles_per_row = 1;  // cycles per weight row loaded (K rows per tile)
  double bf16_cycles_per_row = 1;  // cycles per streamed LHS row, bf16 inputs
  double f32_cycles_per_row = 4;   // f32 mode (XLA HIGHEST: 6 bf16 passes; the TPU presets say 6)
  double int8_cycles_per_row = 0.5;  // int8 inputs, i32 accumulation
  // fp8 (e4m3) inputs, f32 accumulation (MxuMode::fp8); 0 = the MXU has no fp8 mode (no chip
  // preset before v5p publishes an fp8 rate): an mxu.mm in mode fp8 then fails.
  double fp8_cycles_per_row = 0;
};

struct VpuConfig {
  int sublanes = 8;
  int lanes = 128;
  double cycles_per_vreg = 1;      // elementwise op cost per (sublanes x lanes) tile
  double latency = 2;
};

struct EupConfig {                 // transcendental path (exp, log, tanh, rsqrt, recip, erf, sqrt)
  double cycles_per_vreg = 4;
  double latency = 8;
};

struct XluConfig {                 // cross-lane unit: row/column reductions, transposes
  double reduce_cycles_per_vreg = 2;
  double transpose_cycles_per_vreg = 4;
  double latency = 8;
};

struct ScalarConfig {
  double issue_cycles = 1;         // cycles per issued instruction (incl. loop control)
  int queue_depth = 16;            // instructions a unit may hold before issue stalls
  int registers = 32;
  int semaphores = 32;
};

struct MemoryConfig {
  uint64_t vmem_bytes = 0;
  uint64_t hbm_bytes = 0;
  double hbm_bandwidth_gbps = 0;   // GB/s (1e9 bytes/s), shared by all DMAs touching HBM
};

struct DmaConfig {
  int engines = 2;                 // DMA queues; each processes its DMAs in order
  double latency_cycles = 100;     // fixed latency before the first byte moves
  double engine_bytes_per_cycle = 64;  // max rate of one engine
};

// Which timing a run reports. "ideal": the event timeline of the program on the configured
// units (every DMA, MXU pass and vector op placed by its dependencies; what-if studies).
// "calibrated": a per-program cost model fed by the work the timeline counted, with the
// mechanisms real TPUs show (sim/README.md, "Timing models"; constants fitted on
// sim/calibration/tpu_v4):
//   cycles = launch + fill + max(C, M) + (1 - memory_overlap) * min(C, M)
//   C = max(MXU streaming cycles / (mxu.count x megacore x mxu_efficiency),
//           vector-unit busy cycles / megacore)
//   M = HBM bytes / (hbm_bytes_per_cycle x megacore x hbm_efficiency)
//   fill = mxu.fill_cycles when the program uses an MXU (pipeline fill of the array)
// The timeline still runs (values, ordering, races) and its figure stays in Stats::ideal_cycles.
struct TimingConfig {
  std::string model = "ideal";     // "ideal" or "calibrated"
  double launch_cycles = 0;        // fixed cost per launched program (launch + pipeline start)
  int megacore = 1;                // TensorCores driven as one device (work split evenly)
  double mxu_efficiency = 1;       // fraction of the MXU peak a kernel sustains, (0, 1]
  double hbm_efficiency = 1;       // fraction of the HBM bandwidth a kernel sustains, (0, 1]
  double memory_overlap = 1;       // fraction of min(compute, memory) hidden, [0, 1]
  // Fraction of the HBM bandwidth sustained by kernels that store no 16-bit vector results
  // (row reductions, f32 results, copies); 0 = hbm_efficiency. A kernel's memory time weighs the
  // two fractions by the share of its written bytes that vector ops stored as 16-bit results.
  double wide_hbm_efficiency = 0;
  double reduce_cycles = 0;        // fixed cost of a program that reduces rows on the cross-lane unit
  double dma_cycles = 0;           // fixed cost per DMA a program issues (descriptor, small-transfer overhead)
  double weight_load_exposed = 0;  // fraction of the MXU weight-load cycles not hidden under streaming, [0, 1]
  // XLA's matmul kernels on 16-bit inputs the MXU cannot take as they are (float16 on v4), priced by
  // xla_matmul_cycles (timing_model.h); 0 = off. Elements of the prefetched operand converted (and
  // transposed where its layout needs it) once per kernel, per cycle over the device:
  double convert_elems_per_cycle = 0;
  // Elements of a streamed operand whose layout needs an in-kernel transpose, transposed and
  // converted per cycle over the device; it is re-fed once per 128-column MXU panel of the other side.
  double restream_elems_per_cycle = 0;
  bool calibrated() const { return model == "calibrated"; }
};

struct ChipConfig {
  std::string name;
  std::string description;
  std::vector<std::string> sources;
  std::vector<std::string> notes;
  double clock_ghz = 1.0;
  int cores_per_chip = 1;          // a preset models one TensorCore; a chip has this many
  double published_peak_tflops = 0;  // published bf16 peak per chip (0 = none)
  double published_fp8_tflops = 0;   // published fp8 peak per chip (0 = none published)
  MxuConfig mxu;
  VpuConfig vpu;
  EupConfig eup;
  XluConfig xlu;
  ScalarConfig scalar;
  MemoryConfig memory;
  DmaConfig dma;
  TimingConfig timing;

  double hbm_bytes_per_cycle() const { return memory.hbm_bandwidth_gbps / clock_ghz; }
  // Peak bf16 FLOP/s of this core: MXUs x R x C x 2 x clock / bf16_cycles_per_row.
  double peak_flops() const { return peak_flops_at(mxu.bf16_cycles_per_row); }
  double chip_peak_flops() const { return peak_flops() * cores_per_chip; }
  // Peak FLOP/s (OP/s for int8) of this core for MXU inputs streamed at `cycles_per_row`
  // (mxu.bf16_cycles_per_row, mxu.f32_cycles_per_row or mxu.int8_cycles_per_row): every MXU
  // does R x C multiply-adds per streamed row.
  double peak_flops_at(double cycles_per_row) const {
    return double(mxu.count) * mxu.rows * mxu.cols * 2.0 * clock_ghz * 1e9 / cycles_per_row;
  }

  // Throws SimError naming the first invalid field.
  void validate() const;
};

// JSON <-> config. Missing optional fields keep their defaults; unknown fields are errors.
ChipConfig config_from_json(const nlohmann::json& j);
ChipConfig config_from_json_text(const std::string& text);
nlohmann::json config_to_json(const ChipConfig& c);

}  // namespace tpu::sim
