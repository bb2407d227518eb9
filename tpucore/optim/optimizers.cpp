#include <cmath>

#include "graph/tracer.h"
#include "ops/registry.h"
#include "tpucore/autograd.h"
#include "tpucore/defer.h"
#include "tpucore/ops.h"
#include "tpucore/optim.h"

namespace tpu::optim {
namespace {

// True while tpu::compile traces: the update is recorded into the step's graph. A deferred eager
// recording (tpucore/defer.h) is eager code: the step runs its eager path.
bool tracing() {
  auto* t = dynamic_cast<graph::Tracer*>(ops::interceptor());
  return ops::interceptor() != nullptr && !(t && t->deferred());
}

// Runs its scope eagerly even while tracing (optimizer buffers made at the first traced step
// are real tensors, captured by the graph and written back).
class EagerScope {
 public:
  EagerScope() : prev_(ops::interceptor()) { ops::set_interceptor(nullptr); }
  ~EagerScope() { ops::set_interceptor(prev_); }
  EagerScope(const EagerScope&) = delete;
  EagerScope& operator=(const EagerScope&) = delete;

 private:
  ops::DispatchInterceptor* prev_;
};

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, double lr, const char* name)
    : params_(std::move(params)), lr_(lr), name_(name) {
  TPU_CHECK(!params_.empty(), "{}: got an empty parameter list", name_);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    TPU_CHECK(p.defined(), "{}: parameter {} is undefined", name_, i);
    TPU_CHECK(p.is_leaf() && p.requires_grad(), "{}: parameter {} ({} {}) must be a leaf that requires grad", name_, i,
              dtype_name(p.dtype()), p.shape().str());
  }
  set_lr(lr);
}

void Optimizer::set_lr(double lr) {
  TPU_CHECK(lr >= 0 && std::isfinite(lr), "{}: invalid learning rate {}", name_, lr);
  lr_ = lr;
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  return {{"lr", scalar_tensor(lr_, DType::f32)}};
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& sd) {
  auto it = sd.find("lr");
  TPU_CHECK(it != sd.end() && it->second.numel() == 1, "{}: load_state_dict: missing 'lr'", name_);
  set_lr(it->second.item<double>());
}

void Optimizer::save_buffers(std::map<std::string, Tensor>& sd, const char* name, const std::vector<Tensor>& bufs) {
  for (size_t i = 0; i < bufs.size(); ++i)
    if (bufs[i].defined()) sd[fmt::format("{}.{}", name, i)] = bufs[i];
}

void Optimizer::load_buffers(const std::map<std::string, Tensor>& sd, const char* name, std::vector<Tensor>& bufs) const {
  NoGradGuard ng;
  for (size_t i = 0; i < bufs.size(); ++i) {
    auto it = sd.find(fmt::format("{}.{}", name, i));
    if (it == sd.end()) {
      bufs[i] = Tensor();
      continue;
    }
    const Tensor& p = params_[i];
    TPU_CHECK(it->second.shape() == p.shape(), "{}: load_state_dict: '{}.{}' has shape {} but parameter {} has shape {}",
              name_, name, i, it->second.shape().str(), i, p.shape().str());
    bufs[i] = it->second.to(p.device()).to(p.dtype()).clone();
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  for (Tensor& p : params_) {
    if (set_to_none) p.set_grad(Tensor());
    else p.zero_grad();
  }
}

SGD::SGD(std::vector<Tensor> params, SGDOptions o) : Optimizer(std::move(params), o.lr, "SGD"), o_(o) {
  TPU_CHECK(o.momentum >= 0, "SGD: momentum must be non-negative, got {}", o.momentum);
  TPU_CHECK(o.weight_decay >= 0, "SGD: weight_decay must be non-negative, got {}", o.weight_decay);
  TPU_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
            "SGD: nesterov needs momentum > 0 and dampening 0 (got momentum {}, dampening {})", o.momentum, o.dampening);
  momentum_.resize(params_.size());
}

void SGD::step() {
  NoGradGuard ng;
  const bool traced = tracing();
  // Deferred eager (tpucore/defer.h): the recording (the backward that made the gradients) is
  // flushed and the update runs eagerly, in place like plain eager. The fused recorded update
  // (b = m b + g; p -= lr b over fresh output buffers, then handed to p and b) was slower on the
  // training step than eager's in-place loops (bench_defer, README).
  EagerIfDeferred in_place;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (o_.weight_decay != 0) g = add(g, p, o_.weight_decay);
    if (o_.momentum != 0) {
      Tensor& b = momentum_[i];
      if (!b.defined() && traced) {
        // b = momentum * 0 + (1 - dampening) g equals the first step's b = g when dampening is 0.
        TPU_CHECK(o_.dampening == 0,
                  "SGD: a compiled step with dampening {} needs the momentum buffers of a first eager step; run one "
                  "step() outside tpu::compile first",
                  o_.dampening);
        EagerScope eager;
        b = zeros_like(p);
      }
      if (!b.defined()) {
        b = clone(g);
      } else {
        b.mul_(o_.momentum);
        add_(b, g, 1.0 - o_.dampening);
      }
      g = o_.nesterov ? add(g, b, o_.momentum) : b;
    }
    if (traced) p.sub_(mul(g, lr_));  // lr as a plain factor: a runtime input of the graph
    else add_(p, g, -lr_);
  }
}

