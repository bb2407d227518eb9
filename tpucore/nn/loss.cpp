#include "tpucore/nn/loss.h"

#include "tpucore/defer.h"
#include "tpucore/ops.h"

namespace tpu::nn {
namespace {

struct Flat {
  Tensor logp;    // [M, C]
  Tensor target;  // [M] i32
};

Flat flatten_class_dim(const char* op, const Tensor& x, const Tensor& target) {
  TPU_CHECK(x.defined() && target.defined(), "{}: undefined input or target", op);
  TPU_CHECK(x.dim() >= 1, "{}: the input must have a class dim, got a 0-d tensor", op);
  TPU_CHECK(is_floating(x.dtype()), "{}: the input must be floating point, got {}", op, dtype_name(x.dtype()));
  TPU_CHECK(is_integral(target.dtype()) && target.dtype() != DType::boolean,
            "{}: the target must hold integer class indices, got {}", op, dtype_name(target.dtype()));
  Shape lead = x.shape();
  lead.erase(lead.ndim() - 1);
  TPU_CHECK(target.shape() == lead, "{}: target of shape {} does not match input of shape {} (expected target shape {})",
            op, target.shape().str(), x.shape().str(), lead.str());
  const int64_t c = x.size(-1);
  const Tensor t = target.to(DType::i32);
  return {reshape(x, Shape{-1, c}), t.dim() == 1 ? t : reshape(t, Shape{-1})};
}

// count: the number of valid targets (sum of the mask), for the mean.
Tensor reduce(const Tensor& per_sample, const Tensor& count, Reduction r, const Shape& lead) {
  switch (r) {
    case Reduction::none: return reshape(per_sample, lead);
    case Reduction::sum: return sum(per_sample);
    case Reduction::mean: break;
  }
  if (!count.defined()) return mean(per_sample);
  return div(sum(per_sample), count.to(per_sample.dtype()));  // a no-op cast from nll_core
}

Tensor nll_core(const char* op, const Tensor& logp2, const Tensor& t, int64_t ignore_index, double smoothing,
                Reduction r, const Shape& lead) {
  const int64_t c = logp2.size(1);
  Tensor valid, safe, index, count;
  {
    // Deferred eager mode (tpucore/defer.h): the target's few small ops run eagerly, after a flush
    // of anything pending (a recorded target included), since the range check reads their result
    // at once: recording and flushing them cost more than running them.
    EagerIfDeferred eager;
    valid = ne(t, ignore_index);
    safe = where(valid, t, 0);
    index = unsqueeze(safe, 1);
    count = r == Reduction::mean ? sum(valid).to(logp2.dtype()) : Tensor();
    // Inside a compiled function the check would be a graph break (skipped); a deferred target
    // is real after the flush above.
    if (t.numel() > 0 && !t.is_proxy()) {
      const int64_t lo = amin(safe).item<int64_t>(), hi = amax(safe).item<int64_t>();
      TPU_CHECK(lo >= 0 && hi < c,
                "{}: target class indices must be in [0, {}) (or ignore_index {}), got values in [{}, {}]", op, c,
                ignore_index, lo, hi);
    }
  }
  Tensor picked = squeeze(gather(logp2, 1, index), 1);
  Tensor loss = neg(picked);
  if (smoothing > 0) loss = add(mul(loss, 1.0 - smoothing), mul(mean(logp2, {1}), -smoothing));
  loss = where(valid, loss, 0.0);
  return reduce(loss, count, r, lead);
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o) {
  TPU_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1, "cross_entropy: label_smoothing must be in [0, 1], got {}",
            o.label_smoothing);
  Flat f = flatten_class_dim("cross_entropy", logits, target);
  return nll_core("cross_entropy", log_softmax(f.logp, 1), f.target, o.ignore_index, o.label_smoothing, o.reduction,
                  target.shape());
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index, Reduction reduction) {
  Flat f = flatten_class_dim("nll_loss", log_probs, target);
  return nll_core("nll_loss", f.logp, f.target, ignore_index, 0.0, reduction, target.shape());
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  TPU_CHECK(input.defined() && target.defined(), "mse_loss: undefined input or target");
  TPU_CHECK(input.shape() == target.shape(), "mse_loss: input of shape {} and target of shape {} differ",
            input.shape().str(), target.shape().str());
  Tensor d = sub(input, target);
  Tensor sq = mul(d, d);
  switch (reduction) {
    case Reduction::none: return sq;
    case Reduction::sum: return sum(sq);
    case Reduction::mean: break;
  }
  return mean(sq);
}

}  // namespace tpu::nn
