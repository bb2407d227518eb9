// In-place ops inside compiled functions (functionalization): the compiled result and every
// tensor written in place equal eager execution of the same function on copies; unsupported
// writes are a tpu::Error. Also grad mode as part of the cache key.
#include "codegen_testing.h"
#include "jit_testing.h"
#include "tpucore/autograd.h"

namespace tpu {
namespace {
using namespace jit_testing;

// Runs fn eagerly on clones and compiled on the originals, `calls` times; compares the results
// and the arguments after each call.
template <class F>
void check_vs_eager(F fn, std::vector<Tensor> args, int calls, const std::string& name, int compiles = 1) {
  std::vector<Tensor> eager_args;
  for (const Tensor& a : args) eager_args.push_back(a.clone());
  auto cf = compile(fn, {.name = name, .verify = 1});
  for (int c = 0; c < calls; ++c) {
    std::vector<Tensor> want = fn(eager_args);
    std::vector<Tensor> got = cf(args);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], want[i], 1e-6, 1e-6, name + " output " + std::to_string(i));
    for (size_t i = 0; i < args.size(); ++i) expect_close(args[i], eager_args[i], 1e-6, 1e-6, name + " arg " + std::to_string(i));
  }
  if (compiles > 0) CHECK(stats_of(name).compiles == compiles);
}

TEST_CASE("jit inplace: writes on intermediates and on arguments match eager", "[jit][inplace]") {
  auto fn = [](const std::vector<Tensor>& a) {
    Tensor x = a[0], y = a[1];
    Tensor h = x * 2.0;
    h.add_(y);
    h.mul_(h);
    relu_(h.add_(-3.0));
    Tensor k = h.clone();
    k.div_(tpu::abs(y) + 1.0);
    x.add_(k);  // an argument written in place
    Tensor z = tpu::zeros({3, 4});
    z.copy_(y.narrow(0, 0, 1));  // broadcast copy
    z.fill_(0.5);
    z.add_(h);
    return std::vector<Tensor>{h, k, z};
  };
  check_vs_eager(fn, {rnd({3, 4}, 1), rnd({3, 4}, 2)}, 3, "inplace_basic");
}

TEST_CASE("jit inplace: writes through views reach their base, and views see writes to the base", "[jit][inplace]") {
  auto fn = [](const std::vector<Tensor>& a) {
    Tensor y = a[0] * 1.0;
    Tensor v = y.t();                      // a view of y, kept
    y.narrow(0, 1, 2).mul_(10.0);          // write through a slice
    y.select(1, 2).fill_(-1.0);            // through a select
    v.select(0, 0).add_(a[1].select(0, 0));  // through a view of the transposed view
    Tensor r = y.reshape({4, 3});
    r.add_(-0.25);                         // through a reshape (covers y in order)
    a[0].narrow(1, 0, 2).zero_();          // an argument written through a view
    Tensor c = v.reshape({12});            // a transposed view cannot be viewed flat: eager copies
    c.add_(100.0);                         // so this write must not reach y
    Tensor u = y.narrow(0, 0, 2).reshape({8});  // rows of y: a view, written through
    u.mul_(-1.0);
    y.contiguous().add_(0.5);              // contiguous() of a contiguous tensor aliases it
    Tensor d = v.contiguous();             // of a transposed view it copies
    d.add_(7.0);
    a[1].contiguous().mul_(3.0);           // an argument (contiguous): aliases
    return std::vector<Tensor>{y, v, r + 0.0, c + 0.0, d};
  };
  check_vs_eager(fn, {rnd({3, 4}, 3), rnd({4, 3}, 4)}, 2, "inplace_views");
}

