#include "tpucore/serve/engine.h"
#include "tpucore/serve/sim_step.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "tpucore/serve/paged_forward.h"

namespace tpu::serve {

using Clock = std::chrono::steady_clock;

struct Engine::Request {
  int64_t id = 0;
  std::vector<int64_t> tokens;  // prompt, then the generated tokens
  int64_t prompt_len = 0;
  int64_t computed = 0;  // positions whose keys and values are in the cache
  std::vector<int32_t> table;  // block table
  int64_t hashed = 0;          // leading blocks registered in (or found in) the prefix cache
  uint64_t last_hash = 0;      // chain hash through block hashed - 1
  models::GenerationConfig gen;
  std::set<int64_t> stops;
  std::mt19937_64 rng;
  RequestCallbacks cb;
  bool cancelled = false;
  Clock::time_point arrival, first_token;
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

const std::vector<double>& Histogram::bounds() {
  static const std::vector<double> b{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  return b;
}

void Histogram::observe(double v) {
  if (counts.empty()) counts.assign(bounds().size() + 1, 0);
  const auto& b = bounds();
  counts[static_cast<size_t>(std::lower_bound(b.begin(), b.end(), v) - b.begin())]++;
  sum += v;
  count++;
}

namespace {
EngineConfig resolve(EngineConfig c, const models::CausalLM& m) {
  if (c.max_model_len == 0) c.max_model_len = m.config.max_position_embeddings;
  TPU_CHECK(c.block_size > 0 && c.max_num_seqs > 0 && c.max_num_batched_tokens > 0 && c.max_model_len > 1 &&
                c.num_blocks >= 0 && c.max_waiting >= 0,
            "serve::Engine: block_size ({}), max_num_seqs ({}), max_num_batched_tokens ({}) must be positive, "
            "max_model_len ({}) above 1, num_blocks ({}) and max_waiting ({}) not negative",
            c.block_size, c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len, c.num_blocks, c.max_waiting);
  const int64_t per_seq = (c.max_model_len + c.block_size - 1) / c.block_size;
  if (c.num_blocks == 0) c.num_blocks = per_seq * c.max_num_seqs;
  // One sequence at full length must fit, or preemption could not make room for it.
  TPU_CHECK(c.num_blocks >= per_seq,
            "serve::Engine: {} blocks of {} positions cannot hold one sequence of max_model_len {} (need {})",
            c.num_blocks, c.block_size, c.max_model_len, per_seq);
  return c;
}
PagedCacheConfig cache_config(const EngineConfig& c, const models::CausalLM& m) {
  return {m.config.num_hidden_layers, m.config.num_key_value_heads, m.config.head_dim, c.block_size, c.num_blocks};
}
}  // namespace

Engine::Engine(std::shared_ptr<models::CausalLM> model, EngineConfig cfg)
    : model_(std::move(model)),
      cfg_(resolve(cfg, *model_)),
      blocks_(cfg_.num_blocks),
      start_(Clock::now()) {
  if (cfg_.compile) compiled_ = std::make_unique<CompiledStep>(*model_, cache_config(cfg_, *model_), cfg_.compile_name,
                                                     cfg_.max_num_batched_tokens, cfg_.max_model_len, cfg_.max_num_seqs);
  else if (!model_->device().is_cpu()) sim_step_ = std::make_unique<SimPagedStep>(*model_, cache_config(cfg_, *model_));
  else cache_.emplace(cache_config(cfg_, *model_));
  metrics_.blocks_total = cfg_.num_blocks;
  metrics_.block_size = cfg_.block_size;
}

Engine::~Engine() = default;

int64_t Engine::add_request(std::vector<int64_t> prompt, const models::GenerationConfig& gen, RequestCallbacks cb) {
  const int64_t vocab = model_->config.vocab_size, n = static_cast<int64_t>(prompt.size());
  TPU_CHECK(n > 0, "serve: the prompt is empty");
  TPU_CHECK(n < cfg_.max_model_len,
            "serve: the prompt has {} tokens; the context is {} tokens (prompt plus at least one new token)", n,
            cfg_.max_model_len);
  for (int64_t t : prompt)
    TPU_CHECK(t >= 0 && t < vocab, "serve: prompt token {} is outside the vocabulary of {}", t, vocab);
  TPU_CHECK(gen.max_new_tokens >= 1, "serve: max_tokens must be at least 1, got {}", gen.max_new_tokens);
  TPU_CHECK(!gen.do_sample || (gen.temperature > 0 && std::isfinite(gen.temperature)),
            "serve: temperature must be positive and finite when sampling, got {}", gen.temperature);
  TPU_CHECK(gen.top_p > 0 && gen.top_p <= 1 && gen.top_k >= 0 && gen.repetition_penalty > 0,
            "serve: need 0 < top_p <= 1 (got {}), top_k >= 0 (got {}), repetition_penalty > 0 (got {})", gen.top_p,
            gen.top_k, gen.repetition_penalty);
  auto r = std::make_shared<Request>();
  r->prompt_len = n;
  r->tokens = std::move(prompt);
  r->gen = gen;
  r->stops = std::set<int64_t>(gen.stop_tokens.begin(), gen.stop_tokens.end());
  r->rng.seed(gen.seed);
  r->cb = std::move(cb);
  r->arrival = Clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  if (cfg_.max_waiting > 0 && metrics_.waiting + static_cast<int64_t>(incoming_.size()) >= cfg_.max_waiting)
    throw Overloaded(fmt::format("serve: {} requests are already waiting (the limit)", cfg_.max_waiting));
  r->id = next_id_++;
  incoming_.push_back(r);
  return r->id;
}

int64_t Engine::warm_up() {
  return compiled_ ? compiled_->warm_up() : 0;
}

void Engine::cancel(int64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  cancels_.push_back(id);
}

bool Engine::has_work() const {
  std::lock_guard<std::mutex> lk(mu_);
  return !incoming_.empty() || !cancels_.empty() || !waiting_.empty() || !running_.empty();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lk(mu_);
  EngineMetrics m = metrics_;
  m.waiting += static_cast<int64_t>(incoming_.size());
  return m;
}

std::vector<std::pair<int64_t, int64_t>> Engine::last_schedule() const { return last_schedule_; }

void Engine::admit_incoming() {
  std::vector<std::shared_ptr<Request>> in;
  std::vector<int64_t> cancels;
  {
    std::lock_guard<std::mutex> lk(mu_);
    in.swap(incoming_);
    cancels.swap(cancels_);
  }
  for (auto& r : in) waiting_.push_back(r);
  if (cancels.empty()) return;
  const std::set<int64_t> ids(cancels.begin(), cancels.end());
  auto hit = [&](const std::shared_ptr<Request>& r) { return ids.count(r->id) > 0; };
  for (auto& r : running_)
    if (hit(r)) r->cancelled = true;
  for (auto& r : waiting_)
    if (hit(r)) r->cancelled = true;
}

bool Engine::ensure_blocks(Request& r, int64_t positions) {
  const int64_t need = (positions + cfg_.block_size - 1) / cfg_.block_size;
  while (static_cast<int64_t>(r.table.size()) < need) {
    const int32_t b = blocks_.allocate();
    if (b < 0) return false;
    r.table.push_back(b);
  }
  return true;
}

void Engine::preempt(Request& r) {
  for (int32_t b : r.table) blocks_.free(b);
  r.table.clear();
  r.computed = 0;
  r.hashed = 0;
  r.last_hash = 0;
  std::lock_guard<std::mutex> lk(mu_);
  metrics_.preemptions++;
}

void Engine::finish(Request& r, FinishReason why) {
  for (int32_t b : r.table) blocks_.free(b);
  r.table.clear();
  {
    std::lock_guard<std::mutex> lk(mu_);
    metrics_.blocks_used = blocks_.num_used();  // before the callback: a client then sees its blocks back
    if (why == FinishReason::cancelled) {
      metrics_.requests_cancelled++;
    } else {
      metrics_.requests_finished++;
      const int64_t g = r.generated();
      if (g > 1)
        metrics_.tpot.observe(std::chrono::duration<double>(Clock::now() - r.first_token).count() /
                              static_cast<double>(g - 1));
    }
  }
  if (r.cb.on_finish) r.cb.on_finish(why);
}

bool Engine::step() {
  admit_incoming();
  // Cancelled requests leave first, freeing their blocks for this step.
  auto drop_cancelled = [&](auto& list) {
    for (auto it = list.begin(); it != list.end();) {
      if ((*it)->cancelled) {
        finish(**it, FinishReason::cancelled);
        it = list.erase(it);
      } else {
        ++it;
      }
    }
  };
  drop_cancelled(running_);
  drop_cancelled(waiting_);
  last_schedule_.clear();

  // 1. Running sequences in admission order; the newest are preempted when blocks run out.
  struct Item {
    std::shared_ptr<Request> r;
    int64_t n;
  };
  std::vector<Item> sched;
  int64_t budget = cfg_.max_num_batched_tokens;
  bool preempted = false;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request& r = *running_[i];
    const int64_t n = std::min(static_cast<int64_t>(r.tokens.size()) - r.computed, budget);
    bool ok = ensure_blocks(r, r.computed + n);
    while (!ok && running_.size() > i + 1) {  // preempt the newest other sequence
      preempt(*running_.back());
      waiting_.push_front(running_.back());
      running_.pop_back();
      preempted = true;
      ok = ensure_blocks(r, r.computed + n);
    }
    if (!ok) {  // r is the newest itself: it waits
      preempt(r);
      waiting_.push_front(running_[i]);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      preempted = true;
      break;
    }
    sched.push_back({running_[i], n});
    budget -= n;
    ++i;
  }
  // 2. Waiting requests, first come first served, while budget, sequences and blocks allow.
  while (!preempted && budget > 0 && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < cfg_.max_num_seqs) {
    Request& r = *waiting_.front();
    const int64_t bs = cfg_.block_size, len = static_cast<int64_t>(r.tokens.size());
    std::vector<int32_t> shared;  // cached blocks of the longest known prefix (one token left to compute)
    uint64_t h = 0;
    for (int64_t j = 0; cfg_.enable_prefix_caching && (j + 1) * bs < len; ++j) {
      std::vector<int64_t> blk(r.tokens.begin() + j * bs, r.tokens.begin() + (j + 1) * bs);
      const uint64_t hh = BlockAllocator::chain_hash(h, blk.data(), bs);
      const int32_t b = blocks_.find_cached(hh, h, blk);
      if (b < 0) break;
      blocks_.share(b);
      shared.push_back(b);
      h = hh;
    }
    const int64_t reuse = static_cast<int64_t>(shared.size()) * bs;
    const int64_t n = std::min(len - reuse, budget);
    if ((reuse + n + bs - 1) / bs - static_cast<int64_t>(shared.size()) > blocks_.num_free()) {
      for (int32_t b : shared) blocks_.free(b);
      break;
    }
    r.table = shared;
    r.computed = reuse;
    r.hashed = static_cast<int64_t>(shared.size());
    r.last_hash = h;
    ensure_blocks(r, reuse + n);
    if (reuse > 0) {
      std::lock_guard<std::mutex> lk(mu_);
      metrics_.prefix_cache_hit_tokens += reuse;
    }
    running_.push_back(waiting_.front());
    waiting_.pop_front();
    sched.push_back({running_.back(), n});
    budget -= n;
  }

  bool did = !sched.empty();
  int64_t new_tokens = 0;
  if (did) {
    // 3. One ragged forward over every scheduled token.
    RaggedBatch rb;
    rb.query_start.push_back(0);
    std::vector<int64_t> ids, pos, rows;
    std::vector<Request*> samplers;
    for (const Item& it : sched) {
      Request& r = *it.r;
      for (int64_t j = 0; j < it.n; ++j) {
        ids.push_back(r.tokens[static_cast<size_t>(r.computed + j)]);
        pos.push_back(r.computed + j);
      }
      rb.query_start.push_back(static_cast<int64_t>(ids.size()));
      rb.context_len.push_back(r.computed + it.n);
      rb.block_tables.push_back(&r.table);
      if (r.computed + it.n == static_cast<int64_t>(r.tokens.size())) {
        rows.push_back(static_cast<int64_t>(ids.size()) - 1);
        samplers.push_back(&r);
      }
      last_schedule_.push_back({r.id, it.n});
    }
    Tensor logits;
    try {
      logits = compiled_   ? compiled_->run(ids, pos, rb, rows)
               : sim_step_ ? sim_step_->run(ids, pos, rb, rows)
                           : ragged_forward(*model_, *cache_, ids, pos, rb, rows);
    } catch (...) {
      // The step's requests end (cancelled, blocks freed) so the engine stays usable; the
      // caller sees the error.
      std::set<Request*> failed;
      for (const Item& it : sched) {
        failed.insert(it.r.get());
        finish(*it.r, FinishReason::cancelled);
      }
      running_.erase(std::remove_if(running_.begin(), running_.end(),
                                    [&](const std::shared_ptr<Request>& r) { return failed.count(r.get()) > 0; }),
                     running_.end());
      throw;
    }
    for (const Item& it : sched) it.r->computed += it.n;
    // Newly completed full blocks join the prefix cache (before any of them can be freed).
    for (const Item& it : sched) {
      Request& r = *it.r;
      const int64_t bs = cfg_.block_size;
      while (cfg_.enable_prefix_caching && (r.hashed + 1) * bs <= r.computed) {
        std::vector<int64_t> blk(r.tokens.begin() + r.hashed * bs, r.tokens.begin() + (r.hashed + 1) * bs);
        const uint64_t hh = BlockAllocator::chain_hash(r.last_hash, blk.data(), bs);
        blocks_.register_cached(r.table[static_cast<size_t>(r.hashed)], hh, r.last_hash, std::move(blk));
        r.last_hash = hh;
        r.hashed++;
      }
    }
    // 4. Sampling.
    const int64_t vocab = model_->config.vocab_size;
    const std::vector<float> all = rows.empty() ? std::vector<float>{} : logits.to_vector<float>();
    std::set<Request*> done;
    std::vector<std::pair<Request*, FinishReason>> finished;
    for (size_t i = 0; i < samplers.size(); ++i) {
      Request& r = *samplers[i];
      std::vector<float> row(all.begin() + static_cast<std::ptrdiff_t>(i * static_cast<size_t>(vocab)),
                             all.begin() + static_cast<std::ptrdiff_t>((i + 1) * static_cast<size_t>(vocab)));
      const int64_t t = models::choose_token(std::move(row), r.tokens, r.gen, r.rng);
      r.tokens.push_back(t);
      ++new_tokens;
      if (r.generated() == 1) {
        r.first_token = Clock::now();
        std::lock_guard<std::mutex> lk(mu_);
        metrics_.ttft.observe(std::chrono::duration<double>(r.first_token - r.arrival).count());
      }
      const bool keep = !r.cb.on_token || r.cb.on_token(t);
      if (!keep) finished.push_back({&r, FinishReason::cancelled});
      else if (r.stops.count(t)) finished.push_back({&r, FinishReason::stop});
      else if (r.generated() >= r.gen.max_new_tokens || static_cast<int64_t>(r.tokens.size()) >= cfg_.max_model_len)
        finished.push_back({&r, FinishReason::length});
    }
    for (auto& [r, why] : finished) {
      done.insert(r);
      finish(*r, why);
    }
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [&](const std::shared_ptr<Request>& r) { return done.count(r.get()) > 0; }),
                   running_.end());
  }

  std::lock_guard<std::mutex> lk(mu_);
  const auto now = Clock::now();
  if (did) {
    metrics_.steps++;
    for (const auto& e : last_schedule_) metrics_.processed_tokens += e.second;
    metrics_.generation_tokens += new_tokens;
    recent_.push_back({now, new_tokens});
  }
  // Generated tokens per second over the last 10 s (or since the engine started).
  while (!recent_.empty() && now - recent_.front().first > std::chrono::seconds(10)) recent_.pop_front();
  int64_t recent_tokens = 0;
  for (const auto& e : recent_) recent_tokens += e.second;
  const double span = std::min(10.0, std::chrono::duration<double>(now - start_).count());
  metrics_.generation_tokens_per_second = span > 0 ? static_cast<double>(recent_tokens) / span : 0;
  metrics_.waiting = static_cast<int64_t>(waiting_.size());
  metrics_.running = static_cast<int64_t>(running_.size());
  metrics_.blocks_used = blocks_.num_used();
  return did || preempted;
}

}  // namespace tpu::serve
