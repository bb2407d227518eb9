#include "tpucore/serve/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace tpu::serve {

const std::vector<double>& Histogram::bounds() {
  static const std::vector<double> b{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  return b;
}

void Histogram::observe(double v) {
  if (counts.empty()) counts.assign(bounds().size() + 1, 0);
  const auto& b = bounds();
  counts[static_cast<size_t>(std::lower_bound(b.begin(), b.end(), v) - b.begin())]++;
  sum += v;
  count++;
}

namespace {
void scalar(std::string& s, const char* name, const char* type, const char* help, double v) {
  s += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
}
// labels: "" or 'key="value"' (without braces).
void histogram(std::string& s, const char* name, const char* help, const Histogram& h, const std::string& labels = {}) {
  s += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  const auto& b = Histogram::bounds();
  const std::string sep = labels.empty() ? "" : ",";
  const std::string plain = labels.empty() ? "" : "{" + labels + "}";
  int64_t cum = 0;
  for (size_t i = 0; i <= b.size(); ++i) {
    cum += h.counts.empty() ? 0 : h.counts[i];
    const std::string le = i < b.size() ? fmt::format("{}", b[i]) : "+Inf";
    s += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, le, cum);
  }
  s += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, plain, h.sum, name, plain, h.count);
}
void labelled(std::string& s, const char* name, const char* type, const char* help, const std::string& labels,
              double v) {
  s += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", name, help, name, type, name, labels, v);
}
std::string escape_label(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}
void vllm_names(std::string& s, const EngineMetrics& m, const std::string& model_name) {
  const std::string l = "model_name=\"" + escape_label(model_name) + "\"";
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  labelled(s, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", l, d(m.running));
  labelled(s, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", l, d(m.waiting));
  labelled(s, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", l,
           m.blocks_total > 0 ? d(m.blocks_used) / d(m.blocks_total) : 0.0);
  labelled(s, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", l, d(m.prompt_tokens));
  labelled(s, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", l,
           d(m.generation_tokens));
  labelled(s, "vllm:num_preemptions_total", "counter", "Cumulative number of preemptions.", l, d(m.preemptions));
  labelled(s, "vllm:request_success_total", "counter", "Count of successfully processed requests.", l,
           d(m.requests_finished));
  labelled(s, "vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", l, d(m.spec_drafts));
  labelled(s, "vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", l,
           d(m.spec_draft_tokens));
  labelled(s, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.", l,
           d(m.spec_accepted_tokens));
  histogram(s, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", m.ttft, l);
  histogram(s, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", m.tpot, l);
  histogram(s, "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", m.e2e, l);
}
}  // namespace

std::string prometheus_text(const EngineMetrics& m, const std::string& extra, const std::string& model_name) {
  std::string s;
  scalar(s, "tpu_serve_requests_waiting", "gauge", "Requests queued, not yet scheduled.", static_cast<double>(m.waiting));
  scalar(s, "tpu_serve_requests_running", "gauge", "Requests holding KV blocks (prefilling or decoding).",
         static_cast<double>(m.running));
  scalar(s, "tpu_serve_kv_blocks_used", "gauge", "KV cache blocks in use.", static_cast<double>(m.blocks_used));
  scalar(s, "tpu_serve_kv_blocks_total", "gauge", "KV cache blocks in the pool.", static_cast<double>(m.blocks_total));
  scalar(s, "tpu_serve_kv_block_size", "gauge", "Token positions per KV block.", static_cast<double>(m.block_size));
  scalar(s, "tpu_serve_kv_cache_bytes_per_token", "gauge", "KV cache bytes of one token position over all layers.",
         static_cast<double>(m.kv_bytes_per_token));
  scalar(s, "tpu_serve_kv_block_bytes", "gauge", "KV cache bytes of one block over all layers.",
         static_cast<double>(m.kv_bytes_per_token * m.block_size));
  scalar(s, "tpu_serve_generation_tokens_per_second", "gauge", "Generated tokens per second over the last 10 s.",
         m.generation_tokens_per_second);
  scalar(s, "tpu_serve_generation_tokens_total", "counter", "Tokens generated.",
         static_cast<double>(m.generation_tokens));
  scalar(s, "tpu_serve_processed_tokens_total", "counter", "Tokens run through the model (prefill and decode).",
         static_cast<double>(m.processed_tokens));
  scalar(s, "tpu_serve_requests_finished_total", "counter", "Requests finished (stop or length).",
         static_cast<double>(m.requests_finished));
  scalar(s, "tpu_serve_requests_cancelled_total", "counter", "Requests cancelled (client gone or shutdown).",
         static_cast<double>(m.requests_cancelled));
  scalar(s, "tpu_serve_preemptions_total", "counter", "Sequences preempted for lack of KV blocks.",
         static_cast<double>(m.preemptions));
  scalar(s, "tpu_serve_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from shared KV blocks.",
         static_cast<double>(m.prefix_cache_hit_tokens));
  scalar(s, "tpu_serve_spec_draft_tokens_total", "counter", "Speculative (n-gram) tokens proposed and verified.",
         static_cast<double>(m.spec_draft_tokens));
  scalar(s, "tpu_serve_spec_accepted_tokens_total", "counter", "Speculative tokens accepted (equal to the model's choice).",
         static_cast<double>(m.spec_accepted_tokens));
  scalar(s, "tpu_serve_spec_acceptance_rate", "gauge", "Accepted over proposed speculative tokens (0 before any).",
         m.spec_acceptance_rate());
  scalar(s, "tpu_serve_steps_total", "counter", "Engine steps that ran the model.", static_cast<double>(m.steps));
  histogram(s, "tpu_serve_time_to_first_token_seconds", "Time from arrival to the first generated token.", m.ttft);
  histogram(s, "tpu_serve_time_per_output_token_seconds", "Mean time between generated tokens, per request.",
            m.tpot);
  histogram(s, "tpu_serve_e2e_request_latency_seconds", "Time from arrival to the end of finished requests.", m.e2e);
  if (!model_name.empty()) vllm_names(s, m, model_name);
  return s + extra;
}

}  // namespace tpu::serve
