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

/// Base class of the optimizers: owns the parameter list and the learning rate.
class Optimizer {
 public:
  /// `params` must be non-empty, defined leaves that require grad, and `lr` finite and >= 0
  /// (else a tpu::Error naming the optimizer `name`).
  Optimizer(std::vector<Tensor> params, double lr, const char* name);
  virtual ~Optimizer() = default;
  /// Updates every parameter that has a gradient, in place.
  virtual void step() = 0;
  /// Drops the gradients (set_to_none, the PyTorch default) or zeroes them in place.
  void zero_grad(bool set_to_none = true);
  /// The learning rate.
  double lr() const { return lr_; }
  /// Sets the learning rate (finite, >= 0, else a tpu::Error).
  void set_lr(double lr);
  /// The parameters.
  const std::vector<Tensor>& params() const { return params_; }
  /// The optimizer's buffers by name ("lr", "step", "exp_avg.0", ...), for checkpoints, and
  /// their restoration (shapes must match the parameters; a tpu::Error names a bad entry).
  virtual std::map<std::string, Tensor> state_dict() const;
  /// Restores state_dict() output.
  virtual void load_state_dict(const std::map<std::string, Tensor>& state);

 protected:
  /// For subclasses: stores `bufs` as "<name>.<i>" entries of `sd`.
  static void save_buffers(std::map<std::string, Tensor>& sd, const char* name, const std::vector<Tensor>& bufs);
  /// For subclasses: reads "<name>.<i>" entries of `sd` into `bufs` (shapes checked).
  void load_buffers(const std::map<std::string, Tensor>& sd, const char* name, std::vector<Tensor>& bufs) const;
  /// The parameters.
  std::vector<Tensor> params_;
  /// The learning rate.
  double lr_;
  /// Name used in error messages ("SGD", "AdamW").
  const char* name_;
};

/// Options of SGD (as torch.optim.SGD; all >= 0; nesterov needs momentum > 0 and no dampening).
struct SGDOptions {
  /// Learning rate.
  double lr = 0.01;
  /// Momentum factor (0: plain SGD).
  double momentum = 0.0;
  /// Dampening of the momentum.
  double dampening = 0.0;
  double weight_decay = 0.0;  ///< added to the gradient (L2)
  /// Nesterov momentum.
  bool nesterov = false;
};

/// g = grad + wd p; b = momentum b + (1 - dampening) g (b = g at the first step);
/// g = nesterov ? g + momentum b : b; p -= lr g.
class SGD : public Optimizer {
 public:
  /// SGD over `params`; bad options are a tpu::Error.
  SGD(std::vector<Tensor> params, SGDOptions o);
  /// One update (see the class description).
  void step() override;
  /// The options.
  const SGDOptions& options() const { return o_; }
  std::map<std::string, Tensor> state_dict() const override;
  /// Restores "lr" and the momentum buffers.
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 private:
  SGDOptions o_;
  std::vector<Tensor> momentum_;
};

/// Options of AdamW (as torch.optim.AdamW).
struct AdamWOptions {
  /// Learning rate.
  double lr = 1e-3;
  /// Decay rates of the first and second moment averages, in [0, 1).
  ///@{
  double beta1 = 0.9, beta2 = 0.999;
  ///@}
  /// Added to the denominator (>= 0).
  double eps = 1e-8;
  double weight_decay = 0.01;  ///< decoupled: p -= lr wd p
};

/// t += 1; p -= lr wd p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
/// p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
class AdamW : public Optimizer {
 public:
  /// AdamW over `params`; bad options are a tpu::Error.
  AdamW(std::vector<Tensor> params, AdamWOptions o);
  /// One update (see the class description).
  void step() override;
  /// Steps taken (t).
  int64_t steps() const;
  std::map<std::string, Tensor> state_dict() const override;
  /// Restores "lr", "step" and the moment buffers.
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
  /// A schedule driving `opt`, whose current lr is the base lr.
  explicit LRScheduler(Optimizer& opt) : opt_(opt), base_lr_(opt.lr()) {}
  virtual ~LRScheduler() = default;
  /// Advances one step and sets the optimizer's lr to lr_at(step).
  void step();
  /// Steps taken.
  int64_t last_step() const { return step_; }
  /// The learning rate of step `step`.
  virtual double lr_at(int64_t step) const = 0;

 protected:
  /// For subclasses' constructors: sets the lr of step 0.
  void init() { opt_.set_lr(lr_at(0)); }
  /// The optimizer driven.
  Optimizer& opt_;
  /// The optimizer's lr at construction.
  double base_lr_;
  /// Steps taken.
  int64_t step_ = 0;
};

/// lr = base (start_factor + (1 - start_factor) min(step, warmup) / warmup).
class LinearWarmupLR : public LRScheduler {
 public:
  /// warmup_steps > 0 and start_factor in [0, 1], else a tpu::Error.
  LinearWarmupLR(Optimizer& opt, int64_t warmup_steps, double start_factor = 0.0);
  /// See the class description.
  double lr_at(int64_t step) const override;

 private:
  int64_t warmup_;
  double start_;
};

/// lr = min_lr + (base - min_lr) (1 + cos(pi min(step, T) / T)) / 2.
class CosineAnnealingLR : public LRScheduler {
 public:
  /// t_max (T) > 0, else a tpu::Error.
  CosineAnnealingLR(Optimizer& opt, int64_t t_max, double min_lr = 0.0);
  /// See the class description.
  double lr_at(int64_t step) const override;

 private:
  int64_t t_max_;
  double min_lr_;
};

/// Linear warmup from 0 over warmup_steps, then cosine decay to min_lr at total_steps.
class WarmupCosineLR : public LRScheduler {
 public:
  /// 0 <= warmup_steps < total_steps, else a tpu::Error.
  WarmupCosineLR(Optimizer& opt, int64_t warmup_steps, int64_t total_steps, double min_lr = 0.0);
  /// See the class description.
  double lr_at(int64_t step) const override;

 private:
  int64_t warmup_, total_;
  double min_lr_;
};

/// Scales the gradients in place so that their global L2 norm is at most max_norm; returns the
/// norm before clipping.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

}  // namespace tpu::optim