TEST_CASE("jit inplace: captured weights updated in place are written back on every call", "[jit][inplace]") {
  Tensor w = rnd({4, 3}, 5), w_eager = w.clone();
  Tensor b = rnd({3}, 6), b_eager = b.clone();
  auto step = [](Tensor& w_, Tensor& b_, const Tensor& x) {
    Tensor y = tpu::matmul(x, w_) + b_;
    w_.sub_(tpu::matmul(x.t(), y) * 0.01);
    b_.narrow(0, 0, 2).mul_(0.5);
    return y;
  };
  auto f = compile([&](const Tensor& x) { return step(w, b, x); }, {.name = "inplace_weights", .verify = 1});
  for (int i = 0; i < 4; ++i) {
    Tensor x = rnd({2, 4}, 10 + static_cast<uint64_t>(i));
    expect_close(f(x), step(w_eager, b_eager, x), 1e-5, 1e-6, "output");
    expect_close(w, w_eager, 1e-5, 1e-6, "w");
    expect_close(b, b_eager, 1e-5, 1e-6, "b");
  }
  CHECK(stats_of("inplace_weights").compiles == 1);
  CHECK(stats_of("inplace_weights").hits == 3);
}

TEST_CASE("jit inplace: a written argument returned is the caller's tensor", "[jit][inplace]") {
  auto f = compile([](const Tensor& x) {
    Tensor t = x;
    t.mul_(3.0);
    return std::make_tuple(t, t.t());
  }, {.name = "inplace_return"});
  Tensor x = rnd({2, 3}, 7), ref = x * 3.0;
  auto [r, rt] = f(x);
  CHECK(r.is_same(x));
  expect_close(x, ref);
  rt.add_(1.0);  // a real view of x
  expect_close(x, ref + 1.0);
}

TEST_CASE("jit inplace: outputs that are graph constants are new tensors at every call", "[jit][inplace]") {
  // ones(n) does not depend on the input: the optimizer folds it into a constant of the cached
  // graph. Each call must still return its own tensor, as eager does, so that a write to one
  // call's result reaches neither the next call's result nor the cached graph.
  auto f = compile([](const Tensor& x) { return std::make_tuple(ones({4}), x + 1.0); }, {.name = "const_output"});
  const Tensor x = rnd({4}, 8);
  auto [a, ya] = f(x);
  a.mul_(5.0);
  auto [b, yb] = f(x);
  CHECK(a.storage() != b.storage());
  expect_close(b, ones({4}), 0, 0, "second call's constant output");
  expect_close(a, ones({4}) * 5.0, 0, 0, "first call's output written in place");
  expect_close(yb, x + 1.0, 1e-6, 1e-6, "the other output");
}

TEST_CASE("jit inplace: writes with graph breaks and dtype conversions", "[jit][inplace]") {
  auto fn = [](const std::vector<Tensor>& a) {
    Tensor x = a[0];
    x.add_(1.0);
    const double s = x.sum().item<double>();  // graph break
    x.mul_(s > 0 ? 0.5 : 2.0);
    Tensor n = tpu::zeros({2, 3}, TensorOptions(DType::i32));
    n.copy_(x * 10.0);  // f32 -> i32 truncation
    return std::vector<Tensor>{x * 2.0, n.to(DType::f32)};
  };
  check_vs_eager(fn, {rnd({2, 3}, 8)}, 2, "inplace_break", -1);
}

TEST_CASE("jit inplace: views keep aliasing their base across a graph break", "[jit][inplace]") {
  auto fn = [](const std::vector<Tensor>& a) {
    Tensor y = a[0] * 1.0;
    Tensor v = y.t();
    Tensor va = a[0].narrow(1, 1, 2);
    const double s = y.sum().item<double>();  // graph break: y, v, va become real (v a view of y)
    y.add_(s);
    va.mul_(2.0);                             // a real view of the argument
    const double s2 = y.sum().item<double>();  // another break: the writes land in real memory
    return std::vector<Tensor>{v + s2, y + 0.0, a[0] + 0.0};
  };
  check_vs_eager(fn, {rnd({2, 3}, 14)}, 2, "inplace_break_views", -1);
  // Reading a view and writing its base in one segment after a break: two aliasing inputs.
  auto both = compile([](const Tensor& x) {
    Tensor y = x * 2.0;
    Tensor v = y.t();
    const double s = y.sum().item<double>();
    y.add_(s);
    return v + 0.0;
  }, {.name = "inplace_break_alias"});
  CHECK_THROWS_WITH(both(rnd({2, 3}, 15)), Catch::Contains("shares its memory"));
}

