// Defer-and-fuse eager mode (tpucore/defer.h): every chain runs plain eager (the reference: op by
// op through the eager kernels) and inside a DeferredEager scope (recorded, flushed as one graph
// through the jit's passes and executor), and the results must agree.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>

#include "jit_testing.h"
#include "tpucore/autograd.h"
#include "tpucore/defer.h"

using namespace tpu;
using tpu::jit_testing::expect_close;
using tpu::jit_testing::rnd;

namespace {

using Chain = std::function<Tensor(std::vector<Tensor>&)>;

// Runs `f` eagerly and deferred on separate copies of `ins`; compares the result and the
// (possibly written in place) inputs.
void check_chain(const std::string& name, const std::vector<Tensor>& ins, const Chain& f, double tol = 1e-5) {
  INFO(name);
  std::vector<Tensor> a, b;
  for (const Tensor& t : ins) a.push_back(clone(t)), b.push_back(clone(t));
  REQUIRE_FALSE(eager_deferred());
  Tensor want = f(a);
  Tensor got;
  {
    DeferredEager guard;
    REQUIRE(guard.active());
    REQUIRE(eager_deferred());
    got = f(b);
    CHECK(got.is_proxy());  // recorded, not run
  }
  REQUIRE_FALSE(got.is_proxy());  // flushed at the end of the scope
  expect_close(got, want, tol, tol, name);
  for (size_t i = 0; i < ins.size(); ++i) expect_close(b[i], a[i], tol, tol, name + ": input " + std::to_string(i));
}

}  // namespace

TEST_CASE("defer: op chains equal plain eager", "[defer]") {
  Tensor x = rnd({8, 16}, 1), w = rnd({16}, 2), bias = rnd({16}, 3), m = rnd({16, 12}, 4);
  check_chain("gelu(x*w+b)", {x, w, bias}, [](auto& t) { return gelu(t[0] * t[1] + t[2]); });
  check_chain("elementwise mix", {x, w}, [](auto& t) {
    return relu(exp(t[0] * 0.5) - t[1]) / (abs(t[1]) + 1.0) + sigmoid(t[0]);
  });
  check_chain("reductions", {x}, [](auto& t) {
    Tensor s = sum(t[0] * t[0], {1}, true);
    return softmax(t[0] - mean(t[0], {1}, true), 1) + s / 100.0 + amax(t[0], {0});
  });
  check_chain("matmul + epilogue", {x, m, bias}, [](auto& t) {
    return gelu(matmul(t[0], t[1]) + slice(t[2], 0, 0, 12)) * 2.0;
  }, 1e-4);
  check_chain("views", {x}, [](auto& t) {
    Tensor v = transpose(reshape(t[0] + 1.0, {4, 32}), 0, 1);  // [32, 4]
    return narrow(contiguous(v), 0, 3, 10) * slice(v, 0, 0, 10);
  });
  check_chain("type promotion", {x}, [](auto& t) {
    Tensor i = arange(16, TensorOptions(DType::i32));
    return t[0] * i + to(i, DType::f32) / 3.0;
  });
  check_chain("in place on a real input and on a view", {x, w}, [](auto& t) {
    add_(t[0], t[1]);                 // a real tensor captured by the recording: written back
    Tensor y = t[0] * 2.0;
    Tensor row = select(y, 0, 3);     // a view of a recorded value
    mul_(row, t[1]);
    return y;
  });
}

TEST_CASE("defer: reading a value flushes", "[defer]") {
  Tensor x = rnd({4, 5}, 5);
  const double want_sum = sum(relu(x)).item<double>();
  const std::vector<float> want = (relu(x) + 1.0).to_vector<float>();
  jit::reset_stats();
  DeferredEager guard;
  Tensor s = sum(relu(x));
  REQUIRE(s.is_proxy());
  CHECK(s.item<double>() == Approx(want_sum).epsilon(1e-6));  // item() flushes
  CHECK_FALSE(s.is_proxy());
  Tensor y = relu(x) + 1.0;
  REQUIRE(y.is_proxy());
  Tensor h = to(y, Device("cpu"));  // to(device) reads the value
  CHECK_FALSE(y.is_proxy());
  CHECK(h.to_vector<float>() == want);
  Tensor z = x * 0.0 + 7.0;
  REQUIRE(z.is_proxy());
  CHECK(z.str().find("7.") != std::string::npos);  // printing shows values, not "<traced>"
  Tensor u = x + 1.0;
  guard.flush();  // the user synchronizes
  CHECK_FALSE(u.is_proxy());
  const jit::Stats snapshot = jit::stats();
  const auto* st = snapshot.find("eager:defer");
  REQUIRE(st != nullptr);
  CHECK(st->breaks >= 4);
}

