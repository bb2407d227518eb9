#include "tpucore/serve/sampling_params.h"

#include <cmath>

namespace tpu::serve {

void SamplingParams::validate() const {
  TPU_CHECK(max_tokens >= 1, "serve: max_tokens must be at least 1, got {}", max_tokens);
  TPU_CHECK(temperature >= 0 && std::isfinite(temperature),
            "serve: temperature must be finite and not negative (0: greedy), got {}", temperature);
  TPU_CHECK(top_p > 0 && top_p <= 1 && top_k >= 0 && repetition_penalty > 0,
            "serve: need 0 < top_p <= 1 (got {}), top_k >= 0 (got {}), repetition_penalty > 0 (got {})", top_p, top_k,
            repetition_penalty);
  TPU_CHECK(min_tokens >= 0 && min_tokens <= max_tokens, "serve: min_tokens must be in [0, max_tokens = {}], got {}",
            max_tokens, min_tokens);
  TPU_CHECK(std::abs(frequency_penalty) <= 2 && std::abs(presence_penalty) <= 2,
            "serve: frequency_penalty ({}) and presence_penalty ({}) must be in [-2, 2]", frequency_penalty,
            presence_penalty);
  for (const auto& [t, b] : logit_bias)
    TPU_CHECK(std::isfinite(b) && std::abs(b) <= 100, "serve: logit_bias of token {} must be in [-100, 100], got {}", t,
              b);
  for (const auto& s : stop) TPU_CHECK(!s.empty(), "serve: stop strings must not be empty");
  TPU_CHECK(logprobs >= -1 && logprobs <= 20, "serve: logprobs must be in [-1, 20] (-1: none), got {}", logprobs);
  TPU_CHECK(prompt_logprobs >= -1 && prompt_logprobs <= 20,
            "serve: prompt_logprobs must be in [-1, 20] (-1: none), got {}", prompt_logprobs);
}

SamplingParams SamplingParams::from_generation_config(const models::GenerationConfig& g) {
  SamplingParams p;
  p.max_tokens = g.max_new_tokens;
  // Greedy stays greedy whatever the temperature; a sampling request with a temperature that is
  // not positive is kept as such, so validate() rejects it.
  p.temperature = g.do_sample ? (g.temperature > 0 ? g.temperature : -1.0) : 0.0;
  p.top_k = g.top_k;
  p.top_p = g.top_p;
  p.repetition_penalty = g.repetition_penalty;
  p.seed = g.seed;
  p.stop_token_ids = g.stop_tokens;
  return p;
}

models::GenerationConfig SamplingParams::sampler() const {
  models::GenerationConfig g;
  g.max_new_tokens = max_tokens;
  g.do_sample = temperature > 0;
  g.temperature = temperature > 0 ? temperature : 1.0;
  g.top_k = top_k;
  g.top_p = top_p;
  g.repetition_penalty = repetition_penalty;
  g.seed = seed;
  g.stop_tokens = stop_token_ids;
  return g;
}

}  // namespace tpu::serve
