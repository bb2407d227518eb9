// Optimizer steps against hand-computed updates (plain loops over std::vector<double>),
// learning-rate schedules against their closed forms, and gradient clipping.
#include "testing.h"
#include "tpucore/autograd.h"
#include "tpucore/optim.h"

namespace tpu::testing {
namespace {

// Gradient of sum(c * p^2) is 2 c p: a gradient that changes with p, so momentum matters.
const std::vector<double> kC = {0.5, -1.0, 2.0, 0.25};
void set_loss_grad(Tensor& p) {
  p.set_grad(Tensor());
  Tensor c = from_vector(kC);
  sum(mul(c, mul(p, p))).backward();
}
std::vector<double> ref_grad(const std::vector<double>& p) {
  std::vector<double> g(p.size());
  for (size_t i = 0; i < p.size(); ++i) g[i] = 2 * kC[i] * p[i];
  return g;
}
const std::vector<double> kP0 = {1.0, -2.0, 0.5, 3.0};

}  // namespace

TEST_CASE("optim: SGD with momentum, dampening, nesterov and weight decay matches the hand update", "[optim]") {
  struct Case {
    optim::SGDOptions o;
    const char* what;
  };
  std::vector<Case> cases = {{{.lr = 0.1}, "plain"},
                             {{.lr = 0.1, .momentum = 0.9}, "momentum"},
                             {{.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.01}, "dampening+wd"},
                             {{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true}, "nesterov+wd"}};
  for (const Case& c : cases) {
    INFO(c.what);
    Tensor p = from_vector(kP0).requires_grad_();
    optim::SGD opt({p}, c.o);
    std::vector<double> rp = kP0, buf;
    for (int step = 0; step < 3; ++step) {
      set_loss_grad(p);
      opt.step();
      std::vector<double> g = ref_grad(rp);
      for (size_t i = 0; i < g.size(); ++i) g[i] += c.o.weight_decay * rp[i];
      if (c.o.momentum != 0) {
        if (buf.empty()) buf = g;
        else
          for (size_t i = 0; i < g.size(); ++i) buf[i] = c.o.momentum * buf[i] + (1 - c.o.dampening) * g[i];
        for (size_t i = 0; i < g.size(); ++i) g[i] = c.o.nesterov ? g[i] + c.o.momentum * buf[i] : buf[i];
      }
      for (size_t i = 0; i < g.size(); ++i) rp[i] -= c.o.lr * g[i];
      check_near(p, rp);
    }
  }
}

TEST_CASE("optim: AdamW matches the hand update (bias correction, decoupled weight decay)", "[optim]") {
  const optim::AdamWOptions o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  Tensor p = from_vector(kP0).requires_grad_();
  optim::AdamW opt({p}, o);
  std::vector<double> rp = kP0, m(4, 0.0), v(4, 0.0);
  for (int t = 1; t <= 4; ++t) {
    set_loss_grad(p);
    opt.step();
    std::vector<double> g = ref_grad(rp);
    for (size_t i = 0; i < 4; ++i) {
      rp[i] -= o.lr * o.weight_decay * rp[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(o.beta1, t)), vh = v[i] / (1 - std::pow(o.beta2, t));
      rp[i] -= o.lr * mh / (std::sqrt(vh) + o.eps);
    }
    check_near(p, rp, 2e-5);
  }
  CHECK(opt.steps() == 4);
}

TEST_CASE("optim: parameters without a gradient are skipped, zero_grad, bad options", "[optim]") {
  Tensor a = from_vector(kP0).requires_grad_(), b = ones({2}).requires_grad_();
  optim::SGD opt({a, b}, {.lr = 0.5});
  set_loss_grad(a);
  opt.step();
  check_near(b, {1, 1});
  opt.zero_grad(false);
  check_near(a.grad(), {0, 0, 0, 0});
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
  expect_error([&] { optim::SGD({a}, {.lr = 0.1, .nesterov = true}); }, {"SGD", "nesterov", "momentum"});
  expect_error([&] { optim::SGD({}, {}); }, {"SGD", "empty"});
  expect_error([&] { optim::AdamW({ones({2})}, {}); }, {"AdamW", "requires grad"});
  expect_error([&] { optim::AdamW({a}, {.beta1 = 1.0}); }, {"AdamW", "betas"});
  expect_error([&] { opt.set_lr(-1); }, {"SGD", "learning rate"});
}

TEST_CASE("optim: learning-rate schedules follow their closed forms", "[optim]") {
  const double kPi = 3.14159265358979323846;
  Tensor p = ones({1}).requires_grad_();
  {
    optim::SGD opt({p}, {.lr = 1.0});
    optim::LinearWarmupLR s(opt, 4, 0.2);
    for (int t = 0; t <= 6; ++t) {
      INFO("step " << t);
      CHECK(opt.lr() == Approx(0.2 + 0.8 * std::min(t, 4) / 4.0));
      s.step();
    }
  }
  {
    optim::SGD opt({p}, {.lr = 0.1});
    optim::CosineAnnealingLR s(opt, 10, 0.01);
    for (int t = 0; t <= 12; ++t) {
      INFO("step " << t);
      CHECK(opt.lr() == Approx(0.01 + 0.09 * (1 + std::cos(kPi * std::min(t, 10) / 10.0)) / 2));
      s.step();
    }
  }
  {
    optim::SGD opt({p}, {.lr = 1.0});
    optim::WarmupCosineLR s(opt, 3, 13, 0.0);
    for (int t = 0; t <= 14; ++t) {
      INFO("step " << t);
      const double want =
          t < 3 ? (t + 1) / 4.0 : (1 + std::cos(kPi * (std::min(t, 13) - 3) / 10.0)) / 2;
      CHECK(opt.lr() == Approx(want));
      s.step();
    }
  }
  optim::SGD opt({p}, {.lr = 1.0});
  expect_error([&] { optim::WarmupCosineLR(opt, 5, 5); }, {"WarmupCosineLR", "total_steps"});
}

TEST_CASE("optim: clip_grad_norm_ scales to the global norm", "[optim]") {
  Tensor a = ones({2}).requires_grad_(), b = ones({1}).requires_grad_();
  a.set_grad(from_vector(std::vector<float>{3, 0}));
  b.set_grad(from_vector(std::vector<float>{4}));
  const double n = optim::clip_grad_norm_({a, b}, 1.0);
  CHECK(n == Approx(5.0));
  check_near(a.grad(), {0.6, 0}, 1e-5);
  check_near(b.grad(), {0.8}, 1e-5);
  CHECK(optim::clip_grad_norm_({a, b}, 10.0) == Approx(1.0).epsilon(1e-5));  // below the limit: unchanged
  check_near(b.grad(), {0.8}, 1e-5);
}

}  // namespace tpu::testing
