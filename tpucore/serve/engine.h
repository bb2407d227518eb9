// The serving engine: continuous batching over a paged KV cache.
//
// Requests join and leave at every step. Each step() schedules up to max_num_batched_tokens
// tokens (the token budget) over at most max_num_seqs sequences: first the running sequences
// in admission order (one token for a decoding sequence, the next chunk of its prompt for one
// still in prefill: chunked prefill mixed with decodes), then waiting requests first come
// first served while the budget, the sequence limit and the free blocks allow. All scheduled
// tokens run as one ragged forward (serve/paged_forward.h); every sequence whose known tokens
// are all in the cache after the step samples its next token.
//
// Preemption policy (when a running sequence needs a block and none is free): the most
// recently admitted running sequence is preempted by recomputation (vLLM's policy): its blocks
// go back to the free list, it returns to the front of the waiting queue with its generated
// tokens kept, and when readmitted its prompt plus those tokens are prefilled again, so its
// output is the same as if it had never been preempted. No waiting request is admitted in a
// step that preempted.
//
// Thread safety: add_request(), cancel() and metrics() may be called from any thread while
// one thread calls step(); callbacks run on the step() thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tpucore/models/generate.h"
#include "tpucore/serve/compiled_step.h"
#include "tpucore/serve/paged_cache.h"

namespace tpu::serve {

class SimPagedStep;  // serve/sim_step.h

struct EngineConfig {
  int64_t block_size = 16;
  int64_t num_blocks = 0;  // 0: enough for max_num_seqs sequences of max_model_len tokens
  int64_t max_num_seqs = 16;
  int64_t max_num_batched_tokens = 256;  // token budget of one step
  int64_t max_model_len = 0;             // 0: the model's max_position_embeddings
  int64_t max_waiting = 0;               // > 0: add_request fails (Overloaded) beyond this queue length
  // Run the step through tpu::compile on bucketed shapes (serve/compiled_step.h) instead of
  // the eager forward with the ragged paged attention kernel (the cpu's, or with the model on
  // a chip the chip program of serve/sim_step.h); the compiled function is named
  // compile_name in tpu::jit::stats().
  bool compile = false;
  std::string compile_name = "serve_step";
  // Prefix sharing: full blocks are registered under the hash of their tokens and of all
  // tokens before them; an admitted request reuses the cached blocks of its longest matching
  // prefix (shared, reference counted, never written again) and computes only the rest.
  bool enable_prefix_caching = false;
};

enum class FinishReason { stop, length, cancelled };
const char* finish_reason_name(FinishReason r);

struct RequestCallbacks {
  // Every generated token; return false to cancel the request (e.g. the client went away).
  std::function<bool(int64_t token)> on_token;
  // Called once when the request leaves the engine (also after cancel()).
  std::function<void(FinishReason)> on_finish;
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
  int64_t requests_finished = 0, requests_cancelled = 0, preemptions = 0, steps = 0;
  int64_t processed_tokens = 0, generation_tokens = 0;  // through the forward / sampled
  int64_t prefix_cache_hit_tokens = 0;                  // prompt tokens whose blocks were reused
  double generation_tokens_per_second = 0;  // over the last ~10 s of steps
  Histogram ttft, tpot;                      // time to first token, time per output token (s)
};

class Engine {
 public:
  Engine(std::shared_ptr<models::CausalLM> model, EngineConfig cfg = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; returns its id. gen: max_new_tokens (>= 1), sampling, stop_tokens, seed
  // (max_length and compile are ignored). A prompt that is empty, holds an id outside the
  // vocabulary or leaves no room for one new token within max_model_len is a tpu::Error; a
  // full queue is Overloaded. Generation also ends at max_model_len tokens (reason length).
  int64_t add_request(std::vector<int64_t> prompt, const models::GenerationConfig& gen, RequestCallbacks cb);
  // Asks to cancel a request; it leaves (blocks freed, on_finish(cancelled)) at the next step.
  void cancel(int64_t id);
  // Runs one scheduling step and forward; false when there was nothing to do.
  bool step();
  bool has_work() const;
  // With compile: compiles every bucket pair the configuration can produce (token budget x
  // max_model_len), so no later step compiles; returns the pair count (0 without compile).
  int64_t warm_up();
  EngineMetrics metrics() const;
  const EngineConfig& config() const { return cfg_; }
  models::CausalLM& model() { return *model_; }

  // What the last step scheduled (for tests): per sequence (request id, tokens).
  std::vector<std::pair<int64_t, int64_t>> last_schedule() const;

  struct Request;

 private:
  void admit_incoming();
  bool ensure_blocks(Request& r, int64_t positions);
  void preempt(Request& r);
  void finish(Request& r, FinishReason why);

  std::shared_ptr<models::CausalLM> model_;
  EngineConfig cfg_;
  std::optional<PagedKVCache> cache_;          // eager path
  std::unique_ptr<CompiledStep> compiled_;     // compiled path
  std::unique_ptr<SimPagedStep> sim_step_;     // model on a chip: the chip's paged attention program
  BlockAllocator blocks_;
  std::chrono::steady_clock::time_point start_;
  std::deque<std::shared_ptr<Request>> waiting_;
  std::vector<std::shared_ptr<Request>> running_;
  std::vector<std::pair<int64_t, int64_t>> last_schedule_;

  mutable std::mutex mu_;  // guards incoming_, cancels_, next_id_, metrics_
  std::vector<std::shared_ptr<Request>> incoming_;
  std::vector<int64_t> cancels_;
  int64_t next_id_ = 1;
  EngineMetrics metrics_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> recent_;  // (step end, tokens)
};

}  // namespace tpu::serve
