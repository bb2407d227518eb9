// The compile cache: hits, recompiles with their exact reasons, number arguments as runtime
// inputs, static arguments, captured tensors bound by reference, graph breaks, fullgraph.
#include "jit_testing.h"
#include "tpucore/autograd.h"

namespace tpu {
namespace {
using jit_testing::expect_close;
using jit_testing::rnd;
using jit_testing::stats_of;

TEST_CASE("jit cache: hits and recompiles with the exact reason", "[jit]") {
  auto f = compile([](const Tensor& x) { return relu(x) * 2.0; }, {.name = "cache_reasons"});
  Tensor a = rnd({8, 128}, 1);
  f(a);
  f(a);
  f(rnd({8, 128}, 2));
  {
    const auto& s = stats_of("cache_reasons");
    CHECK(s.compiles == 1);
    CHECK(s.hits == 2);
    REQUIRE(s.reasons.size() == 1);
    CHECK(s.reasons[0] == "first call");
  }
  f(rnd({9, 128}, 3));
  f(rnd({9, 128}, 4).to(DType::bf16));
  f(rnd({9, 128}, 5));  // back to a cached signature: a hit
  const auto& s = stats_of("cache_reasons");
  CHECK(s.compiles == 3);
  CHECK(s.hits == 3);
  REQUIRE(s.reasons.size() == 3);
  CHECK(s.reasons[1] == "arg 0 shape [8, 128] -> [9, 128]");
  CHECK(s.reasons[2] == "arg 0 dtype f32 -> bf16");
}

TEST_CASE("jit cache: float and int arguments are runtime inputs unless static", "[jit]") {
  auto fn = [](const Tensor& x, double lr, int step) { return x * lr + step; };
  auto f = compile(fn, {.name = "runtime_scalars", .verify = 1});
  Tensor x = rnd({4, 4}, 10);
  for (double lr : {0.1, 0.01, 3.5})
    for (int step : {1, 7, 100}) expect_close(f(x, lr, step), fn(x, lr, step));
  CHECK(stats_of("runtime_scalars").compiles == 1);
  CHECK(stats_of("runtime_scalars").hits == 8);

  auto g = compile(fn, {.name = "static_scalars", .static_args = {1}});
  g(x, 0.1, 1);
  g(x, 0.1, 2);   // int still a runtime input
  g(x, 0.2, 2);   // static float changed
  const auto& s = stats_of("static_scalars");
  CHECK(s.compiles == 2);
  REQUIRE(s.reasons.size() == 2);
  CHECK(s.reasons[1] == "arg 1 (static) value 0.1 -> 0.2");
  expect_close(g(x, 0.2, 5), fn(x, 0.2, 5));
}

TEST_CASE("jit cache: a number that shapes the graph becomes static by itself", "[jit]") {
  auto fn = [](const Tensor& x, int n) { return x.narrow(0, 0, n) + 1.0; };
  auto f = compile(fn, {.name = "shape_scalar"});
  Tensor x = rnd({6, 3}, 11);
  expect_close(f(x, 2), fn(x, 2));
  expect_close(f(x, 4), fn(x, 4));
  expect_close(f(x, 2), fn(x, 2));
  CHECK(stats_of("shape_scalar").compiles == 2);
}

TEST_CASE("jit cache: a constant equal to several number arguments is not bound to any", "[jit]") {
  // Three arguments with the value the graph's constant has (in both traces): which one the
  // constant comes from is unknown, so the arguments are static and each call is right.
  auto fn = [](const Tensor& x, double a, double, double) { return x * a; };
  auto f = compile(fn, {.name = "ambiguous_scalars"});
  Tensor x = rnd({3}, 16);
  expect_close(f(x, 1.5, 1.5, 1.5), fn(x, 1.5, 1.5, 1.5), 0, 0);
  expect_close(f(x, 2.5, 1.5, 1.5), fn(x, 2.5, 1.5, 1.5), 0, 0);
  expect_close(f(x, 1.5, 1.5, 4.0), fn(x, 1.5, 1.5, 4.0), 0, 0);
}

TEST_CASE("jit cache: clamp bounds from number arguments are runtime inputs", "[jit]") {
  // The reference is eager clamp (its own kernel); the compiled graph runs maximum/minimum.
  Tensor x = rnd({5, 7}, 31);
  auto both = compile([](const Tensor& t, double lo, double hi) { return clamp(t, lo, hi) * 2.0; },
                      {.name = "clamp_both", .verify = 1});
  const std::vector<std::pair<double, double>> bounds = {{-0.5, 0.5}, {-1.0, 2.0}, {0.3, 0.2}, {0.0, 0.0}};
  for (auto [lo, hi] : bounds) expect_close(both(x, lo, hi), clamp(x, lo, hi) * 2.0, 0, 0);
  CHECK(stats_of("clamp_both").compiles == 1);

  auto lower = compile([](const Tensor& t, double lo) { return clamp(t, lo, std::nullopt); }, {.name = "clamp_min"});
  auto upper = compile([](const Tensor& t, double hi) { return clamp(t, std::nullopt, hi); }, {.name = "clamp_max"});
  auto mixed = compile([](const Tensor& t, double hi) { return clamp(t, 0.0, hi); }, {.name = "clamp_mixed"});
  for (double v : {-0.25, 0.1, 1.5}) {
    expect_close(lower(x, v), clamp(x, v, std::nullopt), 0, 0);
    expect_close(upper(x, v), clamp(x, std::nullopt, v), 0, 0);
    expect_close(mixed(x, v), clamp(x, 0.0, v), 0, 0);
  }
  CHECK(stats_of("clamp_min").compiles == 1);
  CHECK(stats_of("clamp_max").compiles == 1);
  CHECK(stats_of("clamp_mixed").compiles == 1);

  // In a gradient: clamp's backward compares x with the same bounds (wrapped numbers, bound too).
  Tensor w = rnd({5, 7}, 32).requires_grad_();
  auto grad_fn = [&](const Tensor& t, double lo, double hi) {
    return autograd::grad({(clamp(t * w, lo, hi) * t).sum()}, {w})[0];
  };
  auto grad_c = compile(grad_fn, {.name = "clamp_grad"});
  for (auto [lo, hi] : bounds) expect_close(grad_c(x, lo, hi), grad_fn(x, lo, hi), 0, 0);
  CHECK(stats_of("clamp_grad").compiles == 1);

  // A NaN bound makes every element NaN, as eager clamp does.
  const Tensor nan_out = lower(x, std::nan(""));
  for (float v : nan_out.to_vector<float>()) CHECK(std::isnan(v));
  CHECK(stats_of("clamp_min").compiles == 1);

  // An int tensor clamped to float bounds gives f32 either way.
  Tensor xi = tpu::arange(-6, 6, 1, TensorOptions(DType::i32)).reshape({3, 4});
  auto ints = compile([](const Tensor& t, double lo, double hi) { return clamp(t, lo, hi); }, {.name = "clamp_int"});
  for (auto [lo, hi] : bounds) expect_close(ints(xi, lo, hi), clamp(xi, lo, hi), 0, 0);
  CHECK(stats_of("clamp_int").compiles == 1);

  // bf16 clamps compare in f32 with the bound unrounded: that stays a static bound (recompiles).
  Tensor xb = x.to(DType::bf16);
  auto half = compile([](const Tensor& t, double lo) { return clamp(t, lo, std::nullopt); }, {.name = "clamp_bf16"});
  for (double v : {-0.25, 0.1}) expect_close(half(xb, v), clamp(xb, v, std::nullopt), 0, 0);
  CHECK(stats_of("clamp_bf16").compiles == 2);

  // On the simulator: the bounds reach the chip program as runtime scalars.
  const Device sim("sim:0");
  Tensor xs = x.to(sim);
  auto on_sim = compile([](const Tensor& t, double lo, double hi) { return clamp(t, lo, hi); }, {.name = "clamp_sim"});
  for (auto [lo, hi] : bounds) expect_close(on_sim(xs, lo, hi).to(Device("cpu")), clamp(x, lo, hi), 0, 0);
  CHECK(stats_of("clamp_sim").compiles == 1);
}

TEST_CASE("jit cache: captured tensors are bound by reference", "[jit]") {
  Tensor w = rnd({4, 4}, 12);
  auto fn = [&](const Tensor& x) { return matmul(x, w) + 1.0; };
  auto f = compile(fn, {.name = "captured"});
  Tensor x = rnd({3, 4}, 13);
  expect_close(f(x), fn(x), 1e-5, 1e-5);
  w.mul_(wrap_scalar(2.0));  // an optimizer step updates the weight in place
  expect_close(f(x), fn(x), 1e-5, 1e-5);
  CHECK(stats_of("captured").compiles == 1);
}

TEST_CASE("jit cache: item() is a graph break, fullgraph makes it an error", "[jit]") {
  auto fn = [](const Tensor& x) {
    Tensor s = sum(x);
    Tensor y = s.item<double>() > 0 ? x * 2.0 : x - 1.0;  // data-dependent branch
    return exp(y);
  };
  auto f = compile(fn, {.name = "breaks"});
  Tensor pos = abs(rnd({5}, 14)), neg = -abs(rnd({5}, 15));
  expect_close(f(pos), fn(pos));
  expect_close(f(neg), fn(neg));  // same signature, other branch: still right
  expect_close(f(pos), fn(pos));
  const auto& s = stats_of("breaks");
  CHECK(s.breaks == 3);
  REQUIRE(s.break_reasons.size() == 1);
  CHECK_THAT(s.break_reasons[0], Catch::Contains("item()") && Catch::Contains("'sum'"));
  CHECK(s.hits > 0);  // segments are cached across calls

  auto g = compile(fn, {.name = "fullgraph", .fullgraph = true});
  CHECK_THROWS_WITH(g(pos), Catch::Contains("fullgraph") && Catch::Contains("item()"));
  // The failed trace leaves nothing behind: eager code still works afterwards.
  expect_close(exp(pos * 2.0), fn(pos));
}

TEST_CASE("jit cache: warns and keeps counting after many recompiles", "[jit]") {
  auto f = compile([](const Tensor& x) { return x + 1.0; }, {.name = "many", .warn_after_recompiles = 2});
  for (int n = 1; n <= 4; ++n) f(rnd({n}, 16));
  const auto& s = stats_of("many");
  CHECK(s.compiles == 4);
  CHECK(s.reasons[3] == "arg 0 shape [3] -> [4]");
}

TEST_CASE("jit cache: dynamic dims compile once per power-of-two bucket", "[jit]") {
  Tensor w = rnd({16, 16}, 17), g = rnd({16}, 18), b = rnd({16}, 19);
  // Position-wise over the sequence dim (dim 0): padding with zeros and cutting back is exact.
  auto fn = [&](const Tensor& x) { return gelu(matmul(layer_norm(x, Shape{16}, g, b), w)) + x; };
  auto f = compile(fn, {.name = "dynamic_seq", .dynamic = {{0, 0}}, .verify = 1});
  for (int64_t T : {5, 6, 7, 8, 3, 9, 16}) {
    Tensor x = rnd({T, 16}, 20 + static_cast<uint64_t>(T));
    Tensor y = f(x);
    CHECK(y.shape() == Shape{T, 16});
    expect_close(y, fn(x), 1e-4, 1e-4);
  }
  const auto& s = stats_of("dynamic_seq");
  CHECK(s.compiles == 3);  // buckets 8, 4, 16
  CHECK(s.reasons[1] == "arg 0 shape [8, 16] -> [4, 16]");
  // Softmax over the dynamic dim would see the padding: exact sizes are compiled instead.
  auto h = [](const Tensor& x) { return softmax(x, 0); };
  auto fh = compile(h, {.name = "dynamic_unsafe", .dynamic = {{0, 0}}});
  for (int64_t T : {5, 6}) {
    Tensor x = rnd({T, 3}, 40 + static_cast<uint64_t>(T));
    expect_close(fh(x), h(x));
  }
  CHECK(stats_of("dynamic_unsafe").compiles == 2);
}

TEST_CASE("jit cache: bad use gives clear errors", "[jit]") {
  auto f = compile([](const Tensor& x, const Tensor& y) { return x + y; }, {.name = "errors"});
  CHECK_THROWS_WITH(f(rnd({2, 3}, 1), rnd({4}, 2)), Catch::Contains("add") && Catch::Contains("[2, 3]"));
  CHECK_THROWS_WITH(f(Tensor(), rnd({4}, 2)), Catch::Contains("undefined"));
  Tensor kept;
  auto leak = compile([&](const Tensor& x) {
    kept = x * 2.0;
    return x + 1.0;
  });
  leak(rnd({2}, 3));
  CHECK_THROWS_WITH(kept + 1.0, Catch::Contains("traced"));
}

}  // namespace
}  // namespace tpu