TEST_CASE("defer: buffer limit, eager-only ops, loops hit the compile cache", "[defer]") {
  Tensor x = rnd({6, 7}, 6);
  SECTION("limit") {
    Tensor ref = x;
    for (int i = 0; i < 10; ++i) ref = ref * 1.01 + 0.1;
    DeferredEager guard(3);
    Tensor y = x;
    for (int i = 0; i < 10; ++i) y = y * 1.01 + 0.1;  // flushed every 3 ops on the way
    guard.flush();
    expect_close(y, ref);
  }
  SECTION("random and autograd ops run eagerly, in order") {
    Generator g1(7), g2(7);
    Tensor p = rnd({7}, 8);
    p.requires_grad_();
    Tensor want_r = randn({6, 7}, {}, &g1) + x;
    Tensor want_l = sum((x + 1.0) * p);
    want_l.backward();
    Tensor q = rnd({7}, 8);
    q.requires_grad_();
    DeferredEager guard;
    Tensor r = randn({6, 7}, {}, &g2) + x;
    Tensor l = sum((x + 1.0) * q);  // x + 1 is recorded; the product with q runs eagerly
    l.backward();
    guard.flush();
    expect_close(r, want_r);
    expect_close(l, want_l);
    REQUIRE(q.grad().defined());
    expect_close(q.grad(), p.grad());
  }
  SECTION("loop") {
    Tensor w = rnd({7}, 9), b = rnd({7}, 10);
    jit::reset_stats();
    for (int i = 0; i < 5; ++i) {
      Tensor want = gelu(x * w + b);
      Tensor got;
      {
        DeferredEager guard;
        got = gelu(x * w + b);
      }
      expect_close(got, want);
      x = want;  // a new input tensor each round: same graph structure
    }
    const jit::Stats snapshot = jit::stats();
  const auto* st = snapshot.find("eager:defer");
    REQUIRE(st != nullptr);
    CHECK(st->compiles == 1);
    CHECK(st->hits == 4);
  }
}

TEST_CASE("defer: errors", "[defer]") {
  Tensor x = rnd({4, 3}, 11);
  SECTION("argument errors are raised at the call, as in eager") {
    DeferredEager guard;
    CHECK_THROWS_WITH(matmul(x, x), Catch::Contains("matmul"));
    Tensor y = x + 1.0;  // still usable
    CHECK(sum(y).item<double>() == Approx(sum(x).item<double>() + 12.0).epsilon(1e-6));
  }
  SECTION("value errors are raised at the flush, naming the op") {
    Tensor idx = from_vector<int64_t>({0, 1, 2, 3}, Shape{4, 1});
    Tensor bad;
    {
      DeferredEager guard;
      bad = gather(x, 1, idx * 2);  // index 4 and 6 are out of range for 3 columns
      CHECK_THROWS_WITH(guard.flush(), Catch::Contains("gather") && Catch::Contains("flush"));
      CHECK_THROWS_WITH(bad.to_vector<float>(), Catch::Contains("finished trace"));
      Tensor ok = x * 2.0;  // the runtime stays usable
      CHECK(sum(ok).item<double>() == Approx(2.0 * sum(x).item<double>()).epsilon(1e-6));
    }
    // The error of a flush at the end of the scope propagates from the guard.
    auto scope = [&] {
      DeferredEager guard;
      bad = gather(x, 1, idx * 2);
    };
    CHECK_THROWS_WITH(scope(), Catch::Contains("gather"));
    CHECK_FALSE(eager_deferred());
    CHECK(sum(x * 1.0).item<double>() == Approx(sum(x).item<double>()));
  }
  SECTION("nested guards and guards inside compile do nothing") {
    DeferredEager outer;
    DeferredEager inner;
    CHECK(outer.active());
    CHECK_FALSE(inner.active());
  }
}

