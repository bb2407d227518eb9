// nn modules and losses: parameter naming, state dicts and their errors, train/eval, device
// moves, layers against manual formulas, losses against double-precision loops.
#include "testing.h"
#include "tpucore/nn.h"

namespace tpu::testing {
namespace {

struct Block : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::LayerNorm> norm;
  Tensor scale = ones({4});
  Tensor steps = zeros({1}, DType::i32);
  Block() {
    fc = register_module("fc", std::make_shared<nn::Linear>(3, 4));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{4}));
    register_parameter("scale", scale);
    register_buffer("steps", steps);
  }
  Tensor forward(const Tensor& x) override { return mul(norm->forward(fc->forward(x)), scale); }
  std::string type_name() const override { return "Block"; }
};

}  // namespace

TEST_CASE("nn: named parameters, buffers, state_dict round trip", "[nn]") {
  Block b;
  std::vector<std::string> names;
  for (auto& [n, p] : b.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"scale", "fc.weight", "fc.bias", "norm.weight", "norm.bias"});
  CHECK(b.num_parameters() == 4 + 12 + 4 + 4 + 4);
  for (const Tensor& p : b.parameters()) CHECK((p.requires_grad() && p.is_leaf()));
  nn::StateDict sd = b.state_dict();
  CHECK(sd.size() == 6);
  CHECK(sd.count("steps"));
  Block c;
  c.load_state_dict(sd);
  CHECK(equal(c.fc->weight, b.fc->weight));
  CHECK(c.fc->weight.requires_grad());
  Tensor x = randn({2, 3});
  CHECK(allclose(c.forward(x), b.forward(x)));
}

TEST_CASE("nn: load_state_dict errors name the keys and shapes", "[nn]") {
  Block b;
  nn::StateDict sd = b.state_dict();
  nn::StateDict missing = sd;
  missing.erase("fc.bias");
  expect_error([&] { b.load_state_dict(missing); }, {"missing keys [fc.bias]"});
  b.load_state_dict(missing, false);  // non-strict: loads the rest
  nn::StateDict extra = sd;
  extra["fc.gain"] = ones({4});
  expect_error([&] { b.load_state_dict(extra); }, {"unexpected keys [fc.gain]"});
  nn::StateDict wrong = sd;
  wrong["fc.weight"] = ones({3, 4});
  expect_error([&] { b.load_state_dict(wrong); }, {"fc.weight", "[3, 4]", "[4, 3]"});
}

TEST_CASE("nn: train/eval, zero_grad, dropout, to(device)", "[nn]") {
  auto mlp = std::make_shared<nn::MLP>(std::vector<int64_t>{6, 8, 3}, "gelu", 0.5);
  CHECK(mlp->size() == 4);  // linear, gelu, dropout, linear
  CHECK(mlp->is_training());
  mlp->eval();
  CHECK_FALSE((*mlp)[2].is_training());
  Tensor x = randn({5, 6});
  CHECK(equal(mlp->forward(x), mlp->forward(x)));  // dropout off in eval
  mlp->train();
  sum(mlp->forward(x)).backward();
  for (const Tensor& p : mlp->parameters()) CHECK(p.grad().defined());
  mlp->zero_grad();
  for (const Tensor& p : mlp->parameters()) CHECK_FALSE(p.grad().defined());

  nn::Dropout d(0.25);
  Tensor y = d.forward(ones({100000}));
  const auto v = dvals(y);
  int64_t zeros_n = 0;
  for (double e : v) {
    if (e == 0) ++zeros_n;
    else CHECK(e == Approx(1 / 0.75));
  }
  CHECK(std::fabs(static_cast<double>(zeros_n) / 100000.0 - 0.25) < 0.01);
  expect_error([] { nn::Dropout(1.5); }, {"Dropout", "1.5"});

  Block b;
  b.to(Device("sim:0"));
  CHECK(b.fc->weight.device() == Device("sim:0"));
  CHECK(b.fc->weight.requires_grad());
  Tensor out = b.forward(randn({2, 3}).to(Device("sim:0")));
  sum(out).backward();
  CHECK(b.fc->weight.grad().device() == Device("sim:0"));
}

