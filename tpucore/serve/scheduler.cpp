#include "tpucore/serve/scheduler.h"

#include <algorithm>

namespace tpu::serve {

void StepPlan::add(std::shared_ptr<Request> r, int64_t n, std::vector<int64_t> draft) {
  const bool last = r->computed + n - static_cast<int64_t>(draft.size()) == static_cast<int64_t>(r->tokens.size());
  seqs.push_back({std::move(r), n, last, std::move(draft)});
}

std::vector<int64_t> propose_ngram(const std::vector<int64_t>& seq, int64_t k, int64_t ngram_min, int64_t ngram_max) {
  const auto len = static_cast<int64_t>(seq.size());
  for (int64_t n = std::min(ngram_max, len - 1); k > 0 && n >= std::max<int64_t>(ngram_min, 1); --n) {
    const int64_t* suffix = seq.data() + (len - n);
    for (int64_t i = len - n - 1; i >= 0; --i) {  // the most recent earlier occurrence first
      if (!std::equal(suffix, suffix + n, seq.data() + i)) continue;
      std::vector<int64_t> out;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t at = i + n + j;  // < len + j: past the end it reads the proposals so far
        const int64_t t = at < len ? seq[static_cast<size_t>(at)] : out[static_cast<size_t>(at - len)];
        out.push_back(t);
      }
      return out;
    }
  }
  return {};
}

StepBatch StepPlan::batch() const {
  StepBatch s;
  s.batch.query_start.push_back(0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Request& r = *seqs[i].req;
    const auto d = static_cast<int64_t>(seqs[i].draft.size());
    const int64_t known = seqs[i].tokens - d;
    for (int64_t j = 0; j < seqs[i].tokens; ++j) {
      s.ids.push_back(j < known ? r.tokens[static_cast<size_t>(r.computed + j)] : seqs[i].draft[static_cast<size_t>(j - known)]);
      s.positions.push_back(r.computed + j);
    }
    s.batch.query_start.push_back(static_cast<int64_t>(s.ids.size()));
    s.batch.context_len.push_back(r.computed + seqs[i].tokens);
    s.batch.block_tables.push_back(&r.table);
    s.batch.prompt_tokens.push_back(std::clamp<int64_t>(r.prompt_len - r.computed, 0, seqs[i].tokens));
    if (seqs[i].samples)  // the last known token's row, then one per proposal
      for (int64_t j = d; j >= 0; --j) s.logit_rows.push_back(static_cast<int64_t>(s.ids.size()) - 1 - j);
  }
  return s;
}

std::vector<std::pair<int64_t, int64_t>> StepPlan::summary() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Seq& s : seqs) out.push_back({s.req->id, s.tokens});
  return out;
}

void Scheduler::cancel(const std::set<int64_t>& ids) {
  for (auto& r : running_)
    if (ids.count(r->id)) r->cancelled = true;
  for (auto& r : waiting_)
    if (ids.count(r->id)) r->cancelled = true;
}

std::vector<std::shared_ptr<Request>> Scheduler::take_cancelled() {
  std::vector<std::shared_ptr<Request>> out;
  auto take = [&](auto& list) {
    for (auto it = list.begin(); it != list.end();) {
      if ((*it)->cancelled) {
        out.push_back(*it);
        it = list.erase(it);
      } else {
        ++it;
      }
    }
  };
  take(running_);
  take(waiting_);
  return out;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int64_t budget = limits_.max_num_batched_tokens;
  if (schedule_running(plan, budget)) schedule_waiting(plan, budget);
  return plan;
}

void Scheduler::preempt(size_t index, StepPlan& plan) {
  std::shared_ptr<Request> r = running_[index];
  kv_.free(*r);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  waiting_.push_front(std::move(r));
  plan.preemptions++;
}

bool Scheduler::schedule_running(StepPlan& plan, int64_t& budget) {
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request& r = *running_[i];
    int64_t n = std::min(static_cast<int64_t>(r.tokens.size()) - r.computed, budget);
    std::vector<int64_t> draft = propose(r, budget, running_.size() - i - 1);
    if (!draft.empty()) n = 1 + static_cast<int64_t>(draft.size());
    bool ok = kv_.allocate(r, r.computed + n);
    while (!ok && running_.size() > i + 1) {  // preempt the newest other sequence
      preempt(running_.size() - 1, plan);
      ok = kv_.allocate(r, r.computed + n);
    }
    if (!ok) {  // r is the newest itself: it waits
      preempt(i, plan);
      return false;
    }
    plan.add(running_[i], n, std::move(draft));
    budget -= n;
    ++i;
  }
  return plan.preemptions == 0;
}

std::vector<int64_t> Scheduler::propose(const Request& r, int64_t budget, size_t later) const {
  if (limits_.speculative_tokens <= 0 || static_cast<int64_t>(r.tokens.size()) - r.computed != 1) return {};
  // Proposals beyond what the request may still return (max_tokens, the context) are useless.
  const int64_t k = std::min({limits_.speculative_tokens, budget - 1, r.params.max_tokens - r.generated() - 1,
                              limits_.max_model_len - static_cast<int64_t>(r.tokens.size()) - 1});
  if (k <= 0) return {};
  std::vector<int64_t> draft = propose_ngram(r.tokens, k, limits_.ngram_min, limits_.ngram_max);
  // Proposals take only blocks that are free beyond one for each later running sequence, so
  // speculation never preempts.
  const int64_t need = kv_.blocks_needed(r, r.computed + 1 + static_cast<int64_t>(draft.size()));
  if (need > 0 && need + static_cast<int64_t>(later) > kv_.num_free()) return {};
  return draft;
}

void Scheduler::schedule_waiting(StepPlan& plan, int64_t& budget) {
  while (budget > 0 && !waiting_.empty() && static_cast<int64_t>(running_.size()) < limits_.max_num_seqs) {
    Request& r = *waiting_.front();
    const int64_t reuse = kv_.share_prefix(r);
    const int64_t n = std::min(static_cast<int64_t>(r.tokens.size()) - reuse, budget);
    if (kv_.blocks_needed(r, reuse + n) > kv_.num_free()) {
      kv_.free(r);
      return;
    }
    kv_.allocate(r, reuse + n);
    plan.prefix_hit_tokens += reuse;
    running_.push_back(waiting_.front());
    waiting_.pop_front();
    plan.add(running_.back(), n);
    budget -= n;
  }
}

void Scheduler::remove(const std::set<const Request*>& done) {
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [&](const std::shared_ptr<Request>& r) { return done.count(r.get()) > 0; }),
                 running_.end());
}

}  // namespace tpu::serve
