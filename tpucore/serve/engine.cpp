#include "tpucore/serve/engine.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <set>

#include <spdlog/spdlog.h>

#include "tpucore/core/batch_invariant.h"
#include "tpucore/core/log.h"
#include "tpucore/devices.h"
#include "tpucore/streams.h"
#include "tpucore/serve/kv_cache_manager.h"
#include "tpucore/serve/model_runner.h"
#include "tpucore/serve/output.h"
#include "tpucore/serve/scheduler.h"

namespace tpu::serve {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

namespace {
EngineConfig resolve(EngineConfig c, const models::CausalLM& m) {
  if (c.max_model_len == 0) c.max_model_len = m.config.max_position_embeddings;
  TPU_CHECK(c.block_size > 0 && c.max_num_seqs > 0 && c.max_num_batched_tokens > 0 && c.max_model_len > 1 &&
                c.num_blocks >= 0 && c.max_waiting >= 0,
            "serve::Engine: block_size ({}), max_num_seqs ({}), max_num_batched_tokens ({}) must be positive, "
            "max_model_len ({}) above 1, num_blocks ({}) and max_waiting ({}) not negative",
            c.block_size, c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len, c.num_blocks, c.max_waiting);
  TPU_CHECK(c.speculative_tokens >= 0 && c.ngram_min >= 1 && c.ngram_max >= c.ngram_min,
            "serve::Engine: speculative_tokens ({}) must not be negative and 1 <= ngram_min ({}) <= ngram_max ({})",
            c.speculative_tokens, c.ngram_min, c.ngram_max);
  const int64_t per_seq = (c.max_model_len + c.block_size - 1) / c.block_size;
  if (c.num_blocks == 0) c.num_blocks = per_seq * c.max_num_seqs;
  // One sequence at full length must fit, or preemption could not make room for it.
  TPU_CHECK(c.num_blocks >= per_seq,
            "serve::Engine: {} blocks of {} positions cannot hold one sequence of max_model_len {} (need {})",
            c.num_blocks, c.block_size, c.max_model_len, per_seq);
  return c;
}
PagedCacheConfig cache_config(const EngineConfig& c, const models::CausalLM& m) {
  PagedCacheConfig p = paged_cache_layout(m.config, c.block_size, c.num_blocks);
  p.kv_dtype = c.kv_cache_dtype;
  return p;
}
RunnerOptions runner_options(const EngineConfig& c) {
  // A speculating sequence samples a row for its last token and one per proposal.
  return {c.compile, c.compile_name, c.max_num_batched_tokens, c.max_model_len, c.max_num_seqs,
          c.max_num_seqs * (1 + c.speculative_tokens)};
}
}  // namespace

struct Engine::Impl {
  Impl(std::shared_ptr<models::CausalLM> m, const EngineConfig& c)
      : model(std::move(m)),
        cfg(resolve(c, *model)),
        kv(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching),
        scheduler({cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.speculative_tokens, cfg.ngram_min, cfg.ngram_max,
                   cfg.max_model_len},
                  kv),
        runner(*model, cache_config(cfg, *model), runner_options(cfg)),
        output(kv, cfg.max_model_len, cfg.detokenize),
        start(Clock::now()) {
    kv.set_window(runner.kv_window());  // every layer sliding: blocks behind the window are released
    metrics.blocks_total = cfg.num_blocks;
    metrics.block_size = cfg.block_size;
    const Device dev = model->device();
    const DeviceProperties props = device_properties(dev);
    if (dev.type == DeviceType::sim) {
      chip_clock_hz = props.clock_ghz * 1e9;
      // The programs of loading and of setting up the cache finish here, so the chip time
      // counted from now on (sim_stats, /metrics) is the steps' alone.
      synchronize(dev);
    }
    if (dev.type == DeviceType::pjrt && cfg.batch_invariant && props.name.find("(tpucore_sim)") == std::string::npos)
      log().warn("serve: on {} the step runs as StableHLO compiled by the PJRT plugin; whether a request's "
                 "result is independent of its batch (batch-invariant mode) is up to that compiler's kernels "
                 "(docs/serving.md)", props.name);
    metrics.kv_bytes_per_token = runner.kv_bytes_per_token();
  }
  void take_incoming(StepReport& report);
  void execute(const StepPlan& plan, StepReport& report);
  void publish(const StepPlan& plan, const StepReport& report, bool ran);
  void notify(const StepReport& report) const;

  std::shared_ptr<models::CausalLM> model;
  EngineConfig cfg;
  KVCacheManager kv;
  Scheduler scheduler;
  ModelRunner runner;
  OutputProcessor output;
  Clock::time_point start;
  double chip_clock_hz = 0;  // > 0: the model is on a sim device, whose steps are timed
  std::vector<std::pair<int64_t, int64_t>> last_schedule;

