// The engine's metrics in the Prometheus text exposition format (version 0.0.4): gauges for
// the queue, the running requests and the KV blocks, counters for tokens and requests, and
// histograms of the time to first token and the time per output token.
#pragma once

#include <string>

#include "tpucore/serve/engine.h"

namespace tpu::serve {

// Every metric is named tpu_serve_*; `extra` (already formatted lines) is appended as is.
// With a model_name, vLLM's names and meanings follow as well (labelled model_name="..."), so
// routers and dashboards made for vLLM read them unchanged: vllm:num_requests_running,
// vllm:num_requests_waiting, vllm:kv_cache_usage_perc (0..1), vllm:prompt_tokens_total,
// vllm:generation_tokens_total, vllm:num_preemptions_total, vllm:request_success_total, and the
// histograms vllm:time_to_first_token_seconds, vllm:time_per_output_token_seconds,
// vllm:e2e_request_latency_seconds.
std::string prometheus_text(const EngineMetrics& m, const std::string& extra = {}, const std::string& model_name = {});

}  // namespace tpu::serve
