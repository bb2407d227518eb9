// The mixture-of-experts ops beyond their OpInfo samples: products large enough for the threaded
// paths, bf16 at size, gradients against closed forms written as double loops, a whole routed
// layer against a per-token loop, the chip programs on the tiny sim chip (naive loops, no host
// fallback, no new program for a new routing or token count), and bad inputs.
#include "codegen_testing.h"
#include "moe_test_util.h"
#include "ops/fallback.h"
#include "tpucore/compile.h"
#include "tpucore/autograd.h"
#include "tpucore/nn/moe.h"

namespace tpu::testing {
namespace {

using namespace moe;

TEST_CASE("grouped_matmul: large uneven groups match the naive loop in both layouts", "[moe][matmul]") {
  Generator g(7);
  // Group 2 (120 x 256 x 160 = 9.8 MFLOP) runs split inside the GEMM, the others in parallel.
  const std::vector<int64_t> counts{0, 1, 120, 0, 37, 2};
  const int64_t T = 160, K = 256, N = 160, E = 6;
  for (DType dt : {DType::f32, DType::bf16})
    for (bool tw : {false, true}) {
      DYNAMIC_SECTION(dtype_name(dt) << (tw ? " transposed" : "")) {
        Tensor x = uniform_input(g, {T, K}, dt);
        Tensor w = uniform_input(g, tw ? Shape{E, N, K} : Shape{E, K, N}, dt);
        Tensor y = grouped_matmul(x, w, counts_tensor(counts), tw);
        REQUIRE(y.dtype() == dt);
        const Tol tol = dt == DType::f32 ? Tol{1e-4, 1e-5} : Tol{2e-2, 1e-2};
        check_close(y, grouped_matmul_ref(ref_of(x), ref_of(w), counts, tw), tol, "grouped_matmul");
        Tensor dy = uniform_input(g, {T, N}, dt);
        check_close(grouped_matmul_weight_grad(x, dy, counts_tensor(counts, DType::i32), tw),
                    weight_grad_ref(ref_of(x), ref_of(dy), counts, tw), tol, "weight grad");
      }
    }
}

TEST_CASE("grouped_matmul: few-row groups of a wide transposed weight (the MoE layer's case) match the naive loop",
          "[moe][matmul]") {
  Generator g(17);
  // Groups of 16, 0, 1, 3 and 40 rows against [N, K] weights: N not a multiple of 16 (the last
  // weight rows padded), K not a multiple of 32 (a K tail); the 16- and 40-row products run split
  // inside the GEMM (the few-row AMX kernel on CPUs with it) and the 40-row one's bf16 result
  // (>= 2^15 values) is rounded over the threads.
  const int64_t K = 200, N = 830, E = 5;
  // The naive loop over the values (x [T, K], w [E, N, K]), sums in double, as f32.
  auto naive = [&](const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts) {
    const Ref r = grouped_matmul_ref(ref_of(x), ref_of(w), counts, true);
    return std::vector<float>(r.v.begin(), r.v.end());
  };
  auto check = [&](const Tensor& y, const std::vector<float>& want, double tol) {
    const std::vector<float> got = y.to(DType::f32).contiguous().to_vector<float>();
    REQUIRE(got.size() == want.size());
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += !(std::abs(got[i] - want[i]) <= tol * (1.0 + std::abs(want[i])));
    CHECK(bad == 0);
  };
  const std::vector<int64_t> counts{16, 0, 1, 3, 40}, fewer{1, 2, 0, 0, 0};
  for (DType dt : {DType::bf16, DType::f32}) {
    DYNAMIC_SECTION(dtype_name(dt)) {
      const double tol = dt == DType::f32 ? 1e-4 : 2e-2;
      Tensor x = uniform_input(g, {60, K}, dt);
      Tensor w = uniform_input(g, {E, N, K}, dt);
      Tensor y = grouped_matmul(x, w, counts_tensor(counts), true);
      REQUIRE(y.dtype() == dt);
      check(y, naive(x, w, counts), tol);
      // Again with fewer rows: the per-thread f32 buffers are reused.
      Tensor x2 = narrow(x, 0, 0, 3);
      check(grouped_matmul(x2, w, counts_tensor(fewer), true), naive(x2, w, fewer), tol);
    }
  }
}

TEST_CASE("grouped_matmul: mixed f32 and bf16 promote, f16 runs in f32", "[moe][matmul]") {
  Generator g(8);
  const std::vector<int64_t> counts{2, 3};
  Tensor x = uniform_input(g, {5, 4}, DType::bf16), w = uniform_input(g, {2, 4, 3});
  Tensor y = grouped_matmul(x, w, counts_tensor(counts));
  REQUIRE(y.dtype() == DType::f32);
  check_close(y, grouped_matmul_ref(ref_of(x), ref_of(w), counts, false), {1e-5, 1e-5}, "mixed");
  Tensor h = grouped_matmul(x.to(DType::f16), w.to(DType::f16), counts_tensor(counts));
  REQUIRE(h.dtype() == DType::f16);
  check_close(h, grouped_matmul_ref(ref_of(x.to(DType::f16)), ref_of(w.to(DType::f16)), counts, false), {1e-3, 2e-3},
              "f16");
}

TEST_CASE("grouped_matmul: gradients equal the closed forms, empty groups get zero", "[moe][autograd]") {
  Generator g(9);
  const std::vector<int64_t> counts{3, 0, 1, 4};
  const int64_t T = 8, K = 5, N = 3, E = 4;
  for (bool tw : {false, true}) {
    DYNAMIC_SECTION((tw ? "transposed" : "plain")) {
      Tensor x = uniform_input(g, {T, K}).requires_grad_();
      Tensor w = uniform_input(g, tw ? Shape{E, N, K} : Shape{E, K, N}).requires_grad_();
      Tensor dy = uniform_input(g, {T, N});
      grouped_matmul(x, w, counts_tensor(counts), tw).backward(dy);
      const Ref X = ref_of(x), W = ref_of(w), DY = ref_of(dy);
      // dx[r, k] = sum_n dy[r, n] w_e[k, n]; dw_e[k, n] = sum_{r in e} x[r, k] dy[r, n].
      Ref dx(Shape{T, K}), dw(W.shape);
      int64_t row = 0;
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t r = row; r < row + counts[static_cast<size_t>(e)]; ++r)
          for (int64_t k = 0; k < K; ++k)
            for (int64_t n = 0; n < N; ++n) {
              const double wv = tw ? W.at({e, n, k}) : W.at({e, k, n});
              dx.at({r, k}) += DY.at({r, n}) * wv;
              (tw ? dw.at({e, n, k}) : dw.at({e, k, n})) += X.at({r, k}) * DY.at({r, n});
            }
        row += counts[static_cast<size_t>(e)];
      }
      check_close(x.grad(), dx, {1e-5, 1e-5}, "dx");
      check_close(w.grad(), dw, {1e-5, 1e-5}, "dw");
      for (int64_t k = 0; k < K * N; ++k) CHECK(dw.v[static_cast<size_t>(K * N + k)] == 0.0);  // group 1 is empty
    }
  }
}

