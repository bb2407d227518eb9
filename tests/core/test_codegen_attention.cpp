// The fused attention kernel on the simulated chip (tiny preset, so every shape tiles): values
// against naive loops in the test, causal and not, grouped KV heads, Lq != Lk, ragged lengths,
// views read in place; the scores never reach HBM; compiled graphs use the kernel; bad input
// is a tpu::Error and the device keeps working.
#include <cmath>

#include "codegen/attention_kernel.h"
#include "codegen_testing.h"
#include "tpucore/compile.h"
#include "tpucore/ops.h"

namespace tpu::testing {
namespace {

// out[b, h, i, :] = softmax_j(q_i . k_j * scale, j <= i if causal) v_j, in double.
std::vector<double> naive_sdpa(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  const auto qv = dvals(contiguous(q.to(DType::f32))), kv = dvals(contiguous(k.to(DType::f32))),
             vv = dvals(contiguous(v.to(DType::f32)));
  const int n = q.dim();
  const int64_t Lq = q.size(-2), D = q.size(-1), Lk = k.size(-2), Dv = v.size(-1);
  const int64_t hq = q.size(-3), hk = k.size(-3), nb = q.numel() / (Lq * D);
  (void)n;
  std::vector<double> out(static_cast<size_t>(nb * Lq * Dv));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t bk = (b / hq) * hk + (b % hq) / (hq / hk);
    for (int64_t i = 0; i < Lq; ++i) {
      std::vector<double> s(static_cast<size_t>(Lk));
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < Lk; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qv[size_t((b * Lq + i) * D + d)] * kv[size_t((bk * Lk + j) * D + d)];
        s[size_t(j)] = causal && j > i ? -INFINITY : dot * scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t e = 0; e < Dv; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < Lk; ++j) acc += s[size_t(j)] / sum * vv[size_t((bk * Lk + j) * Dv + e)];
        out[size_t((b * Lq + i) * Dv + e)] = acc;
      }
    }
  }
  return out;
}

void check_vs(const Tensor& got, const std::vector<double>& want, double atol, double rtol) {
  const auto g = dvals(got.to(Device("cpu")).to(DType::f32));
  REQUIRE(g.size() == want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - want[i]) <= atol + rtol * std::fabs(want[i]))) {
      if (bad == 0) INFO("first mismatch at " << i << ": got " << g[i] << " want " << want[i]);
      ++bad;
    }
  CHECK(bad == 0);
}

struct AttentionCase {
  Shape q, k, v;
  bool causal;
};

TEST_CASE("codegen attention: fused kernel on the tiny chip matches naive loops", "[attention][codegen]") {
  TinySim tiny;
  const std::vector<AttentionCase> cases = {
      {{1, 1, 16, 8}, {1, 1, 16, 8}, {1, 1, 16, 8}, false},
      {{1, 2, 37, 16}, {1, 2, 37, 16}, {1, 2, 37, 16}, true},     // ragged, causal
      {{2, 4, 21, 8}, {2, 2, 45, 8}, {2, 2, 45, 12}, false},      // GQA 2, Lq < Lk, Dv != D
      {{1, 6, 40, 8}, {1, 2, 23, 8}, {1, 2, 23, 8}, true},        // GQA 3, causal, Lq > Lk
      {{1, 2, 33, 20}, {1, 1, 50, 20}, {1, 1, 50, 9}, true},      // MQA, head dim over the array rows
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    Generator g(11);
    for (const AttentionCase& c : cases) {
      DYNAMIC_SECTION(dtype_name(dt) << " q " << c.q.str() << " k " << c.k.str() << (c.causal ? " causal" : "")) {
        const Tensor q = randn(c.q, {}, &g).to(dt), k = randn(c.k, {}, &g).to(dt), v = randn(c.v, {}, &g).to(dt);
        const double scale = 1.0 / std::sqrt(double(c.q[3]));
        ChipRunProbe probe;
        const Tensor got = scaled_dot_product_attention(q.to(tiny.dev()), k.to(tiny.dev()), v.to(tiny.dev()), {},
                                                        c.causal);
        CHECK(got.device() == tiny.dev());
        CHECK(got.dtype() == dt);
        CHECK(probe.new_runs() >= 1);
        CHECK(probe.new_fallbacks() == 0);
        CHECK(probe.new_cycles() > 0);
        const auto want = naive_sdpa(q, k, v, c.causal, scale);
        if (dt == DType::f32) check_vs(got, want, 2e-5, 2e-5);
        else check_vs(got, want, 2e-2, 2e-2);
      }
    }
  }
}