std::map<std::string, Tensor> SGD::state_dict() const {
  auto sd = Optimizer::state_dict();
  save_buffers(sd, "momentum", momentum_);
  return sd;
}
void SGD::load_state_dict(const std::map<std::string, Tensor>& sd) {
  Optimizer::load_state_dict(sd);
  load_buffers(sd, "momentum", momentum_);
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o) : Optimizer(std::move(params), o.lr, "AdamW"), o_(o) {
  TPU_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "AdamW: betas must be in [0, 1), got ({}, {})",
            o.beta1, o.beta2);
  TPU_CHECK(o.eps >= 0, "AdamW: eps must be non-negative, got {}", o.eps);
  TPU_CHECK(o.weight_decay >= 0, "AdamW: weight_decay must be non-negative, got {}", o.weight_decay);
  m_.resize(params_.size());
  v_.resize(params_.size());
}

int64_t AdamW::steps() const { return step_t_.defined() ? static_cast<int64_t>(step_t_.item<double>()) : t_; }

void AdamW::step() {
  NoGradGuard ng;
  if (tracing()) {
    traced_step();
    return;
  }
  if (step_t_.defined()) {
    step_t_.add_(1.0);
    t_ = static_cast<int64_t>(step_t_.item<double>());
  } else {
    ++t_;
  }
  const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(t_));
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!m_[i].defined()) {
      m_[i] = zeros_like(p);
      v_[i] = zeros_like(p);
    }
    if (o_.weight_decay != 0) p.mul_(1.0 - lr_ * o_.weight_decay);
    m_[i].mul_(o_.beta1);
    add_(m_[i], g, 1.0 - o_.beta1);
    v_[i].mul_(o_.beta2);
    add_(v_[i], mul(g, g), 1.0 - o_.beta2);
    Tensor denom = add(sqrt(div(v_[i], bc2)), o_.eps);
    add_(p, div(m_[i], denom), -lr_ / bc1);
  }
}

// The same update with the step count and bias corrections as tensors and lr as a plain factor.
void AdamW::traced_step() {
  if (!step_t_.defined()) {
    EagerScope eager;
    step_t_ = scalar_tensor(static_cast<double>(t_), TensorOptions(DType::f32, params_[0].device()));
  }
  step_t_.add_(1.0);
  // 1 - beta^t = -expm1(t ln beta)
  Tensor bc1 = neg(expm1(mul(step_t_, std::log(o_.beta1))));
  Tensor bc2 = neg(expm1(mul(step_t_, std::log(o_.beta2))));
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!m_[i].defined()) {
      EagerScope eager;
      m_[i] = zeros_like(p);
      v_[i] = zeros_like(p);
    }
    if (o_.weight_decay != 0) p.sub_(mul(mul(p, lr_), o_.weight_decay));
    m_[i].mul_(o_.beta1);
    add_(m_[i], g, 1.0 - o_.beta1);
    v_[i].mul_(o_.beta2);
    add_(v_[i], mul(g, g), 1.0 - o_.beta2);
    Tensor denom = add(sqrt(div(v_[i], bc2)), o_.eps);
    p.sub_(mul(div(div(m_[i], bc1), denom), lr_));
  }
}

std::map<std::string, Tensor> AdamW::state_dict() const {
  auto sd = Optimizer::state_dict();
  sd["step"] = scalar_tensor(static_cast<long long>(steps()), DType::i32);
  save_buffers(sd, "exp_avg", m_);
  save_buffers(sd, "exp_avg_sq", v_);
  return sd;
}
void AdamW::load_state_dict(const std::map<std::string, Tensor>& sd) {
  Optimizer::load_state_dict(sd);
  auto it = sd.find("step");
  TPU_CHECK(it != sd.end() && it->second.numel() == 1, "AdamW: load_state_dict: missing 'step'");
  t_ = it->second.item<int64_t>();
  step_t_ = Tensor();
  load_buffers(sd, "exp_avg", m_);
  load_buffers(sd, "exp_avg_sq", v_);
  for (size_t i = 0; i < m_.size(); ++i)
    TPU_CHECK(m_[i].defined() == v_[i].defined(), "AdamW: load_state_dict: exp_avg.{} and exp_avg_sq.{} must come together",
              i, i);
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  TPU_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got {}", max_norm);
  NoGradGuard ng;
  double total = 0;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor gf = g.to(DType::f32);
    total += sum(mul(gf, gf)).item<double>();
  }
  total = std::sqrt(total);
  const double scale = max_norm / (total + 1e-6);
  if (scale < 1)
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (g.defined()) g.mul_(scale);
    }
  return total;
}

}  // namespace tpu::optim
