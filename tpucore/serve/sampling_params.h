// Serving's own per-request sampling parameters (as vLLM's SamplingParams): what a client asks
// for, validated once when the request is added.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tpucore/models/generate.h"
#include "tpucore/serve/json_constraint.h"

namespace tpu::serve {

struct SamplingParams {
  int64_t max_tokens = 16;          // new tokens at most (>= 1); generation also ends at max_model_len
  int64_t min_tokens = 0;           // stop tokens and stop strings cannot end the request before this many
  double temperature = 0.0;         // 0: greedy (argmax); above 0: sampled at this temperature
  int64_t top_k = 0;                // 0: off
  double top_p = 1.0;               // 1: off
  double repetition_penalty = 1.0;  // 1: off; as Hugging Face (divide positive logits, multiply negative)
  // OpenAI's penalties over the tokens generated so far (not the prompt), applied to the logits
  // before sampling: logit[t] -= count(t) * frequency_penalty + (count(t) > 0) * presence_penalty.
  double frequency_penalty = 0.0;   // [-2, 2]
  double presence_penalty = 0.0;    // [-2, 2]
  std::map<int64_t, double> logit_bias;  // token id -> added to its logit before sampling, [-100, 100]
  uint64_t seed = 0;                // of the request's own generator
  std::vector<int64_t> stop_token_ids;  // generating one ends the request (it is kept in the output)
  // Stop strings: the request ends (reason stop) at the token whose text completes one of them
  // (the text of the generated tokens, EngineConfig::detokenize). The token is kept in the
  // output; cutting the text before the string is the caller's part.
  std::vector<std::string> stop;
  // Log-probabilities of the model's distribution (log_softmax of the raw logits, before
  // penalties, bias and temperature): -1 none; 0 the chosen token's; k > 0 also the k most likely.
  int64_t logprobs = -1;
  // The prompt's log-probabilities (token i given tokens 0..i-1, from one plain forward of the
  // prompt when the request is taken in; RequestCallbacks::on_prompt_logprobs): -1 none; k as logprobs.
  int64_t prompt_logprobs = -1;
  // Structured output (null: none): every generated token keeps the output a prefix of a document
  // this automaton accepts (the other tokens are masked before sampling; log-probabilities stay
  // those of the raw logits); stop tokens are allowed only once the document is complete, and the
  // request ends (reason stop) when no byte can follow. Its vocabulary must be the model's.
  std::shared_ptr<const JsonConstraint> constraint;

  // A tpu::Error naming the field when a value is out of range.
  void validate() const;
  // The same choice of tokens as models::generate() with `g` (do_sample false: greedy;
  // max_new_tokens, sampling fields, seed and stop_tokens carried over).
  static SamplingParams from_generation_config(const models::GenerationConfig& g);
  // The sampler's view (models::choose_token reads a GenerationConfig).
  models::GenerationConfig sampler() const;
};

}  // namespace tpu::serve
