// scaled_dot_product_attention: the OpInfo entry (naive loops in double as the reference; run on
// every device by test_opinfo.cpp and gradchecked by test_autograd_gradcheck.cpp), argument
// errors, and the nn attention module built on it.
#include <cmath>
#include <limits>

#include "opinfo.h"
#include "tpucore/autograd.h"
#include "tpucore/ops.h"

namespace tpu::testing {
namespace {

using L = Layout;

// Inputs {q, k, v, mask, params[causal, has_mask, scale_x1000 (0: default)]}.
struct SdpaCase {
  Shape q, k, v;
  bool causal = false;
  Shape mask{};  // empty: no mask
  int64_t scale_x1000 = 0;
  L layout = L::contiguous;
};

std::vector<SdpaCase> sdpa_cases() {
  return {
      {{4, 8}, {6, 8}, {6, 5}},
      {{2, 4, 5, 8}, {2, 2, 7, 8}, {2, 2, 7, 8}, true},                 // GQA 2, causal, Lq < Lk
      {{3, 6, 4}, {3, 4, 4}, {3, 4, 3}, true, {}, 0, L::transposed},     // causal, Lq > Lk
      {{1, 2, 3, 4}, {1, 2, 5, 4}, {1, 2, 5, 4}, false, {3, 5}, 0, L::sliced},  // broadcast mask
      {{2, 4, 3, 6}, {2, 1, 9, 6}, {2, 1, 9, 2}, false, {2, 4, 1, 9}, 250},    // MQA, mask per head
      {{2, 0, 8}, {2, 3, 8}, {2, 3, 8}},                                 // no queries
      {{6, 17, 16}, {3, 19, 16}, {3, 19, 16}, true, {}, 0, L::contiguous},  // ragged lengths
      {{1, 150, 8}, {1, 150, 8}, {1, 150, 4}, true},  // causal over several row blocks of the kernel
      {{2, 130, 4}, {1, 141, 4}, {1, 141, 4}, true},  // the same, Lq < Lk
      // Decode shapes (the kernel's few-row path): one query row per head, three query heads per
      // key/value head, a keep mask per sequence; head dims off the vector width.
      {{2, 6, 1, 64}, {2, 2, 40, 64}, {2, 2, 40, 64}, false, {2, 1, 1, 40}, 0, L::sliced},
      {{1, 3, 2, 20}, {1, 1, 11, 20}, {1, 1, 11, 24}, true},
      {{3, 4, 1, 33}, {3, 2, 7, 33}, {3, 2, 7, 17}, false, {3, 1, 1, 7}, 0, L::transposed},
      // The register-blocked rows (head dims 64 and 128): causal over a few rows, a mask broadcast
      // along the keys (column stride 0), ragged key counts off the vector width.
      {{1, 4, 3, 128}, {1, 2, 21, 128}, {1, 2, 21, 128}, true, {}, 0, L::transposed},
      {{2, 4, 1, 64}, {2, 2, 19, 64}, {2, 2, 19, 64}, false, {2, 1, 1, 1}},
      {{3, 2, 2, 64}, {3, 1, 33, 64}, {3, 1, 33, 64}, false, {3, 1, 2, 33}, 0, L::sliced},
  };
}

std::vector<OpSample> sdpa_samples(DType dt, Generator& g) {
  std::vector<OpSample> out;
  for (const SdpaCase& c : sdpa_cases()) {
    Tensor mask = ones(Shape{1}, TensorOptions(DType::boolean));
    if (c.mask.ndim()) {
      // Random keep/drop with the first key always kept (no row is fully masked).
      std::vector<uint8_t> m(static_cast<size_t>(c.mask.numel()));
      const int64_t lk = c.mask[c.mask.ndim() - 1];
      for (size_t i = 0; i < m.size(); ++i) m[i] = (int64_t(i) % lk == 0 || g.next_double() < 0.6) ? 1 : 0;
      std::vector<float> f(m.begin(), m.end());
      mask = from_vector(f, c.mask).to(DType::boolean);
    }
    out.push_back({fmt::format("{} q {} k {} v {}{}{}", layout_name(c.layout), c.q.str(), c.k.str(), c.v.str(),
                               c.causal ? " causal" : "", c.mask.ndim() ? " mask " + c.mask.str() : std::string()),
                   {make_input(g, c.q, dt, c.layout, -2.0, 2.0), make_input(g, c.k, dt, L::contiguous, -2.0, 2.0),
                    make_input(g, c.v, dt, c.layout, -2.0, 2.0), mask,
                    params({c.causal, c.mask.ndim() > 0, c.scale_x1000})}});
  }
  return out;
}

Tensor sdpa_run(const std::vector<Tensor>& in) {
  auto p = params_of(in[4]);
  std::optional<double> scale;
  if (p[2]) scale = double(p[2]) / 1000.0;
  Tensor r = scaled_dot_product_attention(in[0], in[1], in[2], p[1] ? in[3] : Tensor(), p[0] != 0, scale);
  CHECK(r.dtype() == in[0].dtype());
  return r;
}

// Naive loops: for each query head, batch and query row, softmax over keys, then the v average.
Ref sdpa_reference(const std::vector<Ref>& r, DType) {
  auto p = params_of(r[4]);
  const Ref &q = r[0], &k = r[1], &v = r[2], &mk = r[3];
  const int n = q.shape.ndim();
  const int64_t Lq = q.shape[n - 2], D = q.shape[n - 1], Lk = k.shape[n - 2], Dv = v.shape[n - 1];
  const int64_t hq = n >= 3 ? q.shape[n - 3] : 1, hk = n >= 3 ? k.shape[n - 3] : 1;
  const double scale = p[2] ? double(p[2]) / 1000.0 : 1.0 / std::sqrt(double(D));
  Shape os = q.shape;
  os[n - 1] = Dv;
  Ref out(os);
  Shape ss = q.shape;  // scores' shape, for the mask's broadcast
  ss[n - 1] = Lk;
  const int64_t nb = Lq ? q.numel() / (Lq * D) : 0;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t outer = b / hq, h = b % hq, bk = outer * hk + h / (hq / hk);
    for (int64_t i = 0; i < Lq; ++i) {
      std::vector<double> s(static_cast<size_t>(Lk));
      double mx = -INFINITY;
      for (int64_t j = 0; j < Lk; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q.v[size_t((b * Lq + i) * D + d)] * k.v[size_t((bk * Lk + j) * D + d)];
        double x = dot * scale;
        if (p[0] && j > i) x = -INFINITY;
        if (p[1]) {
          std::vector<int64_t> idx = unflatten(ss, (b * Lq + i) * Lk + j);
          if (mk.bcast(ss, idx) == 0) x = -INFINITY;
        }
        s[size_t(j)] = x;
        mx = std::max(mx, x);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t e = 0; e < Dv; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < Lk; ++j) acc += s[size_t(j)] / sum * v.v[size_t((bk * Lk + j) * Dv + e)];
        out.v[size_t((b * Lq + i) * Dv + e)] = acc;
      }
    }
  }
  return out;
}

