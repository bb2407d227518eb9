#include "sim/trace.h"

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/assembly.h"
#include "sim/error.h"
#include "sim/program.h"

namespace tpu::sim {

std::string trace_to_chrome_json(const Trace& t, const Program* prog) {
  // Written by hand (not through nlohmann::json) so that million-event traces stay cheap.
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  const double us_per_cycle = 1.0 / (t.clock_ghz * 1000.0);
  bool first = true;
  for (size_t u = 0; u < t.unit_names.size(); ++u) {
    out += fmt::format("{}{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":{},\"args\":{{\"name\":{}}}}}",
                       first ? "" : ",\n", u, nlohmann::json(t.unit_names[u]).dump());
    out += fmt::format(",\n{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":{},\"args\":{{\"sort_index\":{}}}}}", u, u);
    first = false;
  }
  for (const auto& e : t.events) {
    std::string name = "instr";
    std::string text;
    if (prog && e.instr < prog->code.size()) {
      name = std::string(op_info(prog->code[e.instr].op).name);
      if (name == "wait" || name == "fence") name += " (stall)";
      text = nlohmann::json(format_instr(prog->code[e.instr])).dump();
    }
    out += fmt::format(",\n{{\"name\":\"{}\",\"ph\":\"X\",\"pid\":0,\"tid\":{},\"ts\":{:.6f},\"dur\":{:.6f},\"args\":{{\"instr\":{}",
                       name, e.unit, e.start * us_per_cycle, (e.end - e.start) * us_per_cycle, e.instr);
    out += fmt::format(",\"start_cycle\":{:.1f},\"end_cycle\":{:.1f}", e.start, e.end);
    if (!text.empty()) {
      out += ",\"asm\":";
      out += text;
    }
    out += "}}";
  }
  out += fmt::format("\n],\"otherData\":{{\"truncated\":{}}}}}\n", t.truncated ? "true" : "false");
  return out;
}

void write_chrome_trace(const std::string& path, const Trace& t, const Program* prog) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw SimError(fmt::format("cannot open trace file '{}' for writing", path));
  f << trace_to_chrome_json(t, prog);
  if (!f) throw SimError(fmt::format("failed writing trace file '{}'", path));
}

}  // namespace tpu::sim