// Runs only in the ctest "core: defer env mode" (TPU_EAGER=defer): the whole thread records.
TEST_CASE("defer: TPU_EAGER=defer records every op of the thread", "[.defer-env]") {
  REQUIRE(eager_defer_env());
  std::vector<float> xs(24);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = 0.25f * static_cast<float>(i) - 3.0f;
  Tensor x = from_vector<float>(xs, Shape{4, 6});
  REQUIRE(eager_deferred());
  DeferredEager nested;  // already deferred: the guard does nothing
  CHECK_FALSE(nested.active());
  jit::reset_stats();
  for (int round = 0; round < 3; ++round) {
    Tensor y = relu(x * 2.0 + 1.0) - x;
    CHECK(y.is_proxy());
    const std::vector<float> got = y.to_vector<float>();  // flushes
    REQUIRE(got.size() == xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {  // naive reference
      const float r = std::max(xs[i] * 2.0f + 1.0f, 0.0f) - xs[i];
      CHECK(got[i] == Approx(r).margin(1e-6));
    }
  }
  Tensor z = x + 1.0;
  flush_deferred();
  CHECK_FALSE(z.is_proxy());
  const jit::Stats snapshot = jit::stats();
  const auto* st = snapshot.find("eager:defer");
  REQUIRE(st != nullptr);
  CHECK(st->hits >= 2);  // rounds 2 and 3 reuse round 1's graph
}

// Host access and aliasing under a scoped guard; references are plain loops over the input values.
TEST_CASE("defer: host access, compiled calls, aliases and views keep eager semantics", "[defer]") {
  const std::vector<float> xs = rnd({3, 4}, 21).to_vector<float>();
  SECTION("data() reads a recorded value; a raw write waits for the recorded reads") {
    Tensor x = from_vector<float>(xs, Shape{3, 4});
    DeferredEager guard;
    Tensor y = x * 2.0;
    REQUIRE(y.is_proxy());
    const float* py = y.data<float>();  // flushes
    CHECK_FALSE(y.is_proxy());
    for (size_t i = 0; i < xs.size(); ++i) CHECK(py[i] == 2.0f * xs[i]);
    Tensor z = x + 1.0;               // recorded: reads x
    x.data<float>()[0] = 100.0f;      // flushes first, so z keeps the old x[0]
    CHECK(z.to_vector<float>()[0] == xs[0] + 1.0f);
    add_(x, full({3, 4}, 1.0));       // a recorded write into real x
    CHECK(x.data<float>()[0] == 101.0f);  // the raw read sees it
    CHECK(x.data<float>()[1] == xs[1] + 1.0f);
  }
  SECTION("equal and allclose read recorded values") {
    Tensor x = from_vector<float>(xs, Shape{3, 4});
    DeferredEager guard;
    Tensor a = x * 3.0, b = x + x + x;
    CHECK(allclose(a, b, 1e-6, 1e-6));
    Tensor c = clone(x);
    CHECK(equal(c, x));
    x.fill_(0.5);                     // recorded write; equal must see it
    CHECK(equal(x, full({3, 4}, 0.5)));
  }
  SECTION("a compiled function gets real arguments and sees recorded writes into what it captures") {
    Tensor w = from_vector<float>(xs, Shape{3, 4});
    auto f = compile([&w](const Tensor& t) { return t * w; }, {.name = "defer_compiled_call"});
    DeferredEager guard;
    Tensor t = full({3, 4}, 2.0) + 1.0;  // a recorded argument
    mul_(w, full({3, 4}, 2.0));          // a recorded write into the captured tensor
    Tensor r = f(t);
    const std::vector<float> got = r.to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) CHECK(got[i] == Approx(3.0 * 2.0 * xs[i]));
  }
  SECTION("detach() of a recorded value is filled at the flush too") {
    Tensor x = from_vector<float>(xs, Shape{3, 4});
    Tensor d;
    {
      DeferredEager guard;
      Tensor y = x - 1.0;
      d = y.detach();
    }
    REQUIRE_FALSE(d.is_proxy());
    const std::vector<float> got = d.to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) CHECK(got[i] == xs[i] - 1.0f);
  }
  SECTION("writes through one real view are seen through another view of the same memory") {
    Tensor x = from_vector<float>(xs, Shape{3, 4});
    auto rows = split(x, 1, 0);          // real views of x
    DeferredEager guard;
    rows[1].fill_(-1.0);                 // recorded write into a view
    Tensor s = x.select(0, 1) * 2.0;     // x is another view of that memory: flushed before
    Tensor r0 = rows[0] + 0.0;
    const std::vector<float> got = s.to_vector<float>(), got0 = r0.to_vector<float>();
    for (float v : got) CHECK(v == -2.0f);
    for (size_t i = 0; i < 4; ++i) CHECK(got0[i] == xs[i]);
  }
}

TEST_CASE("defer: a copy that records no op and a write of several ops under a tiny limit", "[defer]") {
  const std::vector<float> xs = rnd({2, 6}, 31).to_vector<float>();
  SECTION("copy_ of equal shape and dtype into a real view, then another view is read") {
    Tensor x = from_vector<float>(xs, Shape{2, 6});
    Tensor left = x.narrow(1, 0, 3);     // a real view, made before the recording
    Tensor src = full({2, 3}, 9.0);
    DeferredEager guard;
    left.copy_(src);                     // only a write-back is recorded (no op)
    const std::vector<float> got = (x * 1.0).to_vector<float>();
    for (size_t r = 0; r < 2; ++r)
      for (size_t c = 0; c < 6; ++c) CHECK(got[r * 6 + c] == (c < 3 ? 9.0f : xs[r * 6 + c]));
  }
  SECTION("a broadcast, casting write into a view is not split by the op limit") {
    Tensor x = from_vector<float>(xs, Shape{2, 6});
    DeferredEager guard(1);              // flush after every op, but not inside one write
    Tensor row = x.select(0, 1);
    row.copy_(from_vector<int32_t>({7}, Shape{1}));  // cast and broadcast, then the scatter into x
    guard.flush();
    const std::vector<float> got = x.to_vector<float>();
    for (size_t c = 0; c < 6; ++c) {
      CHECK(got[c] == xs[c]);
      CHECK(got[6 + c] == 7.0f);
    }
  }
}
