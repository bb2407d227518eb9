// A request inside the serving engine: its tokens, its place in the KV cache and its sampling
// state. Shared by the scheduler, the KV-cache manager and the output step (internal).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "tpucore/serve/engine.h"

namespace tpu::serve {

using Clock = std::chrono::steady_clock;

struct Request {
  int64_t id = 0;
  std::vector<int64_t> tokens;  // prompt, then the generated tokens
  int64_t prompt_len = 0;
  int64_t computed = 0;         // positions whose keys and values are in the cache
  std::vector<int32_t> table;   // block table
  int64_t hashed = 0;           // leading blocks registered in (or found in) the prefix cache
  uint64_t last_hash = 0;       // chain hash through block hashed - 1
  SamplingParams params;
  models::GenerationConfig sampler;  // params as models::choose_token reads them
  std::set<int64_t> stops;
  std::map<int64_t, int64_t> counts;  // generated tokens' counts (frequency / presence penalties)
  size_t stop_scan = 0;               // text bytes already searched for stop strings
  std::mt19937_64 rng;
  std::optional<JsonConstraint::State> constraint;  // params.constraint's state after the generated tokens
  RequestCallbacks cb;
  bool cancelled = false;
  Clock::time_point arrival, first_token;
  double chip_seconds = 0;     // simulated chip time of the steps that ran this request
  double chip_ttft = -1;       // chip_seconds when its first token came (-1: none yet)
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

}  // namespace tpu::serve
