// Chrome trace-event export of a Profile: host op spans (pid 1, one tid per host thread) and,
// per simulated device, a "programs" track with one span per program run and one track per
// chip unit with its instructions (simulated time, programs laid end to end).
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/isa.h"
#include "tpucore/core/error.h"
#include "tpucore/profiler/state.h"

namespace tpu::profiler {
namespace {

std::string jstr(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

void meta(std::string& out, const char* what, int pid, int tid, const std::string& name) {
  out += fmt::format(",\n{{\"name\":\"{}\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}}}", what, pid,
                     tid, jstr(name));
}

}  // namespace

std::string Profile::chrome_trace_json() const {
  const State& s = *state_;
  std::lock_guard<std::mutex> lk(s.mu);
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"host\"}}";
  for (const auto& [id, tid] : s.threads) meta(out, "thread_name", 1, tid, tid == 0 ? "main" : fmt::format("thread {}", tid));
  for (const HostEvent& e : s.host) {
    out += fmt::format(",\n{{\"name\":{},\"cat\":\"op\",\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f},\"args\":{{",
                       jstr(e.name), e.tid, static_cast<double>(e.start_ns - s.t0_ns) * 1e-3,
                       static_cast<double>(e.dur_ns) * 1e-3);
    out += fmt::format("\"inputs\":{},\"self_us\":{:.3f}", jstr(e.args), static_cast<double>(e.self_ns) * 1e-3);
    if (e.flops > 0) out += fmt::format(",\"flops\":{:.0f}", e.flops);
    out += "}}";
  }
  // One process per device; tid 0 the programs, tid 1 + u the chip units.
  std::map<std::string, int> pid_of;
  std::map<std::string, std::map<std::string, int>> unit_tid;
  for (const ChipRun& c : s.runs) {
    auto [it, fresh] = pid_of.emplace(c.device, 10 + static_cast<int>(pid_of.size()));
    const int pid = it->second;
    if (fresh) {
      meta(out, "process_name", pid, 0, fmt::format("{} ({}, simulated time)", c.device, c.stats.chip));
      meta(out, "thread_name", pid, 0, "programs");
    }
    const double us0 = c.start_s * 1e6;
    out += fmt::format(",\n{{\"name\":{},\"cat\":\"program\",\"ph\":\"X\",\"pid\":{},\"tid\":0,\"ts\":{:.3f},\"dur\":{:.3f},"
                       "\"args\":{{\"program\":{},\"cycles\":{:.0f},\"mxu_flops\":{:.0f},\"hbm_bytes\":{},\"mfu\":{:.4f}}}}}",
                       jstr(c.tag.empty() ? c.program : c.tag), pid, us0, c.stats.seconds * 1e6, jstr(c.program),
                       c.stats.cycles, c.stats.mxu_flops, c.stats.hbm_bytes_read + c.stats.hbm_bytes_written,
                       c.stats.mfu);
    if (!c.trace) continue;
    auto& tids = unit_tid[c.device];
    std::vector<int> tid_of(c.trace->unit_names.size());
    for (size_t u = 0; u < c.trace->unit_names.size(); ++u) {
      auto [ut, ufresh] = tids.emplace(c.trace->unit_names[u], 1 + static_cast<int>(tids.size()));
      tid_of[u] = ut->second;
      if (ufresh) meta(out, "thread_name", pid, ut->second, c.trace->unit_names[u]);
    }
    const double us_per_cycle = 1.0 / (c.trace->clock_ghz * 1000.0);
    for (const sim::TraceEvent& e : c.trace->events) {
      std::string name = "instr";
      if (c.code && e.instr < c.code->code.size()) name = std::string(sim::op_info(c.code->code[e.instr].op).name);
      const int tid = e.unit < tid_of.size() ? tid_of[e.unit] : 0;
      out += fmt::format(",\n{{\"name\":\"{}\",\"cat\":\"chip\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.4f},\"dur\":{:.4f}}}",
                         name, pid, tid, us0 + e.start * us_per_cycle, (e.end - e.start) * us_per_cycle);
    }
  }
  out += fmt::format("\n],\"otherData\":{{\"dropped_chip_events\":{}}}}}\n", s.dropped_chip_events);
  return out;
}

void Profile::export_chrome_trace(const std::string& path) const {
  std::ofstream f(path, std::ios::binary);
  TPU_CHECK(static_cast<bool>(f), "profiler: cannot open '{}' for writing the trace", path);
  f << chrome_trace_json();
  TPU_CHECK(static_cast<bool>(f), "profiler: failed writing the trace to '{}'", path);
}

}  // namespace tpu::profiler
