// Multi-head attention (causal mask, grouped K/V heads, rotary embeddings) against a naive
// double-precision loop reference, its gradient against finite differences of that
// reference, causality, and argument errors.
#include "testing.h"
#include "tpucore/nn.h"

namespace tpu::testing {
namespace {

using Mat = std::vector<std::vector<double>>;  // [rows][cols]

Mat rows_of(const Tensor& t2d) {
  Ref r = ref_of(t2d);
  Mat m(static_cast<size_t>(r.shape[0]), std::vector<double>(static_cast<size_t>(r.shape[1])));
  for (int64_t i = 0; i < r.shape[0]; ++i)
    for (int64_t j = 0; j < r.shape[1]; ++j) m[i][j] = r.v[static_cast<size_t>(i * r.shape[1] + j)];
  return m;
}
Mat project(const Mat& x, const Mat& w) {  // x W^T
  Mat o(x.size(), std::vector<double>(w.size(), 0.0));
  for (size_t t = 0; t < x.size(); ++t)
    for (size_t j = 0; j < w.size(); ++j)
      for (size_t k = 0; k < w[j].size(); ++k) o[t][j] += x[t][k] * w[j][k];
  return o;
}

// One batch element of attention: x [T][E] -> [T][E].
Mat ref_attention(const Mat& x, const nn::MultiheadAttention& m, bool causal) {
  const int64_t h = m.opts.num_heads, hk = m.opts.num_kv_heads, d = m.head_dim;
  const size_t T = x.size();
  Mat q = project(x, rows_of(m.q_proj->weight)), k = project(x, rows_of(m.k_proj->weight)),
      v = project(x, rows_of(m.v_proj->weight));
  auto rope = [&](Mat& a, int64_t heads) {
    if (!m.opts.rotary) return;
    for (size_t p = 0; p < T; ++p)
      for (int64_t hh = 0; hh < heads; ++hh)
        for (int64_t i = 0; i < d / 2; ++i) {
          const double ang = static_cast<double>(p) * std::pow(m.opts.rope_base, -2.0 * i / static_cast<double>(d));
          double& x1 = a[p][hh * d + i];
          double& x2 = a[p][hh * d + i + d / 2];
          const double r1 = x1 * std::cos(ang) - x2 * std::sin(ang), r2 = x2 * std::cos(ang) + x1 * std::sin(ang);
          x1 = r1;
          x2 = r2;
        }
  };
  rope(q, h);
  rope(k, hk);
  Mat cat(T, std::vector<double>(static_cast<size_t>(h * d), 0.0));
  for (int64_t hh = 0; hh < h; ++hh) {
    const int64_t kv = hh / (h / hk);
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> s(T, -INFINITY);
      double mx = -INFINITY;
      for (size_t u = 0; u < T; ++u) {
        if (causal && u > t) continue;
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += q[t][hh * d + i] * k[u][kv * d + i];
        s[u] = dot / std::sqrt(static_cast<double>(d));
        mx = std::max(mx, s[u]);
      }
      double z = 0;
      for (size_t u = 0; u < T; ++u) z += std::isinf(s[u]) ? 0 : std::exp(s[u] - mx);
      for (size_t u = 0; u < T; ++u) {
        if (std::isinf(s[u])) continue;
        const double p = std::exp(s[u] - mx) / z;
        for (int64_t i = 0; i < d; ++i) cat[t][hh * d + i] += p * v[u][kv * d + i];
      }
    }
  }
  return project(cat, rows_of(m.out_proj->weight));
}

}  // namespace

TEST_CASE("attention: multi-head attention matches a loop reference (causal, GQA, rotary)", "[nn][attention]") {
  struct C {
    int64_t heads, kv_heads;
    bool causal, rotary;
  };
  for (const C& c : {C{2, 2, false, false}, C{4, 2, true, true}, C{4, 1, true, false}, C{2, 1, false, true}}) {
    INFO("heads " << c.heads << " kv " << c.kv_heads << " causal " << c.causal << " rotary " << c.rotary);
    Generator g(7);
    nn::MultiheadAttention mha(8, {.num_heads = c.heads, .num_kv_heads = c.kv_heads, .rotary = c.rotary}, &g);
    Tensor x = randn({2, 5, 8}, {}, &g).requires_grad_();
    Tensor out = mha.forward(x, c.causal);
    REQUIRE(out.shape() == Shape{2, 5, 8});
    for (int64_t b = 0; b < 2; ++b) {
      Mat want = ref_attention(rows_of(x.detach().select(0, b)), mha, c.causal);
      Mat got = rows_of(out.detach().select(0, b));
      for (size_t t = 0; t < 5; ++t)
        for (size_t j = 0; j < 8; ++j) CHECK(std::fabs(got[t][j] - want[t][j]) < 1e-4);
    }
    // d sum(w * out) / d x against central differences of the reference (batch element 0).
    Tensor w = rand({2, 5, 8}, {}, &g);
    sum(mul(out, w)).backward();
    Ref gx = ref_of(x.grad());
    Mat x0 = rows_of(x.detach().select(0, 0)), w0 = rows_of(w.select(0, 0));
    auto loss = [&](const Mat& xm) {
      Mat o = ref_attention(xm, mha, c.causal);
      double s = 0;
      for (size_t t = 0; t < 5; ++t)
        for (size_t j = 0; j < 8; ++j) s += o[t][j] * w0[t][j];
      return s;
    };
    for (size_t t = 0; t < 5; t += 2)
      for (size_t j = 0; j < 8; j += 3) {
        Mat xp = x0, xm = x0;
        xp[t][j] += 1e-5;
        xm[t][j] -= 1e-5;
        const double num = (loss(xp) - loss(xm)) / 2e-5;
        CHECK(std::fabs(gx.v[t * 8 + j] - num) < 1e-3 * (1 + std::fabs(num)));
      }
  }
}

TEST_CASE("attention: causal outputs do not depend on later positions, rotary keeps norms", "[nn][attention]") {
  Generator g(9);
  nn::MultiheadAttention mha(8, {.num_heads = 2, .rotary = true}, &g);
  Tensor x = randn({1, 6, 8}, {}, &g);
  Tensor y1 = mha.forward(x, true);
  Tensor x2 = x.clone();
  x2.select(1, 5).fill_(3.0);
  Tensor y2 = mha.forward(x2, true);
  CHECK(allclose(y1.narrow(1, 0, 5), y2.narrow(1, 0, 5), 1e-5, 1e-6));
  CHECK_FALSE(allclose(y1.narrow(1, 5, 1), y2.narrow(1, 5, 1)));
  Tensor r = nn::apply_rotary(x, 10000.0);
  CHECK(allclose(sum(mul(r, r), {-1}), sum(mul(x, x), {-1}), 1e-5, 1e-5));
}

TEST_CASE("attention: bad configurations and inputs are tpu::Errors", "[nn][attention]") {
  expect_error([] { nn::MultiheadAttention(10, {.num_heads = 3}); }, {"embed_dim 10", "num_heads 3"});
  expect_error([] { nn::MultiheadAttention(8, {.num_heads = 4, .num_kv_heads = 3}); }, {"num_kv_heads 3"});
  expect_error([] { nn::MultiheadAttention(6, {.num_heads = 2, .rotary = true}); }, {"rotary", "even"});
  nn::MultiheadAttention mha(8, {.num_heads = 2});
  expect_error([&] { mha.forward(randn({2, 8}), false); }, {"MultiheadAttention", "[2, 8]"});
  expect_error([&] { mha.forward(randn({1, 3, 8}), false, ones({3, 3})); }, {"mask", "bool"});
}

}  // namespace tpu::testing