TEST_CASE("nn: Linear, Embedding, norms match their formulas", "[nn]") {
  nn::Linear lin(3, 2);
  Tensor x = randn({4, 3});
  CHECK(allclose(lin.forward(x), add(matmul(x, lin.weight.t()), lin.bias), 1e-5, 1e-5));
  // PyTorch's default init bound 1/sqrt(in_features)
  CHECK(amax(abs(lin.weight)).item<double>() <= 1 / std::sqrt(3.0));
  expect_error([&] { lin.forward(randn({4, 5})); }, {"Linear", "3 features", "[4, 5]"});
  nn::Embedding emb(10, 4);
  Tensor idx = from_vector(std::vector<int32_t>{3, 3, 7}, Shape{3});
  Tensor e = emb.forward(idx);
  CHECK(equal(e.select(0, 2), emb.weight.select(0, 7)));
  sum(e).backward();
  check_near(emb.weight.grad().select(0, 3), {2, 2, 2, 2});
  nn::RMSNorm rms(Shape{4}, 1e-6);
  Tensor r = rms.forward(from_vector(std::vector<float>{1, 2, 3, 4}, Shape{1, 4}));
  const double s = std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
  check_near(r, {1 / s, 2 / s, 3 / s, 4 / s});
}

TEST_CASE("nn: cross_entropy with label smoothing and ignore_index matches a double reference", "[nn]") {
  Generator g(5);
  const int64_t n = 6, c = 5;
  Tensor logits = randn({n, c}, {}, &g).requires_grad_();
  std::vector<int32_t> t = {0, 4, 2, -100, 1, 4};
  Tensor target = from_vector(t, Shape{n});
  const auto lv = dvals(logits);
  for (double eps : {0.0, 0.1}) {
    INFO("label_smoothing " << eps);
    double total = 0;
    int count = 0;
    std::vector<double> grad(static_cast<size_t>(n * c), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      if (t[static_cast<size_t>(i)] == -100) continue;
      double mx = -1e30, se = 0;
      for (int64_t j = 0; j < c; ++j) mx = std::max(mx, lv[static_cast<size_t>(i * c + j)]);
      for (int64_t j = 0; j < c; ++j) se += std::exp(lv[static_cast<size_t>(i * c + j)] - mx);
      const double lse = mx + std::log(se);
      double li = 0;
      for (int64_t j = 0; j < c; ++j) {
        const double q = (j == t[static_cast<size_t>(i)] ? 1 - eps : 0) + eps / c;
        li -= q * (lv[static_cast<size_t>(i * c + j)] - lse);
      }
      total += li;
      ++count;
    }
    for (int64_t i = 0; i < n; ++i) {
      if (t[static_cast<size_t>(i)] == -100) continue;
      double mx = -1e30, se = 0;
      for (int64_t j = 0; j < c; ++j) mx = std::max(mx, lv[static_cast<size_t>(i * c + j)]);
      for (int64_t j = 0; j < c; ++j) se += std::exp(lv[static_cast<size_t>(i * c + j)] - mx);
      for (int64_t j = 0; j < c; ++j) {
        const double p = std::exp(lv[static_cast<size_t>(i * c + j)] - mx) / se;
        const double q = (j == t[static_cast<size_t>(i)] ? 1 - eps : 0) + eps / c;
        grad[static_cast<size_t>(i * c + j)] = (p - q) / count;
      }
    }
    logits.set_grad(Tensor());
    Tensor loss = nn::cross_entropy(logits, target, {.label_smoothing = eps});
    check_near(loss, {total / count});
    loss.backward();
    check_near(logits.grad(), grad, 1e-4);
    Tensor sum_loss = nn::cross_entropy(logits, target, {.label_smoothing = eps, .reduction = nn::Reduction::sum});
    check_near(sum_loss, {total});
  }
  Tensor none = nn::cross_entropy(logits, target, {.reduction = nn::Reduction::none});
  CHECK(none.shape() == Shape{n});
  CHECK(dvals(none)[3] == 0.0);
  Tensor nll = nn::nll_loss(log_softmax(logits, 1), target);
  CHECK(allclose(nll, nn::cross_entropy(logits, target), 1e-5, 1e-6));
  expect_error([&] { nn::cross_entropy(logits, from_vector(std::vector<int32_t>{0, 1}, Shape{2})); },
               {"cross_entropy", "[2]", "[6, 5]"});
  expect_error([&] { nn::cross_entropy(logits, full({n}, 7, DType::i32)); }, {"cross_entropy", "[0, 5)", "7"});
  expect_error([&] { nn::cross_entropy(logits, ones({n})); }, {"cross_entropy", "integer"});
}

TEST_CASE("nn: mse_loss and its gradient", "[nn]") {
  Tensor a = from_vector(std::vector<float>{1, 2, 3}).requires_grad_();
  Tensor b = from_vector(std::vector<float>{0, 2, 5});
  Tensor l = nn::mse_loss(a, b);
  check_near(l, {(1 + 0 + 4) / 3.0});
  l.backward();
  check_near(a.grad(), {2.0 / 3, 0, -4.0 / 3});
  check_near(nn::mse_loss(a, b, nn::Reduction::sum), {5});
  expect_error([&] { nn::mse_loss(a, ones({2})); }, {"mse_loss", "[3]", "[2]"});
}

}  // namespace tpu::testing
