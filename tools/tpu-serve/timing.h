// What tpu-serve reports about time and devices beyond the engine's metrics:
//   - per response, the host's and (model on a sim device) the simulated chip's time to first
//     token and time per output token: response headers of a plain response, and the field
//     `tpucore_timing` of the last chunk before `data: [DONE]` of a streamed one;
//   - in /metrics, the counters of the device the model runs on: the simulated chip's cycles and
//     seconds (sim), or the PJRT client's executions, compiles and host fallbacks (pjrt).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "tpucore/serve/engine.h"

namespace tpu::serve_http {

// The response's timing from its engine sequences' (n / best_of): the earliest first token, the
// mean time per output token over the sequences with more than one token.
struct ResponseTiming {
  double ttft_ms = 0, tpot_ms = 0;
  bool has_chip = false;
  double chip_ttft_ms = 0, chip_tpot_ms = 0;
};
ResponseTiming response_timing(const std::vector<serve::RequestTiming>& seqs);

// Header names and values: x-tpucore-ttft-ms, x-tpucore-tpot-ms, and on a sim device
// x-tpucore-sim-ttft-ms, x-tpucore-sim-tpot-ms (milliseconds, 9 significant digits).
std::vector<std::pair<std::string, std::string>> timing_headers(const ResponseTiming& t);
// The same as a JSON object: {"ttft_ms", "tpot_ms"[, "sim_ttft_ms", "sim_tpot_ms"]}.
nlohmann::json timing_json(const ResponseTiming& t);

// Prometheus lines of the device `dev` (empty on the cpu); generation_tokens: the engine's.
std::string device_metrics(const Device& dev, int64_t generation_tokens);

}  // namespace tpu::serve_http