  mutable std::mutex mu;  // guards what other threads touch: incoming, cancels, next_id, metrics
  std::vector<std::shared_ptr<Request>> incoming;
  std::vector<int64_t> cancels;
  int64_t next_id = 1;
  EngineMetrics metrics;
  std::deque<std::pair<Clock::time_point, int64_t>> recent;  // (step end, tokens)
};

Engine::Engine(std::shared_ptr<models::CausalLM> model, EngineConfig cfg)
    : impl_(std::make_unique<Impl>(std::move(model), cfg)) {}

Engine::~Engine() = default;

const EngineConfig& Engine::config() const { return impl_->cfg; }
models::CausalLM& Engine::model() { return *impl_->model; }
int64_t Engine::warm_up() {
  const BatchInvariantScope invariant(impl_->cfg.batch_invariant);
  const int64_t shapes = impl_->runner.warm_up();
  if (impl_->chip_clock_hz > 0) synchronize(impl_->model->device());  // as at construction
  return shapes;
}
std::vector<std::pair<int64_t, int64_t>> Engine::last_schedule() const { return impl_->last_schedule; }

int64_t Engine::add_request(std::vector<int64_t> prompt, const SamplingParams& params, RequestCallbacks cb) {
  Impl& s = *impl_;
  const int64_t vocab = s.model->config.vocab_size, n = static_cast<int64_t>(prompt.size());
  TPU_CHECK(n > 0, "serve: the prompt is empty");
  TPU_CHECK(n < s.cfg.max_model_len,
            "serve: the prompt has {} tokens; the context is {} tokens (prompt plus at least one new token)", n,
            s.cfg.max_model_len);
  for (int64_t t : prompt)
    TPU_CHECK(t >= 0 && t < vocab, "serve: prompt token {} is outside the vocabulary of {}", t, vocab);
  params.validate();
  TPU_CHECK(params.stop.empty() || s.cfg.detokenize, "serve: stop strings need EngineConfig::detokenize");
  for (const auto& [t, b] : params.logit_bias)
    TPU_CHECK(t >= 0 && t < vocab, "serve: logit_bias token {} is outside the vocabulary of {}", t, vocab);
  if (params.constraint)
    TPU_CHECK(params.constraint->vocab().size() == vocab,
              "serve: the structured-output constraint covers {} tokens; the model's vocabulary has {}",
              params.constraint->vocab().size(), vocab);
  auto r = std::make_shared<Request>();
  r->prompt_len = n;
  r->tokens = std::move(prompt);
  r->params = params;
  r->sampler = params.sampler();
  r->stops = std::set<int64_t>(params.stop_token_ids.begin(), params.stop_token_ids.end());
  r->rng.seed(params.seed);
  if (params.constraint) r->constraint = params.constraint->start();
  r->cb = std::move(cb);
  r->arrival = Clock::now();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.cfg.max_waiting > 0 && s.metrics.waiting + static_cast<int64_t>(s.incoming.size()) >= s.cfg.max_waiting)
    throw Overloaded(fmt::format("serve: {} requests are already waiting (the limit)", s.cfg.max_waiting));
  r->id = s.next_id++;
  s.metrics.prompt_tokens += n;
  s.incoming.push_back(r);
  return r->id;
}

void Engine::cancel(int64_t id) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->cancels.push_back(id);
}

bool Engine::has_work() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  const Impl& s = *impl_;
  return !s.incoming.empty() || !s.cancels.empty() || s.metrics.waiting > 0 || s.metrics.running > 0;
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  EngineMetrics m = impl_->metrics;
  m.waiting += static_cast<int64_t>(impl_->incoming.size());
  return m;
}

bool Engine::step() {
  Impl& s = *impl_;
  const BatchInvariantScope invariant(s.cfg.batch_invariant);
  StepReport report;
  s.take_incoming(report);
  const StepPlan plan = s.scheduler.schedule();
  s.last_schedule = plan.summary();
  if (!plan.empty()) s.execute(plan, report);
  s.publish(plan, report, !plan.empty());
  s.notify(report);
  return !plan.empty() || plan.preemptions > 0;
}

void Engine::Impl::take_incoming(StepReport& report) {
  std::vector<std::shared_ptr<Request>> in;
  std::vector<int64_t> cancelled;
  {
    std::lock_guard<std::mutex> lk(mu);
    in.swap(incoming);
    cancelled.swap(cancels);
  }
  for (auto& r : in) {
    if (r->params.prompt_logprobs >= 0 && r->cb.on_prompt_logprobs) {
      try {
        r->cb.on_prompt_logprobs(prompt_logprobs(*model, r->tokens, r->params.prompt_logprobs));
      } catch (const std::exception& e) {
        log().warn("serve: the prompt log-probabilities of request {} failed: {}", r->id, e.what());
        output.finish(r, FinishReason::cancelled, report);
        continue;
      }
    }
    scheduler.add(r);
  }
  if (cancelled.empty()) return;
  scheduler.cancel(std::set<int64_t>(cancelled.begin(), cancelled.end()));
  // Cancelled requests leave first, freeing their blocks for this step.
  for (auto& r : scheduler.take_cancelled()) output.finish(r, FinishReason::cancelled, report);
}

