// The serving engine's output step: after the runner, every sequence of the plan whose known
// tokens are all cached samples its next token (models::choose_token: repetition penalty,
// greedy or temperature / top-k / top-p with the request's own generator), the token goes to
// the request's callback, and stop tokens, max_tokens, max_model_len and a callback returning
// false end the request; finished requests give their blocks back to the KV-cache manager.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "tpucore/serve/kv_cache_manager.h"
#include "tpucore/serve/scheduler.h"

namespace tpu::serve {

// What a step did, for the engine's metrics and its on_finish callbacks.
struct StepReport {
  int64_t new_tokens = 0;
  std::vector<double> ttft;  // time to first token of requests that got it this step (s)
  std::vector<std::pair<std::shared_ptr<Request>, FinishReason>> finished;  // blocks already freed
};

class OutputProcessor {
 public:
  OutputProcessor(KVCacheManager& kv, int64_t max_model_len) : kv_(kv), max_model_len_(max_model_len) {}
  // Marks the plan's tokens as cached and registers newly full blocks (prefix caching).
  void commit(const StepPlan& plan);
  // logits: f32 [rows, vocab], one row per sampling sequence of the plan in order.
  void sample(const StepPlan& plan, const Tensor& logits, StepReport& report);
  // Ends a request: its blocks go back to the pool; the engine calls on_finish afterwards.
  void finish(const std::shared_ptr<Request>& r, FinishReason why, StepReport& report);

 private:
  KVCacheManager& kv_;
  int64_t max_model_len_;
};

}  // namespace tpu::serve
