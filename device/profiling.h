// Hooks by which a profiler (tpucore/profiler.h) sees device work: a per-thread tag naming the
// host op on whose behalf work is enqueued, and a sink that receives every finished simulator
// program run that was enqueued while it was installed, with its stats and timeline. Both cost one relaxed atomic load when unused.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "sim/program.h"
#include "sim/stats.h"
#include "sim/trace.h"

namespace tpu::device {

class SimDevice;

// One program run on a simulated chip, reported once the run finished (on the device's worker).
struct ProgramRun {
  std::string device;  // "sim:0"
  std::string program;
  std::string tag;     // the host op that enqueued it ("" when none was active)
  sim::Stats stats;
  std::shared_ptr<const sim::Trace> trace;      // null when the run was not traced
  std::shared_ptr<const sim::Program> code;     // for instruction names in the trace
};

class ProgramRunSink {
 public:
  virtual ~ProgramRunSink() = default;
  virtual void on_program_run(ProgramRun&& run) = 0;
  // A program was queued on `dev` (so the profiler knows which devices to drain when it stops).
  virtual void on_program_enqueued(SimDevice& dev) = 0;
  // Runs finished while the sink is installed are traced when this is true.
  virtual bool wants_trace() const = 0;
};

// Installs (or with nullptr removes) the sink. The caller keeps it alive until it is removed
// and every device has drained.
void set_program_run_sink(ProgramRunSink* sink);
ProgramRunSink* program_run_sink();

// The tag of the calling thread (a static string: an op name), copied into each run it enqueues.
void set_work_tag(const char* tag);
const char* work_tag();

}  // namespace tpu::device
