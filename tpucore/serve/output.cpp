#include "tpucore/serve/output.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <spdlog/spdlog.h>

#include "tpucore/autograd.h"
#include "tpucore/core/log.h"

namespace tpu::serve {

void OutputProcessor::commit(const StepPlan& plan) {
  // Proposals (speculative decoding) count once verified, in sample().
  for (const StepPlan::Seq& s : plan.seqs) s.req->computed += s.tokens - static_cast<int64_t>(s.draft.size());
  // Newly completed full blocks join the prefix cache (before any of them can be freed).
  for (const StepPlan::Seq& s : plan.seqs) kv_.cache_full_blocks(*s.req);
}

void OutputProcessor::finish(const std::shared_ptr<Request>& r, FinishReason why, StepReport& report) {
  kv_.free(*r);
  report.finished.push_back({r, why});
}

std::vector<float> adjusted_logits(std::vector<float> x, const Request& r) {
  const auto n = static_cast<int64_t>(x.size());
  const SamplingParams& p = r.params;
  for (const auto& [t, b] : p.logit_bias)
    if (t >= 0 && t < n) x[static_cast<size_t>(t)] += static_cast<float>(b);
  if (r.generated() < p.min_tokens)
    for (int64_t t : r.stops)
      if (t >= 0 && t < n) x[static_cast<size_t>(t)] = -std::numeric_limits<float>::infinity();
  if (p.frequency_penalty != 0 || p.presence_penalty != 0)
    for (const auto& [t, c] : r.counts)
      if (t >= 0 && t < n)
        x[static_cast<size_t>(t)] -= static_cast<float>(static_cast<double>(c) * p.frequency_penalty + p.presence_penalty);
  return x;
}

TokenOutput token_logprobs(const std::vector<float>& raw, int64_t token, int64_t k) {
  TokenOutput o;
  o.token = token;
  double top = -std::numeric_limits<double>::infinity();
  for (float v : raw) top = std::max(top, static_cast<double>(v));
  double z = 0;
  for (float v : raw) z += std::exp(static_cast<double>(v) - top);
  const double lse = top + std::log(z);
  o.logprob = static_cast<double>(raw[static_cast<size_t>(token)]) - lse;
  if (k > 0) {
    std::vector<int64_t> ids(raw.size());
    std::iota(ids.begin(), ids.end(), 0);
    const auto kk = std::min<size_t>(static_cast<size_t>(k), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(kk), ids.end(), [&](int64_t a, int64_t b) {
      const float va = raw[static_cast<size_t>(a)], vb = raw[static_cast<size_t>(b)];
      return va > vb || (va == vb && a < b);
    });
    for (size_t i = 0; i < kk; ++i) o.top.push_back({ids[i], static_cast<double>(raw[static_cast<size_t>(ids[i])]) - lse});
  }
  return o;
}

std::vector<TokenOutput> prompt_logprobs(models::CausalLM& m, const std::vector<int64_t>& prompt, int64_t k) {
  NoGradGuard ng;
  const auto T = static_cast<int64_t>(prompt.size());
  const Tensor logits = m.forward(from_vector(prompt, Shape{1, T}, TensorOptions(DType::i64, m.device())))
                            .to(DType::f32)
                            .to(Device())
                            .contiguous();
  const std::vector<float> all = logits.to_vector<float>();
  const auto vocab = static_cast<size_t>(logits.size(2));
  std::vector<TokenOutput> out;
  for (size_t i = 1; i < prompt.size(); ++i) {
    const std::vector<float> row(all.begin() + static_cast<std::ptrdiff_t>((i - 1) * vocab),
                                 all.begin() + static_cast<std::ptrdiff_t>(i * vocab));
    out.push_back(token_logprobs(row, prompt[i], k));
  }
  return out;
}

bool constrain(const Request& r, std::vector<float>& x) {
  const JsonConstraint& g = *r.params.constraint;
  const auto mask = g.allowed(*r.constraint);
  const bool complete = g.complete(*r.constraint);
  constexpr float kOff = -std::numeric_limits<float>::infinity();
  // Stop tokens only once the document is complete; other tokens only where the automaton allows.
  std::vector<std::pair<size_t, float>> ends;
  for (int64_t t : r.stops)
    if (complete && t >= 0 && static_cast<size_t>(t) < x.size()) ends.push_back({static_cast<size_t>(t), x[static_cast<size_t>(t)]});
  for (size_t t = 0; t < x.size(); ++t)
    if (t >= mask->size() || !(*mask)[t]) x[t] = kOff;
  for (const auto& [t, v] : ends) x[t] = v;
  return std::any_of(x.begin(), x.end(), [&](float v) { return v != kOff; });
}

bool OutputProcessor::stop_string_hit(Request& r) const {
  if (r.params.stop.empty() || r.generated() < r.params.min_tokens) return false;
  // The text of the generated tokens; the search restarts a stop string's length before the
  // end of the text already searched, so a string completed by this token is found once.
  const std::string text =
      detokenize_(std::vector<int64_t>(r.tokens.begin() + static_cast<std::ptrdiff_t>(r.prompt_len), r.tokens.end()));
  size_t longest = 0;
  for (const auto& s : r.params.stop) longest = std::max(longest, s.size());
  const size_t from = r.stop_scan > longest ? r.stop_scan - longest : 0;
  r.stop_scan = text.size();
  for (const auto& s : r.params.stop)
    if (text.find(s, std::min(from, text.size())) != std::string::npos) return true;
  return false;
}

void OutputProcessor::sample(const StepPlan& plan, const Tensor& logits, StepReport& report) {
  const std::vector<float> all = logits.numel() == 0 ? std::vector<float>{} : logits.to_vector<float>();
  const auto vocab = static_cast<size_t>(logits.size(1));
  size_t row = 0;
  for (const StepPlan::Seq& q : plan.seqs) {
    if (!q.samples) continue;
    const std::shared_ptr<Request>& rp = q.req;
    // Row j holds the logits after the proposals before j: its token is the one plain decoding
    // would choose next as long as every earlier proposal was chosen; the first token that
    // differs from its proposal (or the token after all of them) ends the sequence's step.
    const size_t d = q.draft.size(), first = row;
    int64_t accepted = 0;
    bool alive = true;
    for (size_t j = 0; j <= d && alive; ++j) {
      const std::vector<float> x(all.begin() + static_cast<std::ptrdiff_t>(row * vocab),
                                 all.begin() + static_cast<std::ptrdiff_t>((row + 1) * vocab));
      ++row;
      int64_t t = -1;
      alive = sample_one(rp, x, t, report);
      const bool hit = j < d && t == q.draft[j];
      accepted += hit;
      if (!hit) break;
    }
    row = first + d + 1;
    report.draft_tokens += static_cast<int64_t>(d);
    report.accepted_tokens += accepted;
    if (d == 0 || !alive) continue;  // no proposals, or finished (blocks freed)
    // The accepted proposals' keys and values are cached; the rejected positions' blocks go back.
    rp->computed += accepted;
    kv_.cache_full_blocks(*rp);
    kv_.trim(*rp, static_cast<int64_t>(rp->tokens.size()));
  }
}

bool OutputProcessor::sample_one(const std::shared_ptr<Request>& rp, const std::vector<float>& x, int64_t& t,
                                 StepReport& report) {
  Request& r = *rp;
  std::vector<float> adjusted = adjusted_logits(x, r);
  if (r.constraint && !constrain(r, adjusted)) {
    // No token continues the document (the vocabulary cannot spell what must come next).
    log().warn("serve: request {}: no token can continue its structured output", r.id);
    finish(rp, FinishReason::cancelled, report);
    return false;
  }
  t = models::choose_token(std::move(adjusted), r.tokens, r.sampler, r.rng);
  bool constraint_done = false;
  if (r.constraint && !r.stops.count(t)) {
    if (!r.params.constraint->advance(*r.constraint, t)) {  // only a masked token could (a sampler fault)
      log().warn("serve: request {}: token {} does not continue its structured output", r.id, t);
      finish(rp, FinishReason::cancelled, report);
      return false;
    }
    constraint_done = r.params.constraint->finished(*r.constraint);
  }
  r.tokens.push_back(t);
  r.counts[t]++;
  report.new_tokens++;
  if (r.generated() == 1) {
    r.first_token = Clock::now();
    report.ttft.push_back(std::chrono::duration<double>(r.first_token - r.arrival).count());
  }
  bool keep = true;
  if (r.cb.on_output) {
    keep = r.cb.on_output(r.params.logprobs >= 0 ? token_logprobs(x, t, r.params.logprobs) : TokenOutput{t, 0, {}});
  } else if (r.cb.on_token) {
    keep = r.cb.on_token(t);
  }
  if (!keep) finish(rp, FinishReason::cancelled, report);
  else if (r.stops.count(t) || constraint_done || stop_string_hit(r)) finish(rp, FinishReason::stop, report);
  else if (r.generated() >= r.params.max_tokens || static_cast<int64_t>(r.tokens.size()) >= max_model_len_)
    finish(rp, FinishReason::length, report);
  else return true;
  return false;
}

}  // namespace tpu::serve
