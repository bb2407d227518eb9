// Defer-and-fuse eager mode (tpucore/defer.h) on what its benchmarks run: intermediates that the
// user keeps (they must be filled at the flush, with the values plain eager gives them) or drops,
// and whole training steps (forward, cross_entropy, backward, optimizer step), each compared with
// the same code run plain eager (op by op through the eager kernels: another code path).
#include <catch2/catch.hpp>

#include <memory>

#include "jit_testing.h"
#include "tpucore/defer.h"
#include "tpucore/nn.h"
#include "tpucore/optim.h"

using namespace tpu;
using tpu::jit_testing::expect_close;
using tpu::jit_testing::rnd;

TEST_CASE("defer: intermediates the user keeps are filled, dropped ones need not be", "[defer]") {
  const Tensor x = rnd({6, 32}, 11), w = rnd({32}, 12), b = rnd({32}, 13);
  // Plain eager references, op by op.
  const Tensor want_h = x * w;
  const Tensor want_hb = want_h + b;
  const Tensor want_y = gelu(want_hb);

  Tensor h, y, y2;
  {
    DeferredEager guard;
    h = x * w;           // kept by the user
    y = gelu(h + b);     // h + b is a temporary: dead before the flush
    y2 = gelu(x * w + b);  // every intermediate dead
    CHECK(h.is_proxy());
    CHECK(y.is_proxy());
  }
  REQUIRE_FALSE(h.is_proxy());
  REQUIRE_FALSE(y.is_proxy());
  expect_close(h, want_h, 0, 0, "kept intermediate x * w");
  expect_close(y, want_y, 1e-6, 1e-6, "result with a kept intermediate");
  expect_close(y2, want_y, 1e-6, 1e-6, "result with dead intermediates");

  // A kept intermediate stays an ordinary tensor after the flush: later ops (recorded again)
  // and in-place writes to it behave as in eager, and the result it fed is not disturbed.
  Tensor z;
  {
    DeferredEager guard;
    h.mul_(2.0);
    z = h + y;
  }
  expect_close(h, want_h * 2.0, 0, 0, "kept intermediate written in place");
  expect_close(z, want_h * 2.0 + want_y, 1e-6, 1e-6, "ops on a kept intermediate");
  expect_close(y, want_y, 1e-6, 1e-6, "result after its input was written");

  // Read in the middle of a recording (item() flushes): the value read and the later result.
  {
    DeferredEager guard;
    Tensor s = sum(x * w);
    const double got = s.item<double>();
    CHECK(got == Approx(sum(want_h).item<double>()).epsilon(1e-5));
    Tensor t = s * 2.0 + 1.0;
    CHECK(t.item<double>() == Approx(2.0 * got + 1.0).epsilon(1e-6));
  }
}

namespace {

// The benchmark's training step (bench/bench_defer.cpp, smaller): an MLP, cross_entropy,
// backward and the optimizer step.
struct Run {
  Generator g{7};
  nn::MLP model{{20, 16, 5}, "relu", 0.0, &g};
  std::unique_ptr<optim::Optimizer> opt;
  explicit Run(bool adamw) {
    if (adamw) opt = std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions{.lr = 0.01});
    else opt = std::make_unique<optim::SGD>(model.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  }
  double step(const Tensor& x, const Tensor& y) {
    opt->zero_grad();
    Tensor loss = nn::cross_entropy(model.forward(x), y);
    loss.backward();
    opt->step();
    return loss.item<double>();
  }
};

}  // namespace

TEST_CASE("defer: training steps equal plain eager (SGD with momentum, AdamW)", "[defer]") {
  Generator g(8);
  const Tensor x = rand({12, 20}, {}, &g);
  const Tensor y = randint(0, 5, {12}, DType::i32, &g);
  for (bool adamw : {false, true}) {
    INFO((adamw ? "AdamW" : "SGD with momentum"));
    Run eager(adamw), deferred(adamw);
    for (int i = 0; i < 4; ++i) {
      const double want = eager.step(x, y);
      double got;
      {
        DeferredEager guard;
        got = deferred.step(x, y);  // item() flushes the forward's recording mid-step
      }  // the backward and SGD's step ran eagerly; AdamW's step is flushed here
      CHECK(got == Approx(want).epsilon(1e-5));
    }
    const auto pe = eager.model.parameters(), pd = deferred.model.parameters();
    REQUIRE(pe.size() == pd.size());
    for (size_t i = 0; i < pe.size(); ++i) {
      REQUIRE_FALSE(pd[i].is_proxy());
      expect_close(pd[i], pe[i], 1e-5, 1e-5, "parameter " + std::to_string(i));
      expect_close(pd[i].grad(), pe[i].grad(), 1e-5, 1e-5, "gradient " + std::to_string(i));
    }
    // The optimizer state written back at the flush (momentum buffers / moments) is what the
    // next eager step reads: one more step outside the scope still agrees.
    CHECK(deferred.step(x, y) == Approx(eager.step(x, y)).epsilon(1e-5));
    for (size_t i = 0; i < pe.size(); ++i) expect_close(pd[i], pe[i], 1e-5, 1e-5, "parameter after an eager step");
  }
}

TEST_CASE("defer: tensors made by recordings that hit the same cached segment do not share memory", "[defer]") {
  // ones(n) alone records a graph the passes fold to a constant; every flush of it hits the
  // same cached segment. Each result must be its own tensor (a model's norm weights are made so,
  // then loaded in place one by one).
  Tensor a, b, c;
  {
    DeferredEager guard(1);  // one op per flush
    a = ones({8});
    b = ones({8});
    c = ones({8}) * 1.0;
  }
  REQUIRE_FALSE(a.is_proxy());
  a.mul_(3.0);
  b.copy_(arange(8, TensorOptions(DType::f32)));
  std::vector<float> want_a(8, 3.0f), want_b(8), want_c(8, 1.0f);
  for (int i = 0; i < 8; ++i) want_b[static_cast<size_t>(i)] = static_cast<float>(i);
  CHECK(a.to_vector<float>() == want_a);
  CHECK(b.to_vector<float>() == want_b);
  CHECK(c.to_vector<float>() == want_c);
  Tensor d;
  {
    DeferredEager guard;
    d = ones({8});
  }
  CHECK(d.to_vector<float>() == want_c);  // the cached segment's constant is unchanged
}