TEST_CASE("moe ops: a routed layer equals the per-token sum over its chosen experts", "[moe]") {
  Generator g(10);
  const int64_t T = 9, H = 6, F = 4, E = 5, k = 2;
  Tensor x = uniform_input(g, {T, H}).requires_grad_();
  Tensor w = uniform_input(g, {E, F, H}).requires_grad_();  // per expert [out, in], as a Linear
  Tensor logits = uniform_input(g, {T, E});
  auto [vals, ids] = topk(softmax(logits, -1), k);
  Tensor weights = vals.detach().requires_grad_();
  auto [order, counts] = moe_sort(ids, E);
  REQUIRE(counts.to_vector<int32_t>().size() == static_cast<size_t>(E));
  Tensor ys = grouped_matmul(moe_permute(x, order, k), w, counts, true);
  Tensor out = moe_unpermute(ys, order, weights, k);  // [T, F]
  const Ref X = ref_of(x), W = ref_of(w), WT = ref_of(weights), ID = ref_of(ids), LG = ref_of(logits);
  Ref want(Shape{T, F});
  for (int64_t t = 0; t < T; ++t) {
    // The chosen experts are the two largest logits of the row.
    std::vector<int64_t> best(static_cast<size_t>(E));
    std::iota(best.begin(), best.end(), 0);
    std::stable_sort(best.begin(), best.end(), [&](int64_t a, int64_t b) { return LG.at({t, a}) > LG.at({t, b}); });
    for (int64_t j = 0; j < k; ++j) {
      const auto e = static_cast<int64_t>(ID.at({t, j}));
      CHECK(e == best[static_cast<size_t>(j)]);
      for (int64_t f = 0; f < F; ++f) {
        double s = 0;
        for (int64_t h = 0; h < H; ++h) s += X.at({t, h}) * W.at({e, f, h});
        want.at({t, f}) += WT.at({t, j}) * s;
      }
    }
  }
  check_close(out, want, {1e-5, 1e-5}, "routed layer");
  // Gradients: d/dweights[t, j] = <dout[t], x_t W_e^T>, d/dx[t] = sum_j w_tj dout[t] W_e.
  Tensor dout = uniform_input(g, {T, F});
  out.backward(dout);
  const Ref D = ref_of(dout);
  Ref dwt(Shape{T, k}), dx(Shape{T, H});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const auto e = static_cast<int64_t>(ID.at({t, j}));
      for (int64_t f = 0; f < F; ++f) {
        double s = 0;
        for (int64_t h = 0; h < H; ++h) {
          s += X.at({t, h}) * W.at({e, f, h});
          dx.at({t, h}) += WT.at({t, j}) * D.at({t, f}) * W.at({e, f, h});
        }
        dwt.at({t, j}) += D.at({t, f}) * s;
      }
    }
  check_close(weights.grad(), dwt, {1e-5, 1e-5}, "d weights");
  check_close(x.grad(), dx, {1e-5, 1e-5}, "dx");
}

