#include <algorithm>
#include <cmath>

#include "tpucore/optim.h"

namespace tpu::optim {
namespace {
constexpr double kPi = 3.14159265358979323846;
}

void LRScheduler::step() {
  ++step_;
  opt_.set_lr(lr_at(step_));
}

LinearWarmupLR::LinearWarmupLR(Optimizer& opt, int64_t warmup, double start)
    : LRScheduler(opt), warmup_(warmup), start_(start) {
  TPU_CHECK(warmup > 0, "LinearWarmupLR: warmup_steps must be positive, got {}", warmup);
  TPU_CHECK(start >= 0 && start <= 1, "LinearWarmupLR: start_factor must be in [0, 1], got {}", start);
  init();
}
double LinearWarmupLR::lr_at(int64_t step) const {
  const double f = static_cast<double>(std::min(step, warmup_)) / static_cast<double>(warmup_);
  return base_lr_ * (start_ + (1.0 - start_) * f);
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, int64_t t_max, double min_lr)
    : LRScheduler(opt), t_max_(t_max), min_lr_(min_lr) {
  TPU_CHECK(t_max > 0, "CosineAnnealingLR: t_max must be positive, got {}", t_max);
  init();
}
double CosineAnnealingLR::lr_at(int64_t step) const {
  const double t = static_cast<double>(std::min(step, t_max_)) / static_cast<double>(t_max_);
  return min_lr_ + (base_lr_ - min_lr_) * (1.0 + std::cos(kPi * t)) / 2.0;
}

WarmupCosineLR::WarmupCosineLR(Optimizer& opt, int64_t warmup, int64_t total, double min_lr)
    : LRScheduler(opt), warmup_(warmup), total_(total), min_lr_(min_lr) {
  TPU_CHECK(warmup >= 0 && total > warmup, "WarmupCosineLR: expected 0 <= warmup_steps ({}) < total_steps ({})", warmup,
            total);
  init();
}
double WarmupCosineLR::lr_at(int64_t step) const {
  if (step < warmup_) return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_ + 1);
  const double t = static_cast<double>(std::min(step, total_) - warmup_) / static_cast<double>(total_ - warmup_);
  return min_lr_ + (base_lr_ - min_lr_) * (1.0 + std::cos(kPi * t)) / 2.0;
}

}  // namespace tpu::optim
