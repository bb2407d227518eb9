// Compile hardening: a value-dependent output shape inside tpu::compile (one_hot with
// num_classes = -1) is a graph break that names its cause, as item() is (fullgraph makes it an
// error); tensor arguments that require grad are differentiable inside the function.
// References are written by hand.
#include "jit_testing.h"
#include "testing.h"
#include "tpucore/autograd.h"

namespace tpu::testing {

TEST_CASE("hardening: one_hot(x, -1) inside compile is a graph break naming its cause (item 7)", "[hardening][jit]") {
  auto fn = [](const Tensor& x) { return tpu::one_hot(x + 1, -1) * 2; };
  auto f = tpu::compile(fn, {.name = "h7_one_hot"});
  for (const std::vector<int32_t>& xv : {std::vector<int32_t>{0, 2, 1, 4}, std::vector<int32_t>{0, 0, 7, 1}}) {
    int32_t mx = 0;
    for (int32_t v : xv) mx = std::max(mx, v);
    const Tensor got = f(tpu::from_vector(xv, {4}));
    REQUIRE(got.shape() == Shape({4, mx + 2}));
    const std::vector<int32_t> g = got.to_vector<int32_t>();
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < mx + 2; ++c) CHECK(g[size_t(i * (mx + 2) + c)] == (c == xv[size_t(i)] + 1 ? 2 : 0));
  }
  const jit::FunctionStats& s = jit_testing::stats_of("h7_one_hot");
  CHECK(s.breaks >= 1);
  REQUIRE(!s.break_reasons.empty());
  CHECK_THAT(s.break_reasons[0], Catch::Contains("one_hot") && Catch::Contains("num_classes = -1"));
  auto strict = tpu::compile(fn, {.name = "h7_one_hot_fullgraph", .fullgraph = true});
  CHECK_THROWS_WITH(strict(tpu::from_vector(std::vector<int32_t>{1, 2}, {2})),
                    Catch::Contains("fullgraph") && Catch::Contains("one_hot"));
  // Eager code still works afterwards.
  CHECK(tpu::one_hot(tpu::from_vector(std::vector<int32_t>{1, 0}, {2}), -1).shape() == Shape({2, 2}));
}

TEST_CASE("hardening: gradients with respect to arguments of a compiled function (item 8)", "[hardening][jit]") {
  Tensor x = jit_testing::rnd({3, 4}, 21), z = jit_testing::rnd({3, 4}, 22);
  const std::vector<float> xv = x.to_vector<float>(), zv = z.to_vector<float>();
  x.requires_grad_();
  z.requires_grad_();
  auto expect = [](const Tensor& got, const std::vector<float>& base, double k, int power, const char* what) {
    INFO(what);
    REQUIRE(got.defined());
    const std::vector<float> g = got.to_vector<float>();
    REQUIRE(g.size() == base.size());
    for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(k * std::pow(base[i], power)).epsilon(1e-5).margin(1e-6));
  };
  // autograd::grad inside the function, with respect to its argument: d/dt sum(t^3) = 3 t^2.
  auto dcube = tpu::compile(
      [](const Tensor& t) {
        Tensor y = (t * t * t).sum();
        return autograd::grad({y}, {t})[0];
      },
      {.name = "h8_grad"});
  for (int call = 0; call < 2; ++call) expect(dcube(x), xv, 3, 2, "autograd::grad wrt the argument");
  CHECK(!x.grad().defined());  // autograd::grad does not accumulate
  // backward() inside the function: the argument's .grad accumulates as in eager (2 t per call).
  auto step = tpu::compile(
      [](const Tensor& t) {
        Tensor y = (t * t).sum();
        y.backward();
        return y.detach();
      },
      {.name = "h8_backward"});
  (void)step(x);
  expect(x.grad(), xv, 2, 1, "x.grad after one call");
  (void)step(x);
  expect(x.grad(), xv, 4, 1, "x.grad after two calls");
  (void)step(z);  // same signature, another tensor: its own .grad, x's unchanged
  expect(z.grad(), zv, 2, 1, "z.grad");
  expect(x.grad(), xv, 4, 1, "x.grad after the call on z");
}

}  // namespace tpu::testing
