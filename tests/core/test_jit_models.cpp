// Eager vs compiled on small models: the compiled graph (traced, optimized, fused and run by
// the cpu region executor) must give the eager values computed from the same inputs.
#include "jit_testing.h"

namespace tpu {
namespace {
using jit_testing::expect_close;
using jit_testing::rnd;

CompileOptions verified(const char* name) {
  CompileOptions o;
  o.name = name;
  o.verify = 1;
  return o;
}

TEST_CASE("jit: elementwise chain gelu(x * w + b)", "[jit]") {
  auto fn = [](const Tensor& x, const Tensor& w, const Tensor& b) { return gelu(x * w + b); };
  auto f = compile(fn, verified("gelu_chain"));
  for (Shape s : {Shape{7}, Shape{3, 5}, Shape{40000}, Shape{33, 1025}}) {
    Tensor x = rnd(s, 1), w = rnd(Shape{s.back()}, 2), b = rnd(Shape{}, 3);
    expect_close(f(x, w, b), fn(x, w, b), 1e-5, 1e-6, s.str());
  }
  // Non-contiguous inputs.
  Tensor x = rnd({64, 48}, 4).t(), w = rnd({64}, 5), b = rnd({48, 1}, 6);
  expect_close(f(x, w, b), fn(x, w, b), 1e-5, 1e-6, "transposed");
}

TEST_CASE("jit: MLP with bias and residual", "[jit]") {
  Tensor w1 = rnd({32, 16}, 10), b1 = rnd({32}, 11), w2 = rnd({16, 32}, 12), b2 = rnd({16}, 13);
  auto fn = [&](const Tensor& x) {
    Tensor h = relu(linear(x, w1, b1));
    Tensor y = matmul(h, w2.t()) + b2;
    return gelu(y) + x;
  };
  auto f = compile(fn, verified("mlp"));
  Tensor x = rnd({9, 16}, 14);
  expect_close(f(x), fn(x), 1e-4, 1e-5);
  expect_close(f(x), fn(x), 1e-4, 1e-5);
}

TEST_CASE("jit: attention block", "[jit]") {
  const int64_t T = 6, D = 16, H = 2, hd = D / H;
  Tensor wq = rnd({D, D}, 20), wk = rnd({D, D}, 21), wv = rnd({D, D}, 22), wo = rnd({D, D}, 23);
  Tensor g = rnd({D}, 24), be = rnd({D}, 25);
  auto fn = [&](const Tensor& x) {
    Tensor h = layer_norm(x, Shape{D}, g, be);
    auto heads = [&](const Tensor& t) { return t.reshape({T, H, hd}).transpose(0, 1); };
    Tensor q = heads(matmul(h, wq)), k = heads(matmul(h, wk)), v = heads(matmul(h, wv));
    Tensor s = matmul(q, k.transpose(1, 2)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    Tensor mask = triu(full({T, T}, -1e9), 1);
    Tensor p = softmax(s + mask, -1);
    Tensor o = matmul(p, v).transpose(0, 1).reshape({T, D});
    return x + matmul(o, wo);
  };
  auto f = compile(fn, verified("attention"));
  Tensor x = rnd({T, D}, 26);
  expect_close(f(x), fn(x), 1e-4, 1e-4);
}

TEST_CASE("jit: hand-written softmax, layer_norm and rms_norm each fuse into one region", "[jit]") {
  auto sm = [](const Tensor& x) {
    Tensor e = exp(x - amax(x, {-1}, true));
    return e / sum(e, {-1}, true);
  };
  auto ln = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    Tensor mu = mean(x, {-1}, true);
    Tensor xc = x - mu;
    Tensor var = mean(xc * xc, {-1}, true);
    return xc * rsqrt(var + 1e-5) * w + b;
  };
  auto rms = [](const Tensor& x, const Tensor& w) { return x * rsqrt(mean(x * x, {-1}, true) + 1e-6) * w; };
  Tensor x = rnd({5, 3, 37}, 30), w = rnd({37}, 31), b = rnd({37}, 32);
  auto f1 = compile(sm, verified("softmax_by_hand"));
  auto f2 = compile(ln, verified("layer_norm_by_hand"));
  auto f3 = compile(rms, verified("rms_norm_by_hand"));
  expect_close(f1(x), sm(x), 1e-5, 1e-6);
  expect_close(f2(x, w, b), ln(x, w, b), 1e-4, 1e-5);
  expect_close(f3(x, w), rms(x, w), 1e-4, 1e-5);
  for (auto* text : {&f1, &f1}) (void)text;
  auto one_region = [](const std::vector<std::string>& gs) {
    REQUIRE(gs.size() == 1);
    INFO(gs[0]);
    CHECK(gs[0].find("# region 0: rowwise") != std::string::npos);
    CHECK(gs[0].find("# region 1") == std::string::npos);
    CHECK(gs[0].find("= exp(") != std::string::npos);
  };
  one_region(f1.graphs());
  auto g2 = f2.graphs();
  REQUIRE(g2.size() == 1);
  CHECK(g2[0].find("# region 0: rowwise") != std::string::npos);
  CHECK(g2[0].find("# region 1") == std::string::npos);
  auto g3 = f3.graphs();
  CHECK(g3[0].find("# region 0: rowwise") != std::string::npos);
  CHECK(g3[0].find("# region 1") == std::string::npos);
}

TEST_CASE("jit: softmax / layer_norm / rms_norm ops fuse with their neighbours", "[jit]") {
  Tensor w = rnd({24}, 40), b = rnd({24}, 41);
  auto fn = [&](const Tensor& x) {
    Tensor a = softmax(x * 0.5, -1);
    Tensor l = layer_norm(a + x, Shape{24}, w, b);
    return rms_norm(gelu(l), Shape{24}, w) * 2.0;
  };
  auto f = compile(fn, verified("norm_ops"));
  Tensor x = rnd({4, 10, 24}, 42);
  expect_close(f(x), fn(x), 1e-4, 1e-5);
  auto gs = f.graphs();
  INFO(gs[0]);
  CHECK(gs[0].find("# region 0: rowwise") != std::string::npos);
  // Without weights too (the ops then pass x as a placeholder).
  auto fn2 = [](const Tensor& x) { return layer_norm(x * 3.0, Shape{24}) + rms_norm(x - 1.0, Shape{24}); };
  auto f2 = compile(fn2, verified("norm_ops_noweight"));
  expect_close(f2(x), fn2(x), 1e-4, 1e-5);
}

TEST_CASE("jit: residual blocks, views, broadcasting and casts", "[jit]") {
  Tensor w = rnd({8, 8}, 50);
  auto fn = [&](const Tensor& x, const Tensor& y) {
    Tensor h = x;
    for (int i = 0; i < 3; ++i) h = h + relu(matmul(h, w)) * 0.5;
    Tensor v = h.reshape({4, 2, 8}).permute({1, 0, 2}).slice(2, 1, 7).contiguous();
    Tensor c = v.to(DType::bf16) * y.to(DType::bf16);
    Tensor s = sum(c.to(DType::f32), {0}) + v.select(0, 1).unsqueeze(0).squeeze(0);
    return std::make_tuple(s, c, gt(x, 0.0).to(DType::i32) + 1);
  };
  auto f = compile(fn, verified("residual_views"));
  Tensor x = rnd({8, 8}, 51), y = rnd({1, 6}, 52);
  auto [s1, c1, i1] = f(x, y);
  auto [s2, c2, i2] = fn(x, y);
  expect_close(s1, s2, 1e-2, 1e-2, "s");
  expect_close(c1, c2, 1e-2, 1e-2, "c");
  expect_close(i1, i2, 0, 0, "i");
}

TEST_CASE("jit: functions taking and returning tensor lists", "[jit]") {
  auto fn = [](const std::vector<Tensor>& xs, double scale) {
    std::vector<Tensor> out;
    for (const Tensor& x : xs) out.push_back(x * scale + 1.0);
    out.push_back(cat(xs, 0));
    return out;
  };
  auto f = compile(fn, verified("lists"));
  std::vector<Tensor> xs = {rnd({3, 2}, 60), rnd({1, 2}, 61)};
  auto a = f(xs, 2.0), b = fn(xs, 2.0);
  REQUIRE(a.size() == 3);
  for (size_t i = 0; i < a.size(); ++i) expect_close(a[i], b[i]);
  auto c = f(xs, -3.5), d = fn(xs, -3.5);
  for (size_t i = 0; i < c.size(); ++i) expect_close(c[i], d[i]);
}

TEST_CASE("jit: random and creation ops inside the function", "[jit]") {
  auto fn = [](const Tensor& x) { return x + zeros({4}) + rand_like(x) * 0.0 + arange(4).to(DType::f32); };
  auto f = compile(fn, verified("creation"));
  Tensor x = rnd({3, 4}, 70);
  expect_close(f(x), fn(x));
  // Random numbers differ per call (the op runs each time, it is not folded).
  auto r = compile([](const Tensor& x) { return x + rand_like(x); }, verified("random"));
  Tensor a = r(x), b = r(x);
  CHECK_FALSE(allclose(a, b));
}

TEST_CASE("jit: fused regions over many tiles, tails, broadcasts and strided inputs", "[jit]") {
  auto ln = [](const Tensor& x, const Tensor& w) {
    Tensor xc = x - mean(x, {-1}, true);
    return xc * rsqrt(mean(xc * xc, {-1}, true) + 1e-5) * w;
  };
  Tensor x = rnd({300, 64}, 90), w = rnd({64}, 91);
  auto f1 = compile(ln, verified("tiles_rowwise"));
  expect_close(f1(x, w), ln(x, w), 1e-4, 1e-5);
  Tensor a = rnd({700, 48}, 92), b = rnd({48, 100}, 93), bias = rnd({100}, 94);
  auto mm = [](const Tensor& a, const Tensor& b, const Tensor& c) { return silu(matmul(a, b) + c) * 2.0; };
  auto f2 = compile(mm, verified("tiles_matmul"));
  expect_close(f2(a, b, bias), mm(a, b, bias), 1e-4, 1e-4);
  // bf16 chain: the tile-kernel path for elementwise regions.
  auto ew = [](const Tensor& x, const Tensor& y) { return (x * y + x).to(DType::f32) * 0.5; };
  Tensor xb = rnd({200, 300}, 95).to(DType::bf16), yb = rnd({200, 1}, 96).to(DType::bf16);
  auto f3 = compile(ew, verified("tiles_bf16"));
  expect_close(f3(xb, yb), ew(xb, yb), 1e-2, 1e-2);
  // f32 vector path: per-row scalars, a transposed (gathered) input, a 0-d region.
  auto vec = [](const Tensor& x, const Tensor& r, const Tensor& t) { return exp(x * r - t) + 1.0; };
  Tensor xr = rnd({37, 5000}, 97), rr = rnd({37, 1}, 98), tt = rnd({5000, 37}, 99).t();
  auto f4 = compile(vec, verified("vec_paths"));
  expect_close(f4(xr, rr, tt), vec(xr, rr, tt), 1e-5, 1e-5);
  auto four = [](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d) { return (a + b) * (c - d) + a; };
  auto f5 = compile(four, verified("vec_gathers"));
  Tensor ta = rnd({300, 40}, 102).t(), tb = rnd({300, 40}, 103).t(), tc = rnd({300, 40}, 104).t(), td = rnd({300, 40}, 105).t();
  expect_close(f5(ta, tb, tc, td), four(ta, tb, tc, td), 1e-5, 1e-5);
  Tensor s0 = rnd({}, 100), s1 = rnd({}, 101);
  expect_close(f4(s0, s1, s1), vec(s0, s1, s1), 1e-5, 1e-5);
}

TEST_CASE("jit: narrow rows: several rows per fused call, broadcast rows repeated", "[jit]") {
  auto fn = [](const Tensor& x, const Tensor& w, const Tensor& b) { return relu(x * w + b) - x * 0.5; };
  auto f = compile(fn, verified("narrow_rows"));
  // Row counts that are not multiples of the rows per call; 3-d; a scalar and a 0-d bias.
  for (Shape s : {Shape{37, 16}, Shape{129, 7}, Shape{1000, 3}, Shape{5, 3, 24}, Shape{2, 1024}}) {
    Tensor x = rnd(s, 110), w = rnd(Shape{s.back()}, 111), b = rnd(Shape{}, 112);
    expect_close(f(x, w, b), fn(x, w, b), 1e-6, 1e-6, s.str());
  }
  // A strided broadcast row (every other element of a wider vector).
  Tensor x = rnd({300, 12}, 113), wide = rnd({24}, 114), b = rnd({12}, 115);
  Tensor w = slice(wide, 0, 0, 24, 2);
  expect_close(f(x, w, b), fn(x, w, b), 1e-6, 1e-6, "strided w");
  // Layouts the several-rows path declines (row by row instead): a per-row operand, a
  // broadcast over a middle dim, a transposed input.
  Tensor xr = rnd({50, 16}, 116), wr = rnd({50, 1}, 117);
  expect_close(f(xr, wr, b.slice(0, 0, 1)), fn(xr, wr, b.slice(0, 0, 1)), 1e-6, 1e-6, "per-row operand");
  Tensor x3 = rnd({4, 5, 8}, 118), w3 = rnd({4, 1, 8}, 119), b3 = rnd({8}, 120);
  expect_close(f(x3, w3, b3), fn(x3, w3, b3), 1e-6, 1e-6, "middle broadcast");
  Tensor xt = rnd({16, 40}, 121).t(), wt = rnd({16}, 122);
  expect_close(f(xt, wt, rnd({16}, 123)), fn(xt, wt, rnd({16}, 123)), 1e-6, 1e-6, "transposed x");
}

TEST_CASE("jit: graphs on the sim device run node by node through the front half", "[jit]") {
  const Device sim("sim:0");
  Tensor w = rnd({8}, 80).to(sim);
  auto fn = [&](const Tensor& a) { return softmax(gelu(a * w + 1.0), -1); };
  auto f = compile(fn, verified("on_sim"));
  Tensor x = rnd({4, 8}, 81).to(sim);
  Tensor y = f(x);
  CHECK(y.device() == sim);
  expect_close(y.to(Device()), fn(x).to(Device()));
}

}  // namespace
}  // namespace tpu
