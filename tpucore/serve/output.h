// The serving engine's output step: after the runner, every sequence of the plan whose known
// tokens are all cached samples its next token: the logits get the request's logit bias, stop
// tokens are masked while fewer than min_tokens are generated, OpenAI's frequency and presence
// penalties over the generated tokens are subtracted, then models::choose_token (repetition
// penalty, greedy or temperature / top-k / top-p with the request's own generator) picks it.
// Log-probabilities (when asked) are those of the raw logits. The token goes to the request's
// callback, and stop tokens, stop strings, max_tokens, max_model_len and a callback returning
// false end the request; finished requests give their blocks back to the KV-cache manager.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tpucore/serve/kv_cache_manager.h"
#include "tpucore/serve/scheduler.h"

namespace tpu::serve {

// What a step did, for the engine's metrics and its on_finish callbacks.
struct StepReport {
  int64_t new_tokens = 0;
  int64_t draft_tokens = 0, accepted_tokens = 0;  // speculative proposals verified / accepted
  std::vector<double> ttft;  // time to first token of requests that got it this step (s)
  std::vector<std::pair<std::shared_ptr<Request>, FinishReason>> finished;  // blocks already freed
};

// The logits a request samples from: `raw` with its logit bias, the min_tokens mask on its stop
// tokens and its frequency / presence penalties (the repetition penalty is models::choose_token's).
std::vector<float> adjusted_logits(std::vector<float> raw, const Request& r);
// With a structured-output constraint: masks (to -inf) the tokens that cannot continue the
// request's document (stop tokens: until it is complete); false when none is left.
bool constrain(const Request& r, std::vector<float>& logits);
// log_softmax of one row of logits (in double), the chosen token's and the k best.
TokenOutput token_logprobs(const std::vector<float>& raw, int64_t token, int64_t k);
// The prompt's log-probabilities from one plain forward of it (no cache): entry i for token i + 1.
std::vector<TokenOutput> prompt_logprobs(models::CausalLM& m, const std::vector<int64_t>& prompt, int64_t k);

class OutputProcessor {
 public:
  using Detokenize = std::function<std::string(const std::vector<int64_t>&)>;
  OutputProcessor(KVCacheManager& kv, int64_t max_model_len, Detokenize detokenize = {})
      : kv_(kv), max_model_len_(max_model_len), detokenize_(std::move(detokenize)) {}
  // Marks the plan's tokens as cached and registers newly full blocks (prefix caching).
  void commit(const StepPlan& plan);
  // logits: f32 [rows, vocab], per sampling sequence of the plan in order one row, or with
  // proposals (speculative decoding) 1 + proposals rows: tokens are chosen row by row while each
  // equals its proposal, each as plain decoding would (penalties, constraint, stops, callbacks).
  void sample(const StepPlan& plan, const Tensor& logits, StepReport& report);
  // Ends a request: its blocks go back to the pool; the engine calls on_finish afterwards.
  void finish(const std::shared_ptr<Request>& r, FinishReason why, StepReport& report);

 private:
  bool stop_string_hit(Request& r) const;
  // Samples, records and reports one token of r from its raw logits x (t: the token); false
  // when the request ended (finished, blocks freed).
  bool sample_one(const std::shared_ptr<Request>& rp, const std::vector<float>& x, int64_t& t, StepReport& report);
  KVCacheManager& kv_;
  int64_t max_model_len_;
  Detokenize detokenize_;
};

}  // namespace tpu::serve
