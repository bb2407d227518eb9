// Deferred eager mode (tpucore/defer.h): when an op that runs eagerly for autograd flushes the
// recording (only when it depends on it), cross_entropy's one flush for its target checks, and
// SGD's in-place update inside a recording. Each result is compared with the same code run plain
// eager (op by op through the eager kernels), and the flushes are counted from jit::stats().
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>

#include "jit_testing.h"
#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/defer.h"
#include "tpucore/nn.h"
#include "tpucore/optim.h"

using namespace tpu;
using tpu::jit_testing::expect_close;
using tpu::jit_testing::rnd;

namespace {

int64_t defer_breaks() {
  const jit::Stats s = jit::stats();
  const auto* st = s.find("eager:defer");
  return st ? st->breaks : 0;
}

Tensor grad_leaf(const Shape& s, uint64_t seed) {
  Tensor w = rnd(s, seed);
  w.requires_grad_();
  return w;
}

}  // namespace

TEST_CASE("defer: an op run eagerly for autograd flushes only when it depends on the recording", "[defer]") {
  const Tensor x = rnd({4, 5}, 21);
  const Tensor w = grad_leaf({4, 5}, 22);
  const Tensor want_a = x * 2.0;  // plain eager references
  const Tensor want_e = w.detach() * 3.0;

  SECTION("independent: the recording stays pending") {
    Tensor a, e;
    {
      DeferredEager guard;
      const int64_t before = defer_breaks();
      a = x * 2.0;  // recorded
      REQUIRE(a.is_proxy());
      e = w * 3.0;  // runs now (w requires grad), reads nothing the recording touches
      CHECK(defer_breaks() == before);
      CHECK(a.is_proxy());
      CHECK_FALSE(e.is_proxy());
      CHECK(e.requires_grad());
    }
    expect_close(a, want_a, 0, 0, "recorded value");
    expect_close(e, want_e, 0, 0, "eager value");
    sum(e).backward();
    expect_close(w.grad(), full_like(w, 3.0), 0, 0, "gradient through the eager op");
  }
  SECTION("a recorded input: flushed first") {
    Tensor e;
    {
      DeferredEager guard;
      const int64_t before = defer_breaks();
      Tensor a = x * 2.0;
      e = w * a;
      CHECK(defer_breaks() == before + 1);
      CHECK_FALSE(a.is_proxy());
    }
    expect_close(e, w.detach() * want_a, 0, 0, "w * recorded value");
  }
  SECTION("real memory the recording writes: flushed first, the eager op sees the write") {
    Tensor r = clone(x), e;
    {
      DeferredEager guard;
      const int64_t before = defer_breaks();
      r.add_(1.0);  // a recorded in-place write to a real tensor
      e = w * r;
      CHECK(defer_breaks() == before + 1);
    }
    expect_close(e, w.detach() * (x + 1.0), 0, 0, "w * (x + 1)");
  }
  SECTION("real memory the recording reads, written in place by the eager op: flushed first") {
    Tensor y = w * 2.0;  // plain eager, requires grad
    Tensor z;
    {
      DeferredEager guard;
      const int64_t before = defer_breaks();
      z = y.detach() * 3.0;  // recorded, reads y's memory
      y.add_(1.0);           // runs eagerly (y requires grad) and writes that memory
      CHECK(defer_breaks() == before + 1);
    }
    expect_close(z, w.detach() * 6.0, 0, 0, "value recorded before the write");
    expect_close(y, w.detach() * 2.0 + 1.0, 0, 0, "written tensor");
  }
}

