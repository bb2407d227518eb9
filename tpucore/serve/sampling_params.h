// Serving's own per-request sampling parameters (as vLLM's SamplingParams): what a client asks
// for, validated once when the request is added.
#pragma once

#include <cstdint>
#include <vector>

#include "tpucore/models/generate.h"

namespace tpu::serve {

struct SamplingParams {
  int64_t max_tokens = 16;          // new tokens at most (>= 1); generation also ends at max_model_len
  double temperature = 0.0;         // 0: greedy (argmax); above 0: sampled at this temperature
  int64_t top_k = 0;                // 0: off
  double top_p = 1.0;               // 1: off
  double repetition_penalty = 1.0;  // 1: off; as Hugging Face (divide positive logits, multiply negative)
  uint64_t seed = 0;                // of the request's own generator
  std::vector<int64_t> stop_token_ids;  // generating one ends the request (it is kept in the output)

  // A tpu::Error naming the field when a value is out of range.
  void validate() const;
  // The same choice of tokens as models::generate() with `g` (do_sample false: greedy;
  // max_new_tokens, sampling fields, seed and stop_tokens carried over).
  static SamplingParams from_generation_config(const models::GenerationConfig& g);
  // The sampler's view (models::choose_token reads a GenerationConfig).
  models::GenerationConfig sampler() const;
};

}  // namespace tpu::serve
