/// @file
/// Optimizers (SGD with momentum/nesterov/weight decay, AdamW), learning-rate schedules (linear
/// warmup, cosine annealing, warmup + cosine) and gradient clipping by global norm. Updates run
/// in place under no-grad, as torch.optim; parameters without a gradient are skipped.
///
/// Inside tpu::compile the update is traced into the step's graph (in-place writes on the
/// parameters and buffers are written back after each run): buffers missing at trace time are
/// made eagerly (zeros; SGD with dampening needs one eager step first), AdamW keeps its step
/// count in a 0-d tensor that the graph increments, and the learning rate enters only as a
/// plain factor, so `opt.set_lr(lr)` with lr a number argument of the compiled step is a runtime
/// input (no recompile when a schedule changes it).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tpucore/core/tensor.h"

namespace tpu::optim {

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr, const char* name);
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  /// Drops the gradients (set_to_none, the PyTorch default) or zeroes them in place.
  void zero_grad(bool set_to_none = true);
  double lr() const { return lr_; }
  void set_lr(double lr);
  const std::vector<Tensor>& params() const { return params_; }
  /// The optimizer's buffers by name ("lr", "step", "exp_avg.0", ...), for checkpoints, and
  /// their restoration (shapes must match the parameters; a tpu::Error names a bad entry).
  virtual std::map<std::string, Tensor> state_dict() const;
  virtual void load_state_dict(const std::map<std::string, Tensor>& state);

 protected:
  static void save_buffers(std::map<std::string, Tensor>& sd, const char* name, const std::vector<Tensor>& bufs);
  void load_buffers(const std::map<std::string, Tensor>& sd, const char* name, std::vector<Tensor>& bufs) const;
  std::vector<Tensor> params_;
  double lr_;
  const char* name_;
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  ///< added to the gradient (L2)
  bool nesterov = false;
};

/// g = grad + wd p; b = momentum b + (1 - dampening) g (b = g at the first step);
/// g = nesterov ? g + momentum b : b; p -= lr g.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions o);
  void step() override;
  const SGDOptions& options() const { return o_; }
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 private:
  SGDOptions o_;
  std::vector<Tensor> momentum_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  ///< decoupled: p -= lr wd p
};

/// t += 1; p -= lr wd p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
/// p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions o);
  void step() override;
  int64_t steps() const;
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 private:
  void traced_step();
  AdamWOptions o_;
  std::vector<Tensor> m_, v_;
  int64_t t_ = 0;
  Tensor step_t_;  ///< f32 scalar step count once a step was traced (then it is authoritative)
};

/// Schedules set the optimizer's lr from the step count: construct (sets the lr of step 0),
/// then call step() after each optimizer step.
class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& opt) : opt_(opt), base_lr_(opt.lr()) {}
  virtual ~LRScheduler() = default;
  void step();
  int64_t last_step() const { return step_; }
  virtual double lr_at(int64_t step) const = 0;

 protected:
  void init() { opt_.set_lr(lr_at(0)); }
  Optimizer& opt_;
  double base_lr_;
  int64_t step_ = 0;
};

/// lr = base (start_factor + (1 - start_factor) min(step, warmup) / warmup).
class LinearWarmupLR : public LRScheduler {
 public:
  LinearWarmupLR(Optimizer& opt, int64_t warmup_steps, double start_factor = 0.0);
  double lr_at(int64_t step) const override;

 private:
  int64_t warmup_;
  double start_;
};

/// lr = min_lr + (base - min_lr) (1 + cos(pi min(step, T) / T)) / 2.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& opt, int64_t t_max, double min_lr = 0.0);
  double lr_at(int64_t step) const override;

 private:
  int64_t t_max_;
  double min_lr_;
};

/// Linear warmup from 0 over warmup_steps, then cosine decay to min_lr at total_steps.
class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& opt, int64_t warmup_steps, int64_t total_steps, double min_lr = 0.0);
  double lr_at(int64_t step) const override;

 private:
  int64_t warmup_, total_;
  double min_lr_;
};

/// Scales the gradients in place so that their global L2 norm is at most max_norm; returns the
/// norm before clipping.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

}  // namespace tpu::optim