TEST_CASE("codegen attention: a bool mask runs in the fused kernel", "[attention][codegen]") {
  TinySim tiny;
  Generator g(17);
  const Tensor q = randn({2, 4, 19, 8}, {}, &g), k = randn({2, 2, 37, 8}, {}, &g), v = randn({2, 2, 37, 8}, {}, &g);
  // Per batch and query, shared by the heads: [2, 1, 19, 37]; key 0 always kept. Then a padding
  // mask over keys only, [2, 1, 1, 37] (broadcast over queries: row stride 0).
  for (const Shape& ms : {Shape{2, 1, 19, 37}, Shape{2, 1, 1, 37}}) {
    std::vector<float> m(size_t(ms.numel()));
    for (size_t i = 0; i < m.size(); ++i) m[i] = (int64_t(i) % 37 == 0 || g.next_double() < 0.5) ? 1.0f : 0.0f;
    const Tensor mask = from_vector(m, ms).to(DType::boolean);
    for (DType dt : {DType::f32, DType::bf16}) {
      INFO("mask " << ms.str() << " " << dtype_name(dt));
      const Tensor qd = q.to(dt), kd = k.to(dt), vd = v.to(dt);
      ChipRunProbe probe;
      const Tensor got = scaled_dot_product_attention(qd.to(tiny.dev()), kd.to(tiny.dev()), vd.to(tiny.dev()),
                                                      mask.to(tiny.dev()));
      CHECK(probe.new_fallbacks() == 0);
      CHECK(probe.new_runs() >= 1);
      const Tensor want = scaled_dot_product_attention(qd.to(DType::f32), kd.to(DType::f32), vd.to(DType::f32), mask);
      if (dt == DType::f32) check_vs(got, dvals(want), 2e-5, 2e-5);
      else check_vs(got, dvals(want), 2e-2, 2e-2);
    }
  }
}