TEST_CASE("jit inplace: a write into a block of its base is a cat, any other view a scatter", "[jit][inplace]") {
  // A flat buffer filled slot by slot (as FSDP packs its shards), a column block of a matrix, every
  // other element of a vector (blocks of the base seen as a matrix), and two columns of a matrix
  // written through its transpose (not a block in that order).
  auto f = compile([](const Tensor& a, const Tensor& b) {
    Tensor buf = tpu::zeros({13});
    buf.narrow(0, 1, 4).copy_(a);
    buf.narrow(0, 7, 6).copy_(b.reshape({6}));
    Tensor m = tpu::full({3, 4}, 1.0);
    m.narrow(1, 1, 2).copy_(b);
    Tensor v = tpu::full({6}, 2.0);
    tpu::slice(v, 0, 1, 6, 2).copy_(b.narrow(1, 0, 1).reshape({3}));
    Tensor w = tpu::full({3, 3}, 3.0);
    w.t().narrow(0, 0, 2).copy_(b.t());
    return std::vector<Tensor>{buf, m, v, w};
  }, {.name = "inplace_blocks"});
  Tensor a = rnd({4}, 31), b = rnd({3, 2}, 32);
  std::vector<Tensor> got = f(a, b);
  const auto av = a.to_vector<float>(), bv = b.contiguous().to_vector<float>();
  // The naive reference.
  std::vector<float> buf(13, 0.0f), m(12, 1.0f), v(6, 2.0f), w(9, 3.0f);
  for (size_t i = 0; i < 4; ++i) buf[1 + i] = av[i];
  for (size_t i = 0; i < 6; ++i) buf[7 + i] = bv[i];
  for (size_t r = 0; r < 3; ++r) {
    for (size_t c = 0; c < 2; ++c) m[r * 4 + 1 + c] = bv[r * 2 + c];
    v[1 + 2 * r] = bv[r * 2];
    for (size_t c = 0; c < 2; ++c) w[r * 3 + c] = bv[r * 2 + c];
  }
  CHECK(got[0].contiguous().to_vector<float>() == buf);
  CHECK(got[1].contiguous().to_vector<float>() == m);
  CHECK(got[2].contiguous().to_vector<float>() == v);
  CHECK(got[3].contiguous().to_vector<float>() == w);
  std::string graph;
  for (const std::string& g : f.graphs()) graph += g;
  INFO(graph);
  CHECK(graph.find("= cat(") != std::string::npos);
  // Only the write through the transpose is merged by index: a scatter of its values and one of
  // its coverage counts (which constant folding may fold away).
  int scatters = 0;
  for (size_t p = graph.find("= scatter_add("); p != std::string::npos; p = graph.find("= scatter_add(", p + 1)) ++scatters;
  CHECK(scatters >= 1);
  CHECK(scatters <= 2);
}

TEST_CASE("jit inplace: writes into views of an 8-bit float tensor (cat and index merge) keep every value",
          "[jit][inplace][float8]") {
  // Values exact in e4m3, so the naive reference needs no rounding; a block (a narrow) and a write
  // through a transpose (the index merge), as an fp8 KV cache is written.
  auto f = compile([](const Tensor& a, const Tensor& b) {
    Tensor buf = tpu::full({10}, 0.25).to(DType::f8e4m3);
    buf.narrow(0, 3, 4).copy_(a.to(DType::f8e4m3));
    Tensor w = tpu::full({3, 3}, -1.5).to(DType::f8e4m3);
    w.t().narrow(0, 0, 2).copy_(b.t().to(DType::f8e4m3));
    return std::vector<Tensor>{buf.to(DType::f32), w.to(DType::f32)};
  }, {.name = "inplace_f8"});
  const std::vector<float> av{0.5f, -2.0f, 448.0f, 0.015625f}, bv{1.0f, 3.0f, -0.75f, 12.0f, 96.0f, -0.125f};
  std::vector<Tensor> got = f(from_vector(av), from_vector(bv, Shape{3, 2}));
  std::vector<float> buf(10, 0.25f), w(9, -1.5f);
  for (size_t i = 0; i < 4; ++i) buf[3 + i] = av[i];
  for (size_t r = 0; r < 3; ++r)
    for (size_t c = 0; c < 2; ++c) w[r * 3 + c] = bv[r * 2 + c];
  CHECK(got[0].contiguous().to_vector<float>() == buf);
  CHECK(got[1].contiguous().to_vector<float>() == w);
}