TEST_CASE("topk: the indices are the naive ones, NaN counts as the largest, backward scatters", "[moe]") {
  Generator g(11);
  Tensor x = uniform_input(g, {4, 7});
  auto [v, i] = topk(x, 3);
  REQUIRE(i.dtype() == DType::i64);
  check_close(i, topk_ref(ref_of(x), 3, true), {0, 0}, "indices");
  Tensor n = from_vector(std::vector<float>{1.0f, NAN, 3.0f, 3.0f}, Shape{4});
  auto [nv, ni] = topk(n, 3, 0);
  CHECK(ni.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3});
  // Along dim 0 of a 3-D tensor.
  Tensor y = uniform_input(g, {5, 2, 3});
  auto [yv, yi] = topk(y, 2, 0);
  REQUIRE(yv.shape() == Shape({2, 2, 3}));
  const Ref Y = ref_of(y), YV = ref_of(yv);
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 3; ++b) {
      std::vector<double> col;
      for (int64_t r = 0; r < 5; ++r) col.push_back(Y.at({r, a, b}));
      std::sort(col.rbegin(), col.rend());
      CHECK(YV.at({0, a, b}) == col[0]);
      CHECK(YV.at({1, a, b}) == col[1]);
    }
  Tensor z = uniform_input(g, {2, 4}).requires_grad_();
  auto [zv, zi] = topk(z, 2);
  sum(mul(zv, from_vector(std::vector<float>{1, 2, 3, 4}, Shape{2, 2}))).backward();
  const Ref ZI = ref_of(zi);
  Ref want(Shape{2, 4});
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = 0; j < 2; ++j) want.at({r, static_cast<int64_t>(ZI.at({r, j}))}) = static_cast<double>(r * 2 + j + 1);
  check_close(z.grad(), want, {0, 0}, "topk grad");
}

TEST_CASE("load_balancing_loss: the closed form of Transformers' formula, and its gradient", "[moe][autograd]") {
  Generator g(14);
  const int64_t E = 5, k = 2;
  std::vector<Tensor> layers{make_input(g, {6, E}, DType::f32, Layout::contiguous, -3.0, 3.0).requires_grad_(),
                             make_input(g, {4, E}, DType::f32, Layout::contiguous, -3.0, 3.0).requires_grad_()};
  Tensor loss = nn::load_balancing_loss(layers, E, k);
  // Closed form over the N = 10 rows: f[e] = (1/N) #{(n, j): choice j of row n is e},
  // P[e] = (1/N) sum_n p[n, e]; loss = E sum_e f[e] P[e].
  std::vector<std::vector<double>> p;
  for (const Tensor& l : layers) {
    const Ref r = ref_of(l);
    for (int64_t n = 0; n < r.shape[0]; ++n) {
      std::vector<double> row(static_cast<size_t>(E));
      double mx = -1e300, z = 0;
      for (int64_t e = 0; e < E; ++e) mx = std::max(mx, r.at({n, e}));
      for (int64_t e = 0; e < E; ++e) z += (row[e] = std::exp(r.at({n, e}) - mx));
      for (double& v : row) v /= z;
      p.push_back(row);
    }
  }
  const auto N = static_cast<double>(p.size());
  std::vector<double> f(static_cast<size_t>(E), 0.0), P(static_cast<size_t>(E), 0.0);
  for (const auto& row : p) {
    std::vector<int64_t> idx(static_cast<size_t>(E));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
    for (int64_t j = 0; j < k; ++j) f[static_cast<size_t>(idx[j])] += 1.0 / N;
    for (int64_t e = 0; e < E; ++e) P[e] += row[e] / N;
  }
  double want = 0;
  for (int64_t e = 0; e < E; ++e) want += static_cast<double>(E) * f[e] * P[e];
  check_near(loss, {want});
  // d loss / d p[n, e] = E f[e] / N, through the softmax: p_i (g_i - sum_e g_e p_e).
  loss.backward();
  size_t n = 0;
  for (const Tensor& l : layers) {
    Ref want_grad(l.shape());
    for (int64_t r = 0; r < l.size(0); ++r, ++n) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(E) * f[e] / N * p[n][e];
      for (int64_t i = 0; i < E; ++i) want_grad.at({r, i}) = p[n][i] * (static_cast<double>(E) * f[i] / N - dot);
    }
    check_close(l.grad(), want_grad, {1e-6, 1e-5}, "load-balancing gradient");
  }
  expect_error([&] { nn::load_balancing_loss({}, E, k); }, {"load_balancing_loss", "no router logits"});
}

