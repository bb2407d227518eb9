// Text generation with a CausalLM: one prefill of the (left-padded) prompts, then one decode
// step per token through the KV cache. Greedy or sampled (temperature, top-k, top-p) with a
// repetition penalty, a seed, stop tokens, max_new_tokens / max_length and a streaming
// callback; several prompts run as one batch.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tpucore/models/causal_lm.h"

namespace tpu::models {

/// The options of generate().
struct GenerationConfig {
  int64_t max_new_tokens = 32;  ///< tokens generated at most per prompt
  int64_t max_length = 0;       ///< if > 0: prompt + generated tokens stop there too
  bool do_sample = false;       ///< false: greedy (argmax)
  double temperature = 1.0;     ///< softmax temperature when sampling
  int64_t top_k = 0;            ///< keep the k most likely tokens (0: off)
  double top_p = 1.0;           ///< keep the smallest set reaching this probability (1: off)
  double repetition_penalty = 1.0;  ///< 1: off; as Hugging Face (divide positive logits, multiply negative)
  uint64_t seed = 0;                ///< seed of the sampling generator
  std::vector<int64_t> stop_tokens;  ///< generating one ends that sequence (it is kept in the output)
  int64_t pad_token_id = 0;          ///< fills the left padding of shorter prompts
  /// Decode steps through tpu::compile: every step has the same shapes (the whole cache is read
  /// under a mask; the write position, the rotary tables and the mask are runtime tensors; the
  /// new keys and values go in by an in-place slice write at the position, KVCache's
  /// set_write_position), so one compile serves every step. The batch is padded to a power of
  /// two (rows that are never reported). The compiled step and its cache are kept per model,
  /// batch bucket and power-of-two capacity (at least 64) until the model is destroyed, so later
  /// calls reuse them (release_generation_state drops them earlier).
  bool compile = false;
  std::string compile_name = "generate_decode";  ///< the compiled step's name in tpu::jit::stats()
};

/// Called for every generated token: (prompt index, token). Return false to stop that sequence.
using TokenCallback = std::function<bool(size_t, int64_t)>;

/// The generated tokens (without the prompt) of each prompt. Prompts must be non-empty.
std::vector<std::vector<int64_t>> generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationConfig& cfg = {}, const TokenCallback& on_token = {});

/// The next token from one row of logits: the repetition penalty over `history`, then greedy,
/// or temperature, top-k, top-p and a draw from rng.
int64_t choose_token(std::vector<float> logits, const std::vector<int64_t>& history, const GenerationConfig& cfg,
                     std::mt19937_64& rng);

/// The KV cache generate() uses for `batch` rows of up to `capacity` positions. With a sliding
/// window W < capacity and a float cache, each sliding layer is a ring of its last W positions
/// (nn::KVCache's rings): when every layer slides (Mistral; Qwen2 with use_sliding_window over
/// every layer) the cache stays window-sized however long the sequence; with global layers as
/// well (Gemma 2 / 3) those keep `capacity` positions, and a shape-static (compiled) cache then
/// keeps every position on every layer. Otherwise CausalLM::make_cache.
nn::KVCache make_generation_cache(const CausalLM& model, int64_t batch, int64_t capacity, bool shape_static = false);

/// Drops the compiled decode steps and caches generate() keeps for `model` (the model's
/// destructor calls it; they are held outside the model, keyed by it).
void release_generation_state(const CausalLM& model);

/// The greedy choice over a row of n logits: the index std::max_element(row, row + n) returns
/// (the first largest under `<`; NaNs are never taken unless the first value is one), computed
/// in independent chains (generate() uses it; exposed for its test).
int64_t first_argmax(const float* row, int64_t n);

}  // namespace tpu::models