void Engine::Impl::execute(const StepPlan& plan, StepReport& report) {
  Tensor logits;
  const double cycles_before = chip_clock_hz > 0 ? sim_stats().cycles : 0;
  try {
    logits = runner.run(plan.batch());
  } catch (...) {
    // The step's requests end (cancelled, blocks freed) so the engine stays usable; the caller
    // sees the error.
    std::set<const Request*> failed;
    for (const StepPlan::Seq& q : plan.seqs) {
      failed.insert(q.req.get());
      output.finish(q.req, FinishReason::cancelled, report);
    }
    scheduler.remove(failed);
    publish(plan, report, false);
    notify(report);
    throw;
  }
  output.commit(plan);
  output.sample(plan, logits, report);
  if (chip_clock_hz > 0) {
    // The step's programs have all finished (sim_stats counts finished runs); its chip time
    // goes to every request it ran, and to the first-token time of those that got one.
    synchronize(model->device());
    const double chip = (sim_stats().cycles - cycles_before) / chip_clock_hz;
    for (const StepPlan::Seq& q : plan.seqs) {
      Request& r = *q.req;
      r.chip_seconds += chip;
      if (r.chip_ttft < 0 && r.generated() > 0) r.chip_ttft = r.chip_seconds;
    }
  }
  std::set<const Request*> done;
  for (const auto& f : report.finished) done.insert(f.first.get());
  scheduler.remove(done);
}

void Engine::Impl::publish(const StepPlan& plan, const StepReport& report, bool ran) {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lk(mu);
  metrics.preemptions += plan.preemptions;
  metrics.prefix_cache_hit_tokens += plan.prefix_hit_tokens;
  for (double t : report.ttft) metrics.ttft.observe(t);
  for (const auto& [r, why] : report.finished) {
    if (why == FinishReason::cancelled) {
      metrics.requests_cancelled++;
    } else {
      metrics.requests_finished++;
      const int64_t g = r->generated();
      metrics.e2e.observe(std::chrono::duration<double>(now - r->arrival).count());
      if (g > 1)
        metrics.tpot.observe(std::chrono::duration<double>(now - r->first_token).count() / static_cast<double>(g - 1));
    }
  }
  if (ran) {
    metrics.steps++;
    for (const StepPlan::Seq& q : plan.seqs) metrics.processed_tokens += q.tokens;
    metrics.generation_tokens += report.new_tokens;
    metrics.spec_draft_tokens += report.draft_tokens;
    metrics.spec_accepted_tokens += report.accepted_tokens;
    for (const StepPlan::Seq& q : plan.seqs) metrics.spec_drafts += !q.draft.empty();
    recent.push_back({now, report.new_tokens});
  }
  // Generated tokens per second over the last 10 s (or since the engine started).
  while (!recent.empty() && now - recent.front().first > std::chrono::seconds(10)) recent.pop_front();
  int64_t recent_tokens = 0;
  for (const auto& e : recent) recent_tokens += e.second;
  const double span = std::min(10.0, std::chrono::duration<double>(now - start).count());
  metrics.generation_tokens_per_second = span > 0 ? static_cast<double>(recent_tokens) / span : 0;
  metrics.waiting = scheduler.num_waiting();
  metrics.running = scheduler.num_running();
  metrics.blocks_used = kv.num_used();
}

void Engine::Impl::notify(const StepReport& report) const {
  const auto now = Clock::now();
  for (const auto& [r, why] : report.finished) {
    if (r->cb.on_timing) {
      RequestTiming t;
      t.tokens = r->generated();
      const double later = static_cast<double>(std::max<int64_t>(t.tokens - 1, 1));
      if (t.tokens > 0) {
        t.ttft_s = std::chrono::duration<double>(r->first_token - r->arrival).count();
        if (t.tokens > 1) t.tpot_s = std::chrono::duration<double>(now - r->first_token).count() / later;
      }
      t.has_chip = chip_clock_hz > 0;
      if (t.has_chip && r->chip_ttft >= 0) {
        t.chip_ttft_s = r->chip_ttft;
        if (t.tokens > 1) t.chip_tpot_s = (r->chip_seconds - r->chip_ttft) / later;
      }
      r->cb.on_timing(t);
    }
    if (r->cb.on_finish) r->cb.on_finish(why);
  }
}

}  // namespace tpu::serve
