/// @file
/// The profiler: a scope that records host-side op calls (wall time per call, nested calls
/// such as type-promotion casts included) and chip-unit activity of the simulated devices (every
/// program run with its stats and, optionally, its per-unit timeline) into one Chrome
/// trace-event file (open in Perfetto or chrome://tracing), and summarizes them per op like
/// torch.profiler's key_averages().table().
///
///   tpu::profiler::Profile prof;           // starts recording
///   run_model();
///   prof.stop();
///   std::cout << prof.table();             // calls, host time, chip cycles, FLOPs, bytes, shares
///   prof.export_chrome_trace("trace.json");
///
/// One profile records at a time (a second one is a tpu::Error). Chip programs are attributed to
/// the innermost host op or RecordScope that enqueued them: a call of a compiled function is a
/// scope named "compiled:<name>" (its fused regions' programs appear there); fused regions run
/// outside any op or scope appear under their kernel's name ("region:mlp", ...), each run one call.
/// Programs enqueued before the profile started are not counted, even if they finish during it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tpu::profiler {

/// Options of a Profile.
struct ProfileOptions {
  bool chip_timeline = true;          ///< keep the per-unit timeline of every chip program
  bool record_shapes = true;          ///< input shapes/dtypes in the trace's event args
  size_t max_chip_events = 1u << 21;  ///< trace events kept over all programs (the rest counted)
};

/// Per-op summary (one row of the table).
struct OpSummary {
  /// The op, scope or kernel name.
  std::string name;
  uint64_t calls = 0;        ///< host calls; for a row of chip kernels outside any op, their runs
  double host_total_us = 0;  ///< wall time inside the op, nested ops included
  double host_self_us = 0;   ///< without nested ops
  uint64_t programs = 0;     ///< chip programs the op ran
  double chip_cycles = 0;    ///< simulated cycles of those programs
  double chip_us = 0;        ///< simulated time of those programs
  double flops = 0;          ///< MXU FLOPs on the chip, or the op's nominal FLOPs on the host
  uint64_t bytes = 0;        ///< HBM traffic on the chip, or the op's inputs + outputs on the host
};

/// A profile: records from construction until stop() (or destruction).
class Profile {
 public:
  /// Starts recording; a tpu::Error when another profile is recording.
  explicit Profile(ProfileOptions opt = {});
  ~Profile();  ///< stops if still recording
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;

  /// Stops recording: waits for the simulated devices' queued work so its programs are counted.
  void stop();
  /// True until stop().
  bool recording() const;

  /// Rows sorted by host time (by chip time when any chip program ran), largest first.
  std::vector<OpSummary> key_averages() const;
  /// A fixed-width text table of key_averages(); `row_limit` 0 prints every row.
  std::string table(size_t row_limit = 0) const;
  /// Chrome trace-event JSON: a "host" process with one track per thread, and one process per
  /// simulated device with one track per chip unit plus a "programs" track.
  std::string chrome_trace_json() const;
  void export_chrome_trace(const std::string& path) const;  ///< tpu::Error if it cannot write

  struct State;

 private:
  std::unique_ptr<State> state_;
};

/// A named span of user code in the active profile (like torch.profiler.record_function): its
/// host time is one row of the table (nested ops count as children), and chip programs enqueued
/// inside it are attributed to it. Without an active profile it costs one atomic load.
///
///   { tpu::profiler::RecordScope s("attention block"); y = block(x); }
class RecordScope {
 public:
  /// Opens the span `name` until the scope ends.
  explicit RecordScope(std::string_view name);
  ~RecordScope();
  RecordScope(const RecordScope&) = delete;
  RecordScope& operator=(const RecordScope&) = delete;

 private:
  Profile::State* state_ = nullptr;  ///< the profile that was recording at construction
};

}  // namespace tpu::profiler