// A query row with every key masked is NaN on the cpu (as in PyTorch's softmax over all -inf);
// the chip gives NaN there too, eager and compiled, and the other rows keep their values (rows
// whose kept keys all sit in a later key block, or only in the first, included).
TEST_CASE("codegen attention: a fully masked query row gives NaN as on the cpu", "[attention][codegen]") {
  TinySim tiny;
  Generator g(23);
  const int64_t Lq = 19, Lk = 37;
  const Tensor q = randn({2, 2, Lq, 8}, {}, &g), k = randn({2, 2, Lk, 8}, {}, &g), v = randn({2, 2, Lk, 8}, {}, &g);
  std::vector<float> m(size_t(2 * Lq * Lk));
  std::vector<bool> dead(size_t(2 * Lq));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < Lq; ++i) {
      const bool none = i % 5 == 1 + b || i == Lq - 1;
      dead[size_t(b * Lq + i)] = none;
      for (int64_t j = 0; j < Lk; ++j) {
        bool keep = g.next_double() < 0.4;
        if (i % 4 == 0) keep = j >= 32;  // only the last key block
        if (i % 4 == 2) keep = j < 3;    // only the first
        m[size_t((b * Lq + i) * Lk + j)] = !none && keep ? 1.0f : 0.0f;
      }
    }
  const Tensor mask = from_vector(m, Shape{2, 1, Lq, Lk}).to(DType::boolean);
  auto compare = [&](const Tensor& got, const Tensor& want, double tol) {
    const auto gv = dvals(got.to(Device("cpu")).to(DType::f32)), wv = dvals(want);
    REQUIRE(gv.size() == wv.size());
    int64_t bad = 0, nans = 0;
    for (size_t e = 0; e < gv.size(); ++e) {
      const bool row_dead = dead[size_t(int64_t(e) / (2 * Lq * 8) * Lq + int64_t(e) / 8 % Lq)];
      CHECK(std::isnan(wv[e]) == row_dead);  // the reference itself behaves like PyTorch
      nans += std::isnan(gv[e]);
      const bool ok = std::isnan(wv[e]) ? std::isnan(gv[e]) : std::fabs(gv[e] - wv[e]) <= tol + tol * std::fabs(wv[e]);
      if (!ok && bad++ == 0) INFO("first mismatch at " << e << ": got " << gv[e] << " want " << wv[e]);
    }
    CHECK(bad == 0);
    CHECK(nans > 0);
  };
  auto f = compile([](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& mk) {
    return scaled_dot_product_attention(mul(a, 1.0), b, c, mk);
  }, {.name = "sdpa_dead_rows"});
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    const Tensor qd = q.to(dt), kd = k.to(dt), vd = v.to(dt);
    const Tensor want = scaled_dot_product_attention(qd.to(DType::f32), kd.to(DType::f32), vd.to(DType::f32), mask);
    const double tol = dt == DType::f32 ? 2e-5 : 2e-2;
    const Tensor sq = qd.to(tiny.dev()), sk = kd.to(tiny.dev()), sv = vd.to(tiny.dev()), sm = mask.to(tiny.dev());
    ChipRunProbe probe;
    compare(scaled_dot_product_attention(sq, sk, sv, sm), want, tol);
    (void)f(sq, sk, sv, sm);
    compare(f(sq, sk, sv, sm), want, tol);
    CHECK(probe.new_fallbacks() == 0);
    CHECK(probe.new_runs() >= 3);
  }
}

TEST_CASE("codegen attention: heads split out of a projection are read in place", "[attention][codegen]") {
  TinySim tiny;
  Generator g(3);
  // x [1, T, H * d] -> [1, H, T, d] by reshape + transpose: rows strided by H * d.
  const Tensor xq = randn({1, 29, 4 * 8}, {}, &g), xk = randn({1, 29, 2 * 8}, {}, &g), xv = randn({1, 29, 2 * 8}, {}, &g);
  auto heads = [](const Tensor& x, int64_t h) { return transpose(reshape(x, Shape{1, 29, h, 8}), 1, 2); };
  ChipRunProbe probe;
  const Tensor got = scaled_dot_product_attention(heads(xq.to(tiny.dev()), 4), heads(xk.to(tiny.dev()), 2),
                                                  heads(xv.to(tiny.dev()), 2), {}, true);
  CHECK(probe.new_fallbacks() == 0);
  check_vs(got, naive_sdpa(heads(xq, 4), heads(xk, 2), heads(xv, 2), true, 1.0 / std::sqrt(8.0)), 2e-5, 2e-5);
}

TEST_CASE("codegen attention: the score matrix never goes to HBM", "[attention][codegen]") {
  TinySim tiny;
  const int64_t heads = 2, L = 96, D = 8;
  Generator g(5);
  const Tensor q = randn({1, heads, L, D}, {}, &g).to(DType::bf16).to(tiny.dev());
  const Tensor k = randn({1, heads, L, D}, {}, &g).to(DType::bf16).to(tiny.dev());
  const Tensor v = randn({1, heads, L, D}, {}, &g).to(DType::bf16).to(tiny.dev());
  for (bool causal : {false, true}) {
    ChipRunProbe::sync_all();
    codegen::reset_stats();
    const Tensor o = scaled_dot_product_attention(q, k, v, {}, causal);
    ChipRunProbe::sync_all();
    const codegen::CodegenStats s = codegen::stats();
    INFO("causal " << causal << ": HBM bytes " << s.hbm_bytes);
    CHECK(s.runs == 1);
    CHECK(s.runs_by_kernel.count("scaled_dot_product_attention") == 1);
    CHECK(double(s.hbm_bytes) < double(L * L * 4 * heads) * 0.75);
    // At least q, k, v read and o written once.
    CHECK(s.hbm_bytes >= uint64_t(4 * heads * L * D * 2));
  }
}

