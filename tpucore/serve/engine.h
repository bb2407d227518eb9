// The serving engine: continuous batching over a paged KV cache, split as vLLM's engine core:
//   - Scheduler (serve/scheduler.h): a step plan: which requests run, how many tokens each
//     (chunked prefill mixed with decodes under a token budget), preemption by recomputation;
//   - KVCacheManager (serve/kv_cache_manager.h): the block pool and the prefix hashes;
//   - ModelRunner (serve/model_runner.h): executes the plan's tokens through the model's own
//     forward with a paged attention cache (eager on the cpu or a chip, or tpu::compile);
//   - OutputProcessor (serve/output.h): sampling, stop checks, freeing finished requests.
// Each step(): new requests and cancellations come in, the scheduler plans, the runner runs, the
// output step samples and frees, and the metrics are published.
//
// Thread safety: add_request(), cancel(), has_work() and metrics() may be called from any thread
// while one thread calls step(); callbacks run on the step() thread.
//
// This header includes only public headers (no code generation internals), so a server built
// on it (tools/tpu-serve) sees the engine's API alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tpucore/models/causal_lm.h"
#include "tpucore/serve/sampling_params.h"

namespace tpu::serve {

struct EngineConfig {
  int64_t block_size = 16;
  int64_t num_blocks = 0;  // 0: enough for max_num_seqs sequences of max_model_len tokens
  // Storage of the paged KV cache (vLLM's kv_cache_dtype): auto (f32 on the host), int8 or
  // fp8_e4m3 (one byte per value and one f32 scale per row of head_dim values; the eager cpu
  // step only, other paths refuse it).
  nn::KVCacheDType kv_cache_dtype = nn::KVCacheDType::auto_dtype;
  int64_t max_num_seqs = 16;
  int64_t max_num_batched_tokens = 256;  // token budget of one step
  int64_t max_model_len = 0;             // 0: the model's max_position_embeddings
  int64_t max_waiting = 0;               // > 0: add_request fails (Overloaded) beyond this queue length
  // Run the step through tpu::compile on bucketed shapes (serve/model_runner.h) instead of
  // eagerly (the cpu's ragged paged attention kernel, or with the model on a chip the chip's
  // program); the compiled function is named compile_name in tpu::jit::stats().
  bool compile = false;
  std::string compile_name = "serve_step";
  // Prefix sharing: full blocks are registered under the hash of their tokens and of all
  // tokens before them; an admitted request reuses the cached blocks of its longest matching
  // prefix (shared, reference counted, never written again) and computes only the rest.
  bool enable_prefix_caching = false;
  // Batch-invariant numerics during every step and warm-up (tpucore/core/batch_invariant.h): a
  // request's tokens do not depend on the other requests of its step (host matmuls keep one
  // reduction order per row whatever the row count; attention and norms already do).
  bool batch_invariant = true;
  // Speculative decoding with n-gram (prompt-lookup) proposals, as vLLM's `ngram` method: a
  // decoding request proposes up to speculative_tokens tokens (0: off) that followed the most
  // recent earlier occurrence of its last n tokens (prompt and generated; n from ngram_max down
  // to ngram_min); one forward verifies them all (they count in the step's token budget), and
  // tokens are chosen row by row exactly as plain decoding chooses them while each equals its
  // proposal, plus the one after. The output is the same as without speculation (greedy and
  // seeded sampling, with stops, penalties, logprobs and constraints) when the verification
  // rows' logits equal one-token steps' logits, which batch_invariant guarantees.
  int64_t speculative_tokens = 0;
  int64_t ngram_min = 1, ngram_max = 3;
  // The text of generated token ids, for stop strings (SamplingParams::stop); a request with
  // stop strings is refused without it.
  std::function<std::string(const std::vector<int64_t>&)> detokenize = nullptr;
};

enum class FinishReason { stop, length, cancelled };
const char* finish_reason_name(FinishReason r);

// One generated token with its log-probabilities (SamplingParams::logprobs >= 0).
struct TokenOutput {
  int64_t token = 0;
  double logprob = 0;                           // of the chosen token (0 when not asked)
  std::vector<std::pair<int64_t, double>> top;  // the most likely tokens, best first (ties: lower id)
};

// A finished request's timing (RequestCallbacks::on_timing). Host: arrival (add_request) to the
// first token, and the time after the first token per further token (0 with one token). Chip,
// with the model on a `sim` device: the simulated seconds of the engine steps that computed the
// request's tokens (each step's chip time is credited whole to every request the step ran),
// up to and including the step of its first token, and those after it per further token.
struct RequestTiming {
  int64_t tokens = 0;  // generated
  double ttft_s = 0, tpot_s = 0;
  bool has_chip = false;  // the model is on a sim device
  double chip_ttft_s = 0, chip_tpot_s = 0;
};

struct RequestCallbacks {
  // Every generated token; return false to cancel the request (e.g. the client went away).
  std::function<bool(int64_t token)> on_token;
  // Called once when the request leaves the engine (also after cancel()).
  std::function<void(FinishReason)> on_finish;
  // The same as on_token with log-probabilities; called instead of on_token when set.
  std::function<bool(const TokenOutput&)> on_output = nullptr;
  // With SamplingParams::prompt_logprobs >= 0: once, before the first token, entry i for prompt
  // token i + 1 (the first token has none).
  std::function<void(const std::vector<TokenOutput>&)> on_prompt_logprobs = nullptr;
  // Once, right before on_finish: the request's timing.
  std::function<void(const RequestTiming&)> on_timing = nullptr;
};

// add_request() beyond max_waiting queued requests.
class Overloaded : public Error {
 public:
  using Error::Error;
};

struct Histogram {
  static const std::vector<double>& bounds();  // seconds, shared by every histogram
  std::vector<int64_t> counts;                 // per bound (not cumulative), then +Inf
  double sum = 0;
  int64_t count = 0;
  void observe(double v);
};

struct EngineMetrics {
  int64_t waiting = 0, running = 0, blocks_used = 0, blocks_total = 0, block_size = 0;
  // Bytes of KV cache one token position takes over all layers (a block: block_size times this).
  // Per-head keys and values: layers * 2 * kv_heads * head_dim * element size; multi-head latent
  // attention: layers * (kv_lora_rank + qk_rope_head_dim) * element size.
  int64_t kv_bytes_per_token = 0;
  int64_t requests_finished = 0, requests_cancelled = 0, preemptions = 0, steps = 0;
  int64_t processed_tokens = 0, generation_tokens = 0;  // through the forward / sampled
  int64_t prompt_tokens = 0;                            // of the requests added
  int64_t prefix_cache_hit_tokens = 0;                  // prompt tokens whose blocks were reused
  // Speculative decoding: proposals verified and those accepted (acceptance rate: their ratio).
  int64_t spec_draft_tokens = 0, spec_accepted_tokens = 0, spec_drafts = 0;
  double spec_acceptance_rate() const {
    return spec_draft_tokens > 0 ? static_cast<double>(spec_accepted_tokens) / static_cast<double>(spec_draft_tokens) : 0;
  }
  double generation_tokens_per_second = 0;  // over the last ~10 s of steps
  Histogram ttft, tpot;                      // time to first token, time per output token (s)
  Histogram e2e;                             // arrival to finish of finished requests (s)
};

class Engine {
 public:
  Engine(std::shared_ptr<models::CausalLM> model, EngineConfig cfg = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; returns its id. A prompt that is empty, holds an id outside the
  // vocabulary or leaves no room for one new token within max_model_len, and sampling
  // parameters out of range, are a tpu::Error; a full queue is Overloaded. Generation also
  // ends at max_model_len tokens (reason length).
  int64_t add_request(std::vector<int64_t> prompt, const SamplingParams& params, RequestCallbacks cb);
  // Asks to cancel a request; it leaves (blocks freed, on_finish(cancelled)) at the next step.
  void cancel(int64_t id);
  // Runs one scheduling step and forward; false when there was nothing to do. An error of the
  // forward ends the step's requests (cancelled, blocks freed) and is rethrown.
  bool step();
  bool has_work() const;
  // With compile: compiles every token bucket the configuration can produce, so no later step
  // compiles; returns the bucket count (0 without compile).
  int64_t warm_up();
  EngineMetrics metrics() const;
  const EngineConfig& config() const;
  models::CausalLM& model();

  // What the last step scheduled (for tests): per sequence (request id, tokens).
  std::vector<std::pair<int64_t, int64_t>> last_schedule() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpu::serve