// Host fallbacks of the MoE ops (per op name) on sim devices so far.
uint64_t moe_sim_fallbacks() {
  uint64_t n = 0;
  for (const auto& c : ops::fallback_counts())
    if (c.device.type == DeviceType::sim &&
        (c.op == "grouped_matmul" || c.op == "grouped_matmul_weight_grad" || c.op == "moe_permute" ||
         c.op == "moe_unpermute"))
      n += c.calls;
  return n;
}

// Chip program runs of two kernels so far.
std::pair<uint64_t, uint64_t> moe_kernel_runs(const char* a, const char* b) {
  ChipRunProbe::sync_all();
  const codegen::CodegenStats s = codegen::stats();
  auto get = [&](const char* k) { return s.runs_by_kernel.count(k) ? s.runs_by_kernel.at(k) : 0; };
  return {get(a), get(b)};
}

TEST_CASE("moe ops on the chip: grouped_matmul and its weight grad match the naive loop", "[moe][codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Generator g(12);
  // Row tiles are 32 rows on the tiny chip: empty groups, a one-token group, a group of two full
  // tiles and a tail, one of a full tile and a one-row tail, a tail alone; K and N are not
  // multiples of the 8 x 8 MXU.
  const std::vector<int64_t> counts{0, 1, 70, 0, 7, 33};
  const int64_t T = 111, K = 12, N = 10, E = 6;
  const uint64_t before = moe_sim_fallbacks();
  ChipRunProbe probe;
  const auto runs0 = moe_kernel_runs("grouped_matmul", "grouped_matmul_weight_grad");
  for (DType dt : {DType::f32, DType::bf16})
    for (bool tw : {false, true}) {
      CAPTURE(dtype_name(dt), tw);
      Tensor x = uniform_input(g, {T, K}, dt), w = uniform_input(g, tw ? Shape{E, N, K} : Shape{E, K, N}, dt), dy = uniform_input(g, {T, N}, dt);
      const Tol tol = dt == DType::f32 ? Tol{1e-5, 1e-5} : Tol{2e-2, 1e-2};
      Tensor y = grouped_matmul(x.to(d), w.to(d), counts_tensor(counts).to(d), tw);
      REQUIRE(y.device() == d);
      REQUIRE(y.dtype() == dt);
      check_close(y.to(Device()), grouped_matmul_ref(ref_of(x), ref_of(w), counts, tw), tol, "grouped_matmul");
      Tensor gw = grouped_matmul_weight_grad(x.to(d), dy.to(d), counts_tensor(counts, DType::i32).to(d), tw);
      check_close(gw.to(Device()), weight_grad_ref(ref_of(x), ref_of(dy), counts, tw), tol, "weight grad");
    }
  // Weights of 16 x 1024 f32 (two of them with the output tiles overflow the 256 KiB of VMEM)
  // run in column panels of 512.
  for (bool tw : {false, true}) {
    CAPTURE(tw);
    const std::vector<int64_t> wide{5, 0, 12};
    Tensor xw = uniform_input(g, {17, 16}), ww = uniform_input(g, tw ? Shape{3, 1024, 16} : Shape{3, 16, 1024}), dyw = uniform_input(g, {17, 1024});
    check_close(grouped_matmul(xw.to(d), ww.to(d), counts_tensor(wide).to(d), tw).to(Device()),
                grouped_matmul_ref(ref_of(xw), ref_of(ww), wide, tw), {1e-5, 1e-5}, "panels");
    check_close(grouped_matmul_weight_grad(xw.to(d), dyw.to(d), counts_tensor(wide).to(d), tw).to(Device()),
                weight_grad_ref(ref_of(xw), ref_of(dyw), wide, tw), {1e-5, 1e-5}, "weight grad panels");
  }
  // Every row in one group, and no rows at all (the weight gradient is then zero).
  Tensor x = uniform_input(g, {T, K}), w = uniform_input(g, {E, K, N}), dy = uniform_input(g, {T, N});
  const std::vector<int64_t> one{0, 0, T, 0, 0, 0};
  check_close(grouped_matmul(x.to(d), w.to(d), counts_tensor(one).to(d)).to(Device()),
              grouped_matmul_ref(ref_of(x), ref_of(w), one, false), {1e-5, 1e-5}, "one group");
  Tensor none = grouped_matmul_weight_grad(uniform_input(g, {0, K}).to(d), uniform_input(g, {0, N}).to(d),
                                           counts_tensor(std::vector<int64_t>(E, 0)).to(d));
  CHECK(none.shape() == Shape{E, K, N});
  CHECK(ref_of(none).v == std::vector<double>(static_cast<size_t>(E * K * N), 0.0));
  // Rows past the last group are never read: NaN rows after x's end in its buffer change nothing.
  Tensor padded = cat({x, full({8, K}, std::nan(""))}, 0).to(d);
  check_close(grouped_matmul_weight_grad(narrow(padded, 0, 0, T), dy.to(d), counts_tensor(counts).to(d)).to(Device()),
              weight_grad_ref(ref_of(x), ref_of(dy), counts, false), {1e-5, 1e-5}, "weight grad of a view");
  CHECK(moe_sim_fallbacks() == before);
  CHECK(probe.new_fallbacks() == 0);
  const codegen::CodegenStats st = codegen::stats();
  CHECK(st.runs_by_kernel.at("grouped_matmul") - runs0.first == 7);
  CHECK(st.runs_by_kernel.at("grouped_matmul_weight_grad") - runs0.second == 8);
  // A wrong count is an error on the chip too, not a wrong result.
  expect_error([&] { grouped_matmul(x.to(d), w.to(d), counts_tensor({2, 0, 2, 0, 0, 0}).to(d)); },
               {"grouped_matmul", "group_sizes", "sum to 4", "111 rows"});
  expect_error([&] { grouped_matmul(x.to(d), w.to(d), counts_tensor({2, 0, -1, 0, 0, T - 1}).to(d)); },
               {"group_sizes[2]", "-1", "negative"});
}