TEST_CASE("codegen attention: causal skips the blocks above the diagonal", "[attention][codegen]") {
  TinySim tiny;
  const Tensor q = randn({1, 1, 128, 8}).to(tiny.dev()), k = randn({1, 1, 128, 8}).to(tiny.dev()),
               v = randn({1, 1, 128, 8}).to(tiny.dev());
  auto mxu_flops = [&](bool causal) {
    ChipRunProbe::sync_all();
    codegen::reset_stats();
    (void)scaled_dot_product_attention(q, k, v, {}, causal);
    ChipRunProbe::sync_all();
    return codegen::stats().mxu_flops;
  };
  const double full = mxu_flops(false), causal = mxu_flops(true);
  CHECK(full == 2.0 * 2 * 128 * 128 * 8);
  CHECK(causal < 0.6 * full);
}

TEST_CASE("codegen attention: compiled graphs run the fused kernel", "[attention][codegen]") {
  TinySim tiny;
  Generator g(9);
  const Tensor q = randn({1, 4, 24, 8}, {}, &g), k = randn({1, 2, 24, 8}, {}, &g), v = randn({1, 2, 24, 8}, {}, &g);
  auto f = compile([](const Tensor& a, const Tensor& b, const Tensor& c) {
    return scaled_dot_product_attention(mul(a, 1.0), b, c, {}, true);
  }, {.name = "sdpa_compiled"});
  const Tensor qd = q.to(tiny.dev()), kd = k.to(tiny.dev()), vd = v.to(tiny.dev());
  (void)f(qd, kd, vd);
  ChipRunProbe::sync_all();
  const uint64_t before = codegen::stats().runs_by_kernel["scaled_dot_product_attention"];
  ChipRunProbe probe;
  const Tensor got = f(qd, kd, vd);
  CHECK(probe.new_fallbacks() == 0);
  ChipRunProbe::sync_all();
  CHECK(codegen::stats().runs_by_kernel["scaled_dot_product_attention"] == before + 1);
  check_vs(got, naive_sdpa(q, k, v, true, 1.0 / std::sqrt(8.0)), 2e-5, 2e-5);
}

TEST_CASE("codegen attention: bad input on sim is a tpu::Error and the device keeps working", "[attention][codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  const Tensor q = randn({1, 3, 8, 8}).to(d), k = randn({1, 2, 8, 8}).to(d), v = randn({1, 2, 8, 8}).to(d);
  expect_error([&] { (void)scaled_dot_product_attention(q, k, v); }, {"scaled_dot_product_attention", "multiple"});
  expect_error([&] { (void)scaled_dot_product_attention(randn({1, 2, 8, 4}).to(d), k, v); }, {"head dim"});
  expect_error([&] { (void)scaled_dot_product_attention(randn({1, 2, 8, 8}).to(DType::bf16).to(d), k, v); },
               {"same dtype"});
  // Degenerate shapes take the host fallback and agree with the cpu: no keys gives zeros, an
  // empty head dim gives the plain average of v.
  const Tensor v3 = randn({1, 2, 3, 4});
  check_vs(scaled_dot_product_attention(randn({1, 2, 5, 0}).to(d), randn({1, 2, 3, 0}).to(d), v3.to(d)),
           dvals(scaled_dot_product_attention(randn({1, 2, 5, 0}), randn({1, 2, 3, 0}), v3)), 1e-6, 1e-6);
  const Tensor none = scaled_dot_product_attention(randn({1, 2, 5, 4}).to(d), randn({1, 2, 0, 4}).to(d),
                                                   randn({1, 2, 0, 6}).to(d));
  CHECK(none.shape() == Shape{1, 2, 5, 6});
  check_vs(none, std::vector<double>(60, 0.0), 0, 0);
  const Tensor q2 = randn({1, 2, 8, 8});
  const Tensor got = scaled_dot_product_attention(q2.to(d), k, v, {}, true);
  check_vs(got, naive_sdpa(q2, k.to(Device("cpu")), v.to(Device("cpu")), true, 1.0 / std::sqrt(8.0)), 2e-5, 2e-5);
}

}  // namespace
}  // namespace tpu::testing

