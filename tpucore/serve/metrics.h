// The engine's metrics in the Prometheus text exposition format (version 0.0.4): gauges for
// the queue, the running requests and the KV blocks, counters for tokens and requests, and
// histograms of the time to first token and the time per output token.
#pragma once

#include <string>

#include "tpucore/serve/engine.h"

namespace tpu::serve {

// Every metric is named tpu_serve_*; `extra` (already formatted lines) is appended as is.
std::string prometheus_text(const EngineMetrics& m, const std::string& extra = {});

}  // namespace tpu::serve
