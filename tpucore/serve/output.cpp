#include "tpucore/serve/output.h"

namespace tpu::serve {

void OutputProcessor::commit(const StepPlan& plan) {
  for (const StepPlan::Seq& s : plan.seqs) s.req->computed += s.tokens;
  // Newly completed full blocks join the prefix cache (before any of them can be freed).
  for (const StepPlan::Seq& s : plan.seqs) kv_.cache_full_blocks(*s.req);
}

void OutputProcessor::finish(const std::shared_ptr<Request>& r, FinishReason why, StepReport& report) {
  kv_.free(*r);
  report.finished.push_back({r, why});
}

void OutputProcessor::sample(const StepPlan& plan, const Tensor& logits, StepReport& report) {
  const std::vector<float> all = logits.numel() == 0 ? std::vector<float>{} : logits.to_vector<float>();
  const auto vocab = static_cast<size_t>(logits.size(1));
  size_t row = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (!plan.seqs[i].samples) continue;
    const std::shared_ptr<Request>& rp = plan.seqs[i].req;
    Request& r = *rp;
    std::vector<float> x(all.begin() + static_cast<std::ptrdiff_t>(row * vocab),
                         all.begin() + static_cast<std::ptrdiff_t>((row + 1) * vocab));
    ++row;
    const int64_t t = models::choose_token(std::move(x), r.tokens, r.sampler, r.rng);
    r.tokens.push_back(t);
    report.new_tokens++;
    if (r.generated() == 1) {
      r.first_token = Clock::now();
      report.ttft.push_back(std::chrono::duration<double>(r.first_token - r.arrival).count());
    }
    const bool keep = !r.cb.on_token || r.cb.on_token(t);
    if (!keep) finish(rp, FinishReason::cancelled, report);
    else if (r.stops.count(t)) finish(rp, FinishReason::stop, report);
    else if (r.generated() >= r.params.max_tokens || static_cast<int64_t>(r.tokens.size()) >= max_model_len_)
      finish(rp, FinishReason::length, report);
  }
}

}  // namespace tpu::serve