namespace tpu::testing {
namespace {

// A small decoder layer shaped like the Qwen3 benchmark's (RMSNorm, q/k/v projections, per-head
// q/k RMSNorm, RoPE, causal GQA attention, o projection, residual, SwiGLU
// MLP, residual), compiled on sim:0, against the same function run eagerly on the cpu.
TEST_CASE("codegen attention: a compiled decoder layer on sim matches the cpu", "[attention][codegen]") {
  const int64_t T = 40, E = 64, H = 4, HK = 2, D = 16, F = 96;
  Generator g(21);
  auto w = [&](Shape s, double sc) { return mul(randn(s, {}, &g), sc); };
  const Tensor x = randn({T, E}, {}, &g), n1 = add(w({E}, 0.1), 1.0), n2 = add(w({E}, 0.1), 1.0),
               qn = add(w({D}, 0.1), 1.0), kn = add(w({D}, 0.1), 1.0), wq = w({H * D, E}, 0.125),
               wk = w({HK * D, E}, 0.125), wv = w({HK * D, E}, 0.125), wo = w({E, H * D}, 0.125),
               wg = w({F, E}, 0.125), wu = w({F, E}, 0.125), wd = w({E, F}, 0.1);
  std::vector<float> c(size_t(T * D)), s(size_t(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i) {
      const double ang = double(t) * std::pow(10000.0, -2.0 * double(i % (D / 2)) / double(D));
      c[size_t(t * D + i)] = float(std::cos(ang));
      s[size_t(t * D + i)] = float(std::sin(ang));
    }
  const Tensor ct = from_vector(c, Shape{T, D}), st = from_vector(s, Shape{T, D});
  auto layer = [](const std::vector<Tensor>& p) {
    const Tensor& in = p[0];
    auto heads = [&](const Tensor& y, int64_t n, const Tensor& nw) {
      Tensor f = rms_norm(reshape(y, {T * n, D}), {D}, nw, 1e-6);
      return rotary_embedding(transpose(reshape(f, {1, T, n, D}), 1, 2), p[12], p[13]);
    };
    Tensor h = rms_norm(in, {E}, p[1], 1e-6);
    Tensor q = heads(linear(h, p[5]), H, p[3]);
    Tensor k = heads(linear(h, p[6]), HK, p[4]);
    Tensor v = transpose(reshape(linear(h, p[7]), {1, T, HK, D}), 1, 2);
    Tensor a = scaled_dot_product_attention(q, k, v, {}, true);
    Tensor x1 = add(in, linear(reshape(transpose(a, 1, 2), {T, H * D}), p[8]));
    Tensor h2 = rms_norm(x1, {E}, p[2], 1e-6);
    return add(x1, linear(mul(silu(linear(h2, p[9])), linear(h2, p[10])), p[11]));
  };
  const std::vector<Tensor> params{x, n1, n2, qn, kn, wq, wk, wv, wo, wg, wu, wd, ct, st};
  const Tensor want = layer(params);
  std::vector<Tensor> dev;
  for (const Tensor& t : params) dev.push_back(t.defined() ? t.to(Device("sim:0")) : t);
  auto f = compile([&](const Tensor& in) {
    std::vector<Tensor> p = dev;
    p[0] = in;
    return layer(p);
  }, {.name = "decoder_layer_test"});
  (void)f(dev[0]);
  ChipRunProbe probe;
  const Tensor got = f(dev[0]);
  CHECK(probe.new_fallbacks() == 0);
  ChipRunProbe::sync_all();
  CHECK(codegen::stats().runs_by_kernel["scaled_dot_product_attention"] >= 2);
  check_vs(got, dvals(want), 1e-4, 1e-4);
}

}  // namespace
}  // namespace tpu::testing
