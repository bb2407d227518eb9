// Execution trace: one event per executed instruction on the unit that ran it, written as
// Chrome trace-event JSON (chrome://tracing, Perfetto): one track (tid) per unit.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sim/isa.h"

namespace tpu::sim {

struct Program;

struct TraceEvent {
  uint32_t unit = 0;   // index into Trace::unit_names
  uint32_t instr = 0;  // static instruction index
  double start = 0;    // cycles
  double end = 0;
};

struct Trace {
  std::vector<std::string> unit_names;
  std::vector<TraceEvent> events;
  double clock_ghz = 1;
  bool truncated = false;  // more events than RunOptions::max_trace_events
};

// `prog` (optional) adds each event's opcode and assembly text.
std::string trace_to_chrome_json(const Trace& t, const Program* prog = nullptr);
void write_chrome_trace(const std::string& path, const Trace& t, const Program* prog = nullptr);

}  // namespace tpu::sim