TEST_CASE("moe ops on the chip: new routings and token counts reuse the programs", "[moe][codegen][jit]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Generator g(14);
  const int64_t K = 8, N = 6, E = 4;
  Tensor w = uniform_input(g, {E, N, K}).to(d);
  auto layer = [&](const Tensor& x, const Tensor& gs) {
    Tensor y = grouped_matmul(x, w, gs, true);
    return grouped_matmul_weight_grad(x, y, gs, true);
  };
  const std::vector<std::vector<int64_t>> routings{{10, 0, 30, 1}, {0, 41, 0, 0}, {13, 13, 2, 13}};
  auto check_layer = [&](const Tensor& got, const Tensor& x, const std::vector<int64_t>& counts) {
    const Ref y = grouped_matmul_ref(ref_of(x), ref_of(w.to(Device())), counts, true);
    check_close(got.to(Device()), weight_grad_ref(ref_of(x), y, counts, true), {1e-4, 1e-5}, "layer");
  };
  // Eager: the first call builds the two programs; other routings and another token count build none.
  Tensor x0 = uniform_input(g, {41, K});
  check_layer(layer(x0.to(d), counts_tensor(routings[0]).to(d)), x0, routings[0]);
  ChipRunProbe::sync_all();
  const uint64_t built = codegen::stats().programs_built;
  for (const auto& r : routings) check_layer(layer(x0.to(d), counts_tensor(r).to(d)), x0, r);
  Tensor x1 = uniform_input(g, {7, K});
  const std::vector<int64_t> r1{3, 0, 0, 4};
  check_layer(layer(x1.to(d), counts_tensor(r1).to(d)), x1, r1);
  ChipRunProbe::sync_all();
  CHECK(codegen::stats().programs_built == built);
  // Compiled: one trace serves the three routings, and no program is built for them.
  auto f = compile(layer, CompileOptions{.name = "test_moe_ops_chip_routings"});
  const uint64_t before = moe_sim_fallbacks();
  for (const auto& r : routings) check_layer(f(x0.to(d), counts_tensor(r).to(d)), x0, r);
  ChipRunProbe::sync_all();
  CHECK(codegen::stats().programs_built == built);
  const jit::Stats st = jit::stats();
  const jit::FunctionStats* fs = st.find("test_moe_ops_chip_routings");
  REQUIRE(fs != nullptr);
  CHECK(fs->compiles == 1);
  CHECK(fs->hits == 2);
  // Another token count retraces the graph (its shapes changed) but builds no chip program.
  check_layer(f(x1.to(d), counts_tensor(r1).to(d)), x1, r1);
  ChipRunProbe::sync_all();
  CHECK(codegen::stats().programs_built == built);
  CHECK(moe_sim_fallbacks() == before);
}

