// The serving engine's scheduler: which requests run in a step, how many tokens each, and
// which blocks they hold (through the KV-cache manager). Each schedule() spends up to the token
// budget over at most max_num_seqs sequences: first the running sequences in admission order
// (one token for a decoding sequence, the next chunk of its prompt for one still in prefill:
// chunked prefill mixed with decodes), then waiting requests first come first served while the
// budget, the sequence limit and the free blocks allow.
//
// Preemption policy (when a running sequence needs a block and none is free): the most
// recently admitted running sequence is preempted by recomputation (vLLM's policy): its blocks
// go back to the pool, it returns to the front of the waiting queue with its generated tokens
// kept, and when readmitted its prompt plus those tokens are prefilled again, so its output is
// the same as if it had never been preempted. No waiting request is admitted in a step that
// preempted.
#pragma once

#include <deque>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "tpucore/serve/kv_cache_manager.h"
#include "tpucore/serve/model_runner.h"

namespace tpu::serve {

// One step's plan: the scheduled sequences in order with their token counts.
struct StepPlan {
  struct Seq {
    std::shared_ptr<Request> req;
    int64_t tokens = 0;     // the next `tokens` of req->tokens after req->computed
    bool samples = false;  // all its known tokens are cached after the step: it samples
    // Speculative decoding: proposed tokens run after the request's last known token (counted in
    // `tokens`); every one of those 1 + draft.size() rows samples, to verify the proposals.
    std::vector<int64_t> draft;
  };
  std::vector<Seq> seqs;
  int64_t preemptions = 0;        // sequences preempted while planning
  int64_t prefix_hit_tokens = 0;  // prompt positions reused from the prefix cache
  bool empty() const { return seqs.empty(); }
  // Schedules the next n tokens of r (the last draft.size() of them the proposals).
  void add(std::shared_ptr<Request> r, int64_t n, std::vector<int64_t> draft = {});
  // The runner's input: flattened ids and positions, the ragged batch over the block tables
  // (pointers into the requests: valid while the plan lives) and the rows that sample.
  StepBatch batch() const;
  // (request id, tokens) per scheduled sequence.
  std::vector<std::pair<int64_t, int64_t>> summary() const;
};

struct SchedulerLimits {
  int64_t max_num_seqs = 16;
  int64_t max_num_batched_tokens = 256;
  // Speculative decoding (EngineConfig::speculative_tokens): proposals per decoding sequence
  // (0: off), the n-gram sizes matched and the context length proposals must stay within.
  int64_t speculative_tokens = 0;
  int64_t ngram_min = 1, ngram_max = 3;
  int64_t max_model_len = 0;
};

// Prompt-lookup (n-gram) proposals: for n from ngram_max down to ngram_min, the most recent
// earlier occurrence of the last n tokens of `seq`; the tokens that followed it are proposed,
// up to k of them (a continuation that runs into the end of `seq` goes on through its own
// proposals, so a cycle keeps repeating). Empty when no n-gram recurs.
std::vector<int64_t> propose_ngram(const std::vector<int64_t>& seq, int64_t k, int64_t ngram_min, int64_t ngram_max);

class Scheduler {
 public:
  Scheduler(SchedulerLimits limits, KVCacheManager& kv) : limits_(limits), kv_(kv) {}
  void add(std::shared_ptr<Request> r) { waiting_.push_back(std::move(r)); }
  // Marks the requests with these ids cancelled.
  void cancel(const std::set<int64_t>& ids);
  // Removes the cancelled requests from both queues and returns them (their blocks still held).
  std::vector<std::shared_ptr<Request>> take_cancelled();
  StepPlan schedule();
  // Removes finished requests from the running list.
  void remove(const std::set<const Request*>& done);
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }

 private:
  // Running sequences in admission order; false when a preemption happened.
  bool schedule_running(StepPlan& plan, int64_t& budget);
  void schedule_waiting(StepPlan& plan, int64_t& budget);
  void preempt(size_t index, StepPlan& plan);
  // The n-gram proposals of a decoding sequence (empty: it decodes one token), within the
  // budget and leaving a free block for each of the `later` running sequences.
  std::vector<int64_t> propose(const Request& r, int64_t budget, size_t later) const;

  SchedulerLimits limits_;
  KVCacheManager& kv_;
  std::deque<std::shared_ptr<Request>> waiting_;
  std::vector<std::shared_ptr<Request>> running_;
};

}  // namespace tpu::serve