TEST_CASE("defer: cross_entropy checks a recorded target with one flush", "[defer]") {
  const Tensor logits = grad_leaf({6, 4}, 31);
  const Tensor target = from_vector<int32_t>(std::vector<int32_t>{0, 3, -100, 2, 1, 3}, Shape{6});
  for (nn::Reduction red : {nn::Reduction::mean, nn::Reduction::sum, nn::Reduction::none}) {
    INFO("reduction " << static_cast<int>(red));
    nn::CrossEntropyOptions o;
    o.reduction = red;
    const Tensor want = nn::cross_entropy(logits, target, o).detach();
    Tensor got;
    {
      DeferredEager guard;
      const int64_t before = defer_breaks();
      Tensor t = target * 1;  // recorded: the target itself is a recorded value
      REQUIRE(t.is_proxy());
      got = nn::cross_entropy(logits, t, o);
      CHECK(defer_breaks() == before + 1);  // the recorded target, before the eager target ops
    }
    expect_close(got.detach(), want, 1e-6, 1e-6, "loss");
  }
  // An out-of-range recorded target: the check still reads it and raises at the call.
  DeferredEager guard;
  Tensor bad = from_vector<int32_t>(std::vector<int32_t>{0, 4, 1, 1, 2, 3}, Shape{6}) * 1;
  REQUIRE(bad.is_proxy());
  CHECK_THROWS_WITH(nn::cross_entropy(logits, bad), Catch::Contains("target class indices must be in [0, 4)"));
  guard.flush();  // the runtime stays usable
  Tensor ok = nn::cross_entropy(logits, target);
  CHECK(std::isfinite(ok.item<double>()));
}

TEST_CASE("defer: backward inside a recording flushes it, then runs eagerly", "[defer]") {
  const Tensor w = grad_leaf({3, 4}, 51);
  const Tensor x = rnd({3, 4}, 52);
  Tensor r = clone(x);
  const Tensor want_g = (x + 1.0) * 2.0 * 3.0;  // d/dw sum(gy * (w * (x + 1)) * 3), gy = 2
  {
    DeferredEager guard;
    const int64_t before = defer_breaks();
    r.add_(1.0);                  // recorded write to memory the backward's saved tensor reads
    Tensor y = w * r * 3.0;       // eager (w requires grad): flushes the write first
    Tensor gy = full_like(y, 1.0) * 2.0;  // recorded: a gradient argument still pending
    REQUIRE(gy.is_proxy());
    y.backward(gy);
    CHECK(defer_breaks() == before + 2);
    CHECK_FALSE(gy.is_proxy());
    REQUIRE(w.grad().defined());
    CHECK_FALSE(w.grad().is_proxy());  // computed by the eager backward, not recorded
  }
  expect_close(w.grad(), want_g, 1e-6, 1e-6, "gradient");
}

TEST_CASE("defer: SGD's update inside a recording runs in place, as in eager", "[defer]") {
  Generator g(41);
  const Tensor x = rand({8, 6}, {}, &g);
  const Tensor y = randint(0, 3, {8}, DType::i32, &g);
  Generator ge(42), gd(42);
  nn::MLP me({6, 5, 3}, "relu", 0.0, &ge), md({6, 5, 3}, "relu", 0.0, &gd);
  optim::SGD oe(me.parameters(), {.lr = 0.1, .momentum = 0.9}), od(md.parameters(), {.lr = 0.1, .momentum = 0.9});
  const auto pe = me.parameters(), pd = md.parameters();
  for (int i = 0; i < 3; ++i) {
    oe.zero_grad();
    nn::cross_entropy(me.forward(x), y).backward();
    oe.step();
    std::vector<const void*> mem;
    for (const Tensor& p : pd) mem.push_back(p.storage().get());
    {
      DeferredEager guard;
      const int64_t before = defer_breaks();
      od.zero_grad();
      nn::cross_entropy(md.forward(x), y).backward();
      od.step();
      // No flush: cross_entropy's target ops, the backward and the step run eagerly, and the
      // forward runs eagerly for autograd, so nothing is ever pending.
      CHECK(defer_breaks() == before);
      for (size_t k = 0; k < pd.size(); ++k) {
        CHECK_FALSE(pd[k].is_proxy());
        CHECK_FALSE(pd[k].grad().is_proxy());
      }
      guard.flush();
      CHECK(defer_breaks() == before);
    }
    // Written in place, as eager does: not replaced by a new buffer at a flush.
    for (size_t k = 0; k < pd.size(); ++k) CHECK(pd[k].storage().get() == mem[k]);
    for (size_t k = 0; k < pe.size(); ++k) {
      expect_close(pd[k], pe[k], 1e-6, 1e-6, "parameter " + std::to_string(k));
      expect_close(pd[k].grad(), pe[k].grad(), 1e-6, 1e-6, "gradient " + std::to_string(k));
    }
  }
}