TEST_CASE("moe ops on the chip: permute and unpermute match the naive loops", "[moe][codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Generator g(15);
  const int64_t T = 9, H = 6, k = 2;
  const uint64_t before = moe_sim_fallbacks();
  const auto runs0 = moe_kernel_runs("moe_permute", "moe_unpermute");
  for (DType dt : {DType::f32, DType::bf16})
    for (bool weighted : {true, false}) {
      CAPTURE(dtype_name(dt), weighted);
      Tensor x = uniform_input(g, {T, H}, dt), y = uniform_input(g, {T * k, H}, dt), w = uniform_input(g, {T, k});
      Tensor order = random_order(g, T * k, DType::i32);
      const std::vector<int64_t> ord = order.to_vector<int64_t>();
      Tensor xs = moe_permute(x.to(d), order.to(d), k);
      REQUIRE(xs.device() == d);
      CHECK(ref_of(xs).v == permute_ref(ref_of(x), ord, k).v);
      const Ref wr = ref_of(w);
      Tensor out = moe_unpermute(y.to(d), order.to(d), weighted ? w.to(d) : Tensor(), k);
      CHECK(out.dtype() == (weighted ? DType::f32 : dt));
      const Tol tol = dt == DType::f32 ? Tol{1e-6, 1e-6} : Tol{1e-2, 1e-2};
      check_close(out.to(Device()), unpermute_ref(ref_of(y), ord, weighted ? &wr : nullptr, k), tol, "unpermute");
      // The cpu kernel sums in the same order: f32 results are equal.
      if (dt == DType::f32)
        CHECK(out.to(Device()).to_vector<float>() ==
              moe_unpermute(y, order, weighted ? w : Tensor(), k).to_vector<float>());
    }
  // The gradient of a permute is an unpermute: both on the chip.
  Tensor x = uniform_input(g, {T, H});
  Tensor xd = x.to(d).requires_grad_();
  Tensor order = random_order(g, T * k, DType::i32);
  Tensor go = uniform_input(g, {T * k, H});
  moe_permute(xd, order.to(d), k).backward(go.to(d));
  check_close(xd.grad().to(Device()), unpermute_ref(ref_of(go), order.to_vector<int64_t>(), nullptr, k),
              {1e-6, 1e-6}, "permute grad");
  CHECK(moe_sim_fallbacks() == before);
  const auto runs1 = moe_kernel_runs("moe_permute", "moe_unpermute");
  CHECK(runs1.first - runs0.first == 5);
  CHECK(runs1.second - runs0.second == 5);
  expect_error([&] { moe_permute(x.to(d), counts_tensor({0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 0, 1, 2, 3, 4, 5, 6, 7}, DType::i32).to(d), 2); },
               {"moe_permute", "order holds"});
}

// Host fallbacks of one op on sim devices so far.
uint64_t moe_sim_fallbacks_of(const char* op) {
  uint64_t n = 0;
  for (const auto& c : ops::fallback_counts())
    if (c.device.type == DeviceType::sim && c.op == op) n += c.calls;
  return n;
}

TEST_CASE("moe routing on the chip: topk equals the cpu kernel (ties, NaN, -inf, k 1..4, bf16)", "[moe][codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Generator g(17);
  const uint64_t before = moe_sim_fallbacks_of("topk");
  const auto runs0 = moe_kernel_runs("topk", "topk");
  int launches = 0;
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t E : {4, 9, 16})
      for (int64_t k = 1; k <= std::min<int64_t>(4, E); ++k) {
        CAPTURE(dtype_name(dt), E, k);
        // Values from a small set (many ties), some NaN and -inf, on 13 + E rows (not a tile multiple).
        const int64_t T = 13 + E;
        std::vector<float> v(static_cast<size_t>(T * E));
        const std::vector<float> pool = {0.5f, -1.0f, 2.0f, 0.0f, -0.0f, 2.0f, NAN, -INFINITY, 0.25f};
        for (size_t i = 0; i < v.size(); ++i)
          v[i] = pool[static_cast<size_t>(std::fabs(uniform_input(g, {1}).item<float>()) * 1e4) % pool.size()];
        for (int64_t c = 0; c < E; ++c) v[static_cast<size_t>(c)] = NAN;                           // an all-NaN row
        for (int64_t c = 0; c < E; ++c) v[static_cast<size_t>(E + c)] = -INFINITY;                // an all -inf row
        Tensor x = from_vector(v, Shape{T, E}).to(dt);
        auto [cv, ci] = topk(x, k);
        auto [sv, si] = topk(x.to(d), k);
        ++launches;
        REQUIRE(si.dtype() == DType::i64);
        CHECK(si.to(Device()).to_vector<int64_t>() == ci.to_vector<int64_t>());
        const std::vector<float> a = sv.to(Device()).to(DType::f32).to_vector<float>(),
                                 b = cv.to(DType::f32).to_vector<float>();
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); ++i) {
          INFO("value " << i << ": " << a[i] << " vs " << b[i]);
          CHECK((std::isnan(a[i]) ? std::isnan(b[i]) : (a[i] == b[i] && std::signbit(a[i]) == std::signbit(b[i]))));
        }
      }
  // A strided view of rows (the router's logits of a wider matrix) and a 3-d input.
  Tensor w = uniform_input(g, {7, 12});
  Tensor view = narrow(w, 1, 2, 8);
  auto [vv, vi] = topk(narrow(w.to(d), 1, 2, 8), 3);
  CHECK(vi.to(Device()).to_vector<int64_t>() == std::get<1>(topk(view, 3)).to_vector<int64_t>());
  CHECK(vv.to(Device()).to_vector<float>() == std::get<0>(topk(view, 3)).to_vector<float>());
  Tensor y = uniform_input(g, {2, 5, 6});
  CHECK(std::get<1>(topk(y.to(d), 2)).to(Device()).to_vector<int64_t>() == std::get<1>(topk(y, 2)).to_vector<int64_t>());
  CHECK(moe_sim_fallbacks_of("topk") == before);
  const auto runs1 = moe_kernel_runs("topk", "topk");
  CHECK(int(runs1.first - runs0.first) == launches + 2);
  // A new token count reuses the program.
  const uint64_t built = codegen::stats().programs_built;
  topk(uniform_input(g, {3, 9}).to(d), 2);
  topk(uniform_input(g, {40, 9}).to(d), 2);
  CHECK(codegen::stats().programs_built == built);
}