TEST_CASE("jit inplace: unsupported writes are clear errors", "[jit][inplace]") {
  auto twice = compile([](const Tensor& a, const Tensor& b) {
    Tensor t = a;
    t.add_(1.0);
    return b * 2.0;
  }, {.name = "inplace_alias"});
  Tensor x = rnd({3}, 9);
  CHECK_THROWS_WITH(twice(x, x), Catch::Contains("shares its memory"));
  auto expanded = compile([](const Tensor& a) {
    Tensor e = (a * 1.0).expand({3, 3});
    e.copy_(tpu::ones({3, 3}));
    return e;
  }, {.name = "inplace_expanded"});
  CHECK_THROWS_WITH(expanded(rnd({3}, 10)), Catch::Contains("expanded view"));
  auto devices = compile([](const Tensor& a) {
    Tensor s = tpu::zeros({3}, TensorOptions(DType::f32, Device("sim:0")));
    s.copy_(a);
    return s;
  }, {.name = "inplace_devices"});
  CHECK_THROWS_WITH(devices(rnd({3}, 11)), Catch::Contains("between devices"));
}

TEST_CASE("jit inplace: a captured weight on sim is updated in place", "[jit][inplace]") {
  testing::TinySim sim;
  Tensor w_cpu = rnd({8, 8}, 12);
  Tensor w = w_cpu.to(sim.dev());
  auto f = compile([&](const Tensor& x) {
    Tensor y = tpu::relu(tpu::matmul(x, w));
    w.add_(y.t() * 0.1);
    return y;
  }, {.name = "inplace_sim"});
  for (int i = 0; i < 2; ++i) {
    Tensor x = rnd({8, 8}, 20 + static_cast<uint64_t>(i));
    Tensor y_ref = tpu::relu(tpu::matmul(x, w_cpu));
    w_cpu.add_(y_ref.t() * 0.1);
    expect_close(f(x.to(sim.dev())).to(Device()), y_ref, 2e-2, 2e-2, "y");
    expect_close(w.to(Device()), w_cpu, 2e-2, 2e-2, "w");
  }
  CHECK(stats_of("inplace_sim").compiles == 1);
}

TEST_CASE("jit cache: grad mode is part of the key", "[jit]") {
  auto f = compile([](const Tensor& x) { return x * 2.0; }, {.name = "grad_mode_key"});
  Tensor x = rnd({3}, 13);
  f(x);
  {
    NoGradGuard ng;
    f(x);
    f(x);
  }
  f(x);
  const auto& s = stats_of("grad_mode_key");
  CHECK(s.compiles == 2);
  CHECK(s.hits == 2);
  REQUIRE(s.reasons.size() == 2);
  CHECK(s.reasons[1] == "grad mode on -> off");
  // The layout of a tensor argument is part of the key too (the trace follows eager aliasing).
  auto g = compile([](const Tensor& x) { return x.contiguous() * 2.0; }, {.name = "layout_key"});
  Tensor a = rnd({3, 4}, 14);
  expect_close(g(a), a * 2.0);
  expect_close(g(a.t().contiguous().t()), a * 2.0);
  const auto& l = stats_of("layout_key");
  CHECK(l.compiles == 2);
  REQUIRE(l.reasons.size() == 2);
  CHECK(l.reasons[1] == "arg 0 layout contiguous -> strided");
}

}  // namespace
}  // namespace tpu
