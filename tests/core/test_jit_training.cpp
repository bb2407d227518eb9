// Traced backward: a whole training step (forward, loss, backward, optimizer update) compiled
// into one graph gives the same parameters, optimizer state and gradients as the eager step,
// hits the cache afterwards, and takes the learning rate as a runtime input.
#include "codegen_testing.h"
#include "jit_testing.h"
#include "tpucore/autograd.h"
#include "tpucore/nn.h"

namespace tpu {
namespace {
using namespace jit_testing;

struct Batch {
  Tensor x, y;
};
std::vector<Batch> batches(int n, int64_t rows, int64_t dim, int64_t classes, Device dev) {
  Generator g(77);
  std::vector<Batch> v;
  for (int i = 0; i < n; ++i)
    v.push_back({randn({rows, dim}, {}, &g).to(dev), randint(0, classes, {rows}, DType::i32, &g).to(dev)});
  return v;
}

template <class Opt, class MakeOpt>
void check_training(Device dev, MakeOpt make_opt, const std::string& name, double tol) {
  const std::vector<int64_t> dims{16, 32, 4};
  Generator g1(5), g2(5);
  auto eager_model = std::make_shared<nn::MLP>(dims, "relu", 0.0, &g1);
  auto comp_model = std::make_shared<nn::MLP>(dims, "relu", 0.0, &g2);
  eager_model->to(dev);
  comp_model->to(dev);
  Opt eager_opt = make_opt(eager_model->parameters());
  Opt comp_opt = make_opt(comp_model->parameters());
  auto step_fn = [](nn::Module& m, optim::Optimizer& opt, const Tensor& x, const Tensor& y, double lr) {
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(m.forward(x), y);
    loss.backward();
    opt.set_lr(lr);
    opt.step();
    return loss;
  };
  auto step = compile([&](const Tensor& x, const Tensor& y, double lr) { return step_fn(*comp_model, comp_opt, x, y, lr); },
                      {.name = name});
  const auto data = batches(5, 8, 16, 4, dev);
  for (size_t s = 0; s < data.size(); ++s) {
    const double lr = 0.05 * (1.0 - 0.15 * static_cast<double>(s));  // a schedule: changes every step
    Tensor le = step_fn(*eager_model, eager_opt, data[s].x, data[s].y, lr);
    Tensor lc = step(data[s].x, data[s].y, lr);
    expect_close(lc.to(Device()), le.to(Device()), tol, tol, "loss");
  }
  auto pe = eager_model->named_parameters(), pc = comp_model->named_parameters();
  REQUIRE(pe.size() == pc.size());
  for (size_t i = 0; i < pe.size(); ++i) {
    expect_close(pc[i].second.to(Device()), pe[i].second.to(Device()), tol, tol, pe[i].first);
    REQUIRE(pc[i].second.grad().defined());
    CHECK_FALSE(pc[i].second.grad().is_proxy());
    expect_close(pc[i].second.grad().to(Device()), pe[i].second.grad().to(Device()), tol, tol, pe[i].first + ".grad");
  }
  for (auto& [k, t] : eager_opt.state_dict()) {
    INFO(k);
    auto sc = comp_opt.state_dict();
    REQUIRE(sc.count(k));
    if (k != "lr") expect_close(sc.at(k).to(Device()).to(DType::f32), t.to(Device()).to(DType::f32), tol, tol, k);
  }
  const auto& st = stats_of(name);
  CHECK(st.compiles == 1);
  CHECK(st.hits == static_cast<int64_t>(data.size()) - 1);
  CHECK(st.breaks == 0);
}

TEST_CASE("jit training: a compiled SGD-momentum step equals the eager step", "[jit][training]") {
  check_training<optim::SGD>(
      Device(), [](std::vector<Tensor> p) { return optim::SGD(std::move(p), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3}); },
      "train_sgd_cpu", 1e-5);
}

TEST_CASE("jit training: a compiled AdamW step equals the eager step", "[jit][training]") {
  check_training<optim::AdamW>(
      Device(), [](std::vector<Tensor> p) { return optim::AdamW(std::move(p), {.lr = 0.05, .weight_decay = 1e-2}); },
      "train_adamw_cpu", 1e-4);
}

TEST_CASE("jit training: a compiled training step on sim (tiny chip) equals the eager step", "[jit][training]") {
  testing::TinySim sim;
  check_training<optim::SGD>(
      sim.dev(), [](std::vector<Tensor> p) { return optim::SGD(std::move(p), {.lr = 0.05, .momentum = 0.9}); },
      "train_sgd_sim", 2e-2);
  check_training<optim::AdamW>(
      sim.dev(), [](std::vector<Tensor> p) { return optim::AdamW(std::move(p), {.lr = 0.01}); }, "train_adamw_sim", 2e-2);
}

TEST_CASE("jit training: an SGD step with dampening and no momentum buffers yet is a clear error", "[jit][training]") {
  Tensor w = rnd({3, 2}, 3).requires_grad_();
  optim::SGD opt({w}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1});
  auto step = compile([&](const Tensor& x) {
    opt.zero_grad();
    Tensor l = tpu::matmul(x, w).sum();
    l.backward();
    opt.step();
    return l;
  }, {.name = "train_dampening"});
  CHECK_THROWS_WITH(step(rnd({2, 3}, 4)), Catch::Contains("dampening") && Catch::Contains("eager"));
  CHECK_FALSE(w.grad().is_proxy());  // tracing left no traced tensor behind
}

TEST_CASE("jit training: gradients accumulate across compiled calls, a changed .grad recompiles", "[jit][training]") {
  Tensor w = jit_testing::rnd({4, 3}, 1).requires_grad_();
  Tensor w_ref = w.detach().clone().requires_grad_();
  auto loss_of = [](const Tensor& x, const Tensor& wt) { return tpu::relu(tpu::matmul(x, wt)).sum(); };
  auto f = compile([&](const Tensor& x) {
    Tensor l = loss_of(x, w);
    l.backward();
    return l;
  }, {.name = "train_accumulate"});
  for (int i = 0; i < 3; ++i) {
    Tensor x = rnd({2, 4}, 10 + static_cast<uint64_t>(i));
    loss_of(x, w_ref).backward();
    expect_close(f(x), loss_of(x, w_ref).detach(), 1e-5, 1e-5, "loss");
    expect_close(w.grad(), w_ref.grad(), 1e-5, 1e-5, "grad");
  }
  const auto& st = stats_of("train_accumulate");
  CHECK(st.compiles == 2);  // .grad undefined at the first call, then defined
  REQUIRE(st.reasons.size() == 2);
  CHECK_THAT(st.reasons[1], Catch::Contains(".grad undefined -> defined"));
}

TEST_CASE("jit training: autograd::grad inside a compiled function", "[jit][training]") {
  Tensor w = rnd({4, 3}, 2).requires_grad_();
  auto gradient = [&](const Tensor& x) {
    Tensor t = tpu::tanh(tpu::matmul(x, w));
    Tensor l = (t * t).mean();
    return autograd::grad({l}, {w})[0];
  };
  auto f = compile(gradient, {.name = "train_autograd_grad"});
  for (int i = 0; i < 2; ++i) {
    Tensor x = rnd({5, 4}, 20 + static_cast<uint64_t>(i));
    expect_close(f(x), gradient(x), 1e-5, 1e-6);
  }
  CHECK_FALSE(w.grad().defined());
  CHECK(stats_of("train_autograd_grad").compiles == 1);
}

}  // namespace
}  // namespace tpu