TEST_CASE("moe routing on the chip: moe_sort equals the cpu kernel (stable, empty experts, E up to 16)", "[moe][codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Generator g(19);
  const uint64_t before = moe_sim_fallbacks_of("moe_sort");
  uint64_t built = 0;
  for (int64_t E : {1, 3, 8, 16})
    for (int64_t k = 1; k <= std::min<int64_t>(4, E); ++k)
      for (int64_t T : {1, 5, 13, 21}) {
        CAPTURE(E, k, T);
        // Ids skewed to the low experts (some experts empty), as i64 and as i32.
        std::vector<int64_t> v(static_cast<size_t>(T * k));
        for (auto& x : v) {
          const float u = std::fabs(uniform_input(g, {1}).item<float>());
          x = std::min<int64_t>(E - 1, static_cast<int64_t>(u * u * static_cast<float>(E)));
        }
        const Tensor ids = from_vector(v, Shape{T, k});
        auto [co, cs] = moe_sort(ids, E);
        for (DType dt : {DType::i64, DType::i32}) {
          auto [so, ss] = moe_sort(ids.to(dt).to(d), E);
          REQUIRE(so.device() == d);
          CHECK(so.to(Device()).to_vector<int64_t>() == co.to_vector<int64_t>());
          CHECK(ss.to(Device()).to_vector<int64_t>() == cs.to_vector<int64_t>());
        }
        // Stability against a naive loop: by expert, then by slot.
        std::vector<int64_t> want;
        for (int64_t e = 0; e < E; ++e)
          for (size_t i = 0; i < v.size(); ++i)
            if (v[i] == e) want.push_back(static_cast<int64_t>(i));
        CHECK(co.to_vector<int64_t>() == want);
        if (T == 13 && E == 16 && k == 4) built = codegen::stats().programs_built;
      }
  CHECK(moe_sim_fallbacks_of("moe_sort") == before);
  // Another routing and token count of the same E: no new program.
  REQUIRE(built > 0);
  moe_sort(counts_tensor({3, 0, 15, 15, 2, 7, 1}, DType::i32).to(d), 16);
  CHECK(codegen::stats().programs_built == built);
  expect_error([&] { moe_sort(counts_tensor({0, 4, 1}, DType::i32).to(d), 4); }, {"moe_sort", "out of range"});
}

// The figures of codegen/README.md: a Mixtral-shaped expert projection (512 slots of 4096 over 8
// experts of [14336, 4096], bf16, uneven routing) against one dense matmul of the same FLOPs on
// v5e-ideal, timing-only. Hidden; run with "[measure]".
TEST_CASE("moe ops on the chip: measure a Mixtral-shaped grouped matmul on v5e", "[.][measure]") {
  struct OnV5e {  // sim:1 on v5e-ideal, timing-only, for this test (tensors die first)
    std::string prev = device::sim_chip(1);
    OnV5e() {
      set_sim_chip("v5e-ideal", 1);
      codegen::set_timing_only(true);
    }
    ~OnV5e() {
      codegen::set_timing_only(false);
      try {
        set_sim_chip(prev, 1);
      } catch (...) {
      }
    }
  } chip;
  const Device d("sim:1");
  const int64_t T = 512, K = 4096, N = 14336, E = 8;
  const std::vector<int64_t> counts{100, 30, 90, 60, 50, 80, 40, 62};
  Tensor x = empty_tensor({T, K}, DType::bf16, d), w = empty_tensor({E, N, K}, DType::bf16, d);
  Tensor gs = counts_tensor(counts).to(d), wd = empty_tensor({N, K}, DType::bf16, d);
  const sim::ChipConfig& cfg = codegen::chip_config(d);
  const double peak = 2.0 * cfg.mxu.count * cfg.mxu.rows * cfg.mxu.cols, flops = 2.0 * T * K * N;
  auto cost = [&](const char* what, auto&& fn) {
    fn();  // builds the program
    ChipRunProbe p;
    fn();
    const double c = p.new_cycles();
    std::printf("%s: %.0f cycles, %.1f%% of the MXU peak, %.1f%% of the weight-read bound\n", what, c,
                100.0 * flops / (c * peak), 100.0 * double(E * N * K * 2) / (c * cfg.memory.hbm_bandwidth_gbps /
                                                                               cfg.clock_ghz));
  };
  cost("grouped_matmul (transposed)", [&] { (void)grouped_matmul(x, w, gs, true); });
  cost("dense linear, same FLOPs", [&] { (void)linear(x, wd, Tensor()); });
  Tensor dy = empty_tensor({T, N}, DType::bf16, d);
  cost("grouped_matmul_weight_grad", [&] { (void)grouped_matmul_weight_grad(x, dy, gs, true); });
}

