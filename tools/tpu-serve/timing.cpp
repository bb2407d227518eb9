#include "timing.h"

#include <fmt/format.h>

#include <algorithm>

#include "tpucore/devices.h"
#include "tpucore/runtime/pjrt_client.h"

namespace tpu::serve_http {

ResponseTiming response_timing(const std::vector<serve::RequestTiming>& seqs) {
  ResponseTiming t;
  bool first = true;
  int later = 0;
  for (const serve::RequestTiming& q : seqs) {
    t.has_chip |= q.has_chip;
    if (q.tokens == 0) continue;
    t.ttft_ms = first ? 1e3 * q.ttft_s : std::min(t.ttft_ms, 1e3 * q.ttft_s);
    t.chip_ttft_ms = first ? 1e3 * q.chip_ttft_s : std::min(t.chip_ttft_ms, 1e3 * q.chip_ttft_s);
    first = false;
    if (q.tokens > 1) {
      t.tpot_ms += 1e3 * q.tpot_s;
      t.chip_tpot_ms += 1e3 * q.chip_tpot_s;
      later++;
    }
  }
  if (later > 1) {
    t.tpot_ms /= later;
    t.chip_tpot_ms /= later;
  }
  return t;
}

std::vector<std::pair<std::string, std::string>> timing_headers(const ResponseTiming& t) {
  const auto ms = [](double v) { return fmt::format("{:.9g}", v); };
  std::vector<std::pair<std::string, std::string>> h{{"x-tpucore-ttft-ms", ms(t.ttft_ms)},
                                                     {"x-tpucore-tpot-ms", ms(t.tpot_ms)}};
  if (t.has_chip) {
    h.emplace_back("x-tpucore-sim-ttft-ms", ms(t.chip_ttft_ms));
    h.emplace_back("x-tpucore-sim-tpot-ms", ms(t.chip_tpot_ms));
  }
  return h;
}

nlohmann::json timing_json(const ResponseTiming& t) {
  nlohmann::json j{{"ttft_ms", t.ttft_ms}, {"tpot_ms", t.tpot_ms}};
  if (t.has_chip) {
    j["sim_ttft_ms"] = t.chip_ttft_ms;
    j["sim_tpot_ms"] = t.chip_tpot_ms;
  }
  return j;
}

namespace {
void serve_metric(std::string& o, const char* name, const char* type, const char* help, double v) {
  o += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
}
}  // namespace

std::string device_metrics(const Device& dev, int64_t generation_tokens) {
  std::string o;
  if (dev.type == DeviceType::sim) {
    // The chip's simulated time and traffic (all sim devices of the process, since start;
    // finished programs only), and the simulated chip time per generated token, the figure
    // behind a cost per token on that chip.
    const SimStats st = sim_stats();
    const double clock = device_properties(dev).clock_ghz;
    const double seconds = clock > 0 ? st.cycles / (clock * 1e9) : 0;
    serve_metric(o, "tpucore_sim_cycles_total", "counter", "Simulated chip cycles of the programs run.", st.cycles);
    serve_metric(o, "tpucore_sim_seconds_total", "counter",
                 "Simulated chip time of the programs run, at the preset's clock.", seconds);
    serve_metric(o, "tpucore_sim_hbm_bytes_total", "counter", "HBM bytes read and written by the programs run.",
                 double(st.hbm_bytes));
    serve_metric(o, "tpucore_sim_mxu_flops_total", "counter", "MXU FLOPs of the programs run.", st.mxu_flops);
    serve_metric(o, "tpucore_sim_host_fallbacks_total", "counter",
                 "Calls that ran on the host (no chip kernel took them).", double(st.host_fallbacks));
    serve_metric(o, "tpucore_sim_seconds_per_generated_token", "gauge",
                 "Simulated chip time (prefill and decode) per generated token.",
                 generation_tokens > 0 ? seconds / double(generation_tokens) : 0.0);
  } else if (dev.type == DeviceType::pjrt) {
    // The PJRT client's counters (all pjrt devices of the process, since start).
    const PjrtStats st = pjrt_stats();
    serve_metric(o, "tpucore_pjrt_executions_total", "counter", "Executables run by the PJRT plugin (eager ops).",
                 double(st.executions));
    serve_metric(o, "tpucore_pjrt_compiles_total", "counter", "Eager ops' executables compiled by the PJRT plugin.",
                 double(st.compiles));
    serve_metric(o, "tpucore_pjrt_graph_compiles_total", "counter",
                 "Compiled steps (tpu::compile graphs) compiled as one executable.", double(st.graph_compiles));
    serve_metric(o, "tpucore_pjrt_graph_runs_total", "counter", "Runs of the compiled steps' executables.",
                 double(st.graph_runs));
    serve_metric(o, "tpucore_pjrt_host_fallbacks_total", "counter",
                 "Op calls that ran on the host (no StableHLO counterpart).", double(st.host_fallbacks));
    serve_metric(o, "tpucore_pjrt_transfers_total", "counter", "Buffers copied between host and device.",
                 double(st.uploads + st.downloads));
  }
  return o;
}

}  // namespace tpu::serve_http