OpInfoRegistrar reg_sdpa({
    .op = "scaled_dot_product_attention",
    .dtypes = {DType::f32, DType::bf16, DType::f16},
    .samples = sdpa_samples,
    .run = sdpa_run,
    .reference = sdpa_reference,
    .tol = [](DType t) { return t == DType::f32 ? Tol{5e-5, 5e-5} : default_tol(t); },
});

TEST_CASE("sdpa: bad arguments are tpu::Errors naming the op and shapes", "[attention]") {
  const Tensor q = randn({2, 4, 5, 8}), k = randn({2, 2, 7, 8}), v = randn({2, 2, 7, 8});
  expect_error([&] { (void)scaled_dot_product_attention(q, randn({2, 3, 7, 8}), randn({2, 3, 7, 8})); },
               {"scaled_dot_product_attention", "multiple", "[2, 3, 7, 8]"});
  expect_error([&] { (void)scaled_dot_product_attention(q, randn({2, 2, 7, 6}), v); }, {"head dim", "[2, 2, 7, 6]"});
  expect_error([&] { (void)scaled_dot_product_attention(q, k, randn({2, 2, 6, 8})); }, {"same length"});
  expect_error([&] { (void)scaled_dot_product_attention(q, k.to(DType::bf16), v); }, {"same dtype", "bf16"});
  expect_error([&] { (void)scaled_dot_product_attention(q.to(DType::i32), k.to(DType::i32), v.to(DType::i32)); },
               {"floating point"});
  expect_error([&] { (void)scaled_dot_product_attention(q, randn({2, 7, 8}), randn({2, 7, 8})); }, {"same rank"});
  expect_error([&] { (void)scaled_dot_product_attention(q, k, v, ones({5, 6}, TensorOptions(DType::boolean))); },
               {"mask", "[5, 6]", "broadcast"});
  expect_error([&] { (void)scaled_dot_product_attention(q, k, v, ones({5, 7})); }, {"mask must be bool"});
  expect_error([&] { (void)scaled_dot_product_attention(q, k, v, ones({5, 7}, TensorOptions(DType::boolean)), true); },
               {"causal"});
  // The runtime keeps working.
  CHECK(scaled_dot_product_attention(q, k, v).shape() == Shape{2, 4, 5, 8});
}

TEST_CASE("sdpa: gradients of q, k and v with grouped heads match the unfused formula", "[attention]") {
  Generator g(7);
  const Tensor q0 = randn({1, 4, 5, 8}, {}, &g), k0 = randn({1, 2, 6, 8}, {}, &g), v0 = randn({1, 2, 6, 4}, {}, &g);
  const Tensor w = randn({1, 4, 5, 4}, {}, &g);
  auto grads = [&](bool fused) {
    Tensor q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(), v = v0.detach().requires_grad_();
    Tensor o;
    if (fused) {
      o = scaled_dot_product_attention(q, k, v, {}, true);
    } else {
      auto rep = [](const Tensor& t) { return reshape(expand(unsqueeze(t, 2), Shape{1, 2, 2, 6, -1}), Shape{1, 4, 6, -1}); };
      Tensor s = mul(matmul(q, transpose(rep(k), -1, -2)), 1.0 / std::sqrt(8.0));
      s = masked_fill(s, triu(ones(Shape{5, 6}, TensorOptions(DType::boolean)), 1), -INFINITY);
      o = matmul(softmax(s, -1), rep(v));
    }
    sum(mul(o, w)).backward();
    return std::vector<Tensor>{q.grad(), k.grad(), v.grad()};
  };
  auto a = grads(true), b = grads(false);
  for (size_t i = 0; i < 3; ++i) {
    INFO("input " << i);
    REQUIRE(a[i].defined());
    check_near(a[i], dvals(b[i]), 1e-4);
  }
}

}  // namespace
}  // namespace tpu::testing