// The routing of a Qwen3-30B-A3B-shaped layer (512 tokens, 128 experts, top 8) on v5e-ideal
// (executed: moe_sort's scatter reads the positions it computed). Hidden; run with "[measure]".
TEST_CASE("moe routing on the chip: measure a Qwen3-30B-A3B-shaped router on v5e", "[.][measure]") {
  const std::string prev = device::sim_chip(1);
  set_sim_chip("v5e-ideal", 1);
  {
    const Device d("sim:1");
    Generator g(3);
    Tensor logits = uniform_input(g, {512, 128}).to(d);
    auto cost = [&](const char* what, auto&& fn) {
      fn();  // builds the program
      ChipRunProbe p;
      fn();
      std::printf("%s: %.0f cycles\n", what, p.new_cycles());
    };
    Tensor ids = std::get<1>(topk(logits, 8));
    cost("topk [512, 128], k 8", [&] { (void)topk(logits, 8); });
    cost("moe_sort [512, 8] over 128 experts", [&] { (void)moe_sort(ids, 128); });
  }
  set_sim_chip(prev, 1);
}

TEST_CASE("moe ops: bad inputs are errors naming the argument", "[moe][errors]") {
  Generator g(13);
  Tensor x = uniform_input(g, {5, 4}), w = uniform_input(g, {3, 4, 2}), c = counts_tensor({2, 0, 3});
  expect_error([&] { grouped_matmul(reshape(x, {20}), w, c); }, {"grouped_matmul", "x must be 2-D"});
  expect_error([&] { grouped_matmul(x, reshape(w, {12, 2}), c); }, {"grouped_matmul", "w must be 3-D"});
  expect_error([&] { grouped_matmul(x, w, c, true); }, {"grouped_matmul", "in_features", "transposed"});
  expect_error([&] { grouped_matmul(x, w, counts_tensor({2, 3})); }, {"grouped_matmul", "group_sizes", "[2]"});
  expect_error([&] { grouped_matmul(x, w, c.to(DType::f32)); }, {"grouped_matmul", "group_sizes", "integer"});
  expect_error([&] { grouped_matmul(x.to(DType::i32), w, c); }, {"grouped_matmul", "x must be f32, bf16 or f16"});
  expect_error([&] { grouped_matmul(x, w, counts_tensor({3, -1, 3})); }, {"group_sizes[1]", "-1", "negative"});
  expect_error([&] { grouped_matmul(x, w, counts_tensor({2, 0, 4})); }, {"sum to 6", "5 rows"});
  expect_error([&] { grouped_matmul_weight_grad(x, uniform_input(g, {4, 2}), c); }, {"grouped_matmul_weight_grad", "same rows"});
  expect_error([&] { topk(x, 5); }, {"topk", "k = 5", "size 4"});
  expect_error([&] { moe_sort(counts_tensor({0, 3, 1}), 3); }, {"moe_sort", "index 3", "3 experts"});
  expect_error([&] { moe_sort(x, 3); }, {"moe_sort", "expert_ids", "integer"});
  expect_error([&] { moe_sort(c, 0); }, {"moe_sort", "num_experts must be positive"});
  expect_error([&] { moe_permute(x, counts_tensor({0, 1, 2, 3, 4, 5, 6, 7, 8, 8}), 2); },
               {"moe_permute", "order holds 8 twice", "permutation"});
  expect_error([&] { moe_permute(x, counts_tensor({0, 1, 2}), 1); }, {"moe_permute", "3 slots", "5 tokens"});
  expect_error([&] { moe_permute(x, counts_tensor({0, 1, 2}), 2); }, {"moe_permute", "top_k = 2", "divide"});
  Tensor y = uniform_input(g, {6, 4});
  expect_error([&] { moe_unpermute(y, counts_tensor({0, 1, 2, 3, 4, 5}), uniform_input(g, {2, 3}), 2); },
               {"moe_unpermute", "weights must be [tokens, top_k] = [3, 2]", "[2, 3]"});
  expect_error([&] { moe_unpermute(y, counts_tensor({0, 1, 2, 3, 4, 9}), Tensor(), 2); },
               {"moe_unpermute", "index 9"});
}

}  // namespace
}  // namespace tpu::testing
