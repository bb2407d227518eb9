// softmax, log_softmax, layer_norm, rms_norm: OpInfo entries with naive per-row references
// in double, stability for large inputs, optional weight/bias, and the error cases.
#include <cfloat>

#include "test_reduce_util.h"

namespace tpu::testing {
namespace {
using namespace red;
using L = Layout;

// out = f(row) applied to every row of x along dim d (all other indices fixed).
Ref along_dim(const Ref& x, int64_t dim, const std::function<std::vector<double>(const std::vector<double>&)>& f) {
  Ref out(x.shape);
  const int nd = x.shape.ndim();
  if (nd == 0) {
    out.v = f(x.v);
    return out;
  }
  const int d = static_cast<int>(dim < 0 ? dim + nd : dim);
  const int64_t k = x.shape[d];
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = unflatten(x.shape, i);
    if (idx[static_cast<size_t>(d)] != 0) continue;  // visit each row once, from its first element
    std::vector<double> row(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) {
      idx[static_cast<size_t>(d)] = j;
      row[static_cast<size_t>(j)] = x.at(idx);
    }
    auto res = f(row);
    for (int64_t j = 0; j < k; ++j) {
      idx[static_cast<size_t>(d)] = j;
      out.at(idx) = res[static_cast<size_t>(j)];
    }
  }
  return out;
}

std::vector<double> ref_softmax(const std::vector<double>& r, bool log) {
  double m = -INFINITY;
  for (double x : r) m = std::max(m, x);
  double s = 0;
  for (double x : r) s += std::exp(x - m);
  std::vector<double> o;
  for (double x : r) o.push_back(log ? x - m - std::log(s) : std::exp(x - m) / s);
  return o;
}

Tol float_result_tol(DType t) {
  if (!is_floating(t)) t = DType::f32;
  return t == DType::f32 ? Tol{2e-6, 2e-5} : default_tol(t);
}

OpInfo softmax_entry(const char* name, bool log) {
  return OpInfo{
      .op = name,
      .dtypes = every_dtype(),
      .samples =
          [](DType dt, Generator& g) {
            struct C {
              Shape s;
              L l;
              int64_t dim;
            };
            std::vector<C> cs = {{{4, 7}, L::contiguous, -1}, {{4, 7}, L::transposed, 1}, {{4, 7}, L::transposed, 0},
                                 {{3, 4, 5}, L::sliced, 1},   {{3, 4, 5}, L::expanded, 0}, {{3, 4, 5}, L::contiguous, -1},
                                 {{}, L::contiguous, 0},      {{}, L::contiguous, -1},    {{0, 5}, L::contiguous, 1},
                                 {{3, 0}, L::contiguous, 1},  {{1}, L::contiguous, 0},    {{2, 33}, L::sliced, -1},
                                 // contiguous, not the last dim (column blocks, ragged last block)
                                 {{3, 4, 5}, L::contiguous, 1}, {{6, 5}, L::contiguous, 0}, {{4, 1, 37}, L::contiguous, 1},
                                 {{2, 40, 70}, L::contiguous, -2}, {{5, 3, 1}, L::contiguous, 0}};
            if (dt == DType::f32 || dt == DType::bf16) {
              cs.push_back({{4, 5000}, L::contiguous, -1});
              cs.push_back({{300, 130}, L::contiguous, 1});
              cs.push_back({{130, 300}, L::transposed, 0});
            }
            std::vector<OpSample> out;
            for (const C& c : cs)
              out.push_back({fmt::format("{} {} dim {}", layout_name(c.l), c.s.str(), c.dim),
                             {make_input(g, c.s, dt, c.l, -6.0, 6.0), spec({c.dim})}});
            return out;
          },
      .run =
          [log](const std::vector<Tensor>& in) {
            const int64_t dim = spec_of(in[1])[0];
            Tensor r = log ? log_softmax(in[0], dim) : softmax(in[0], dim);
            CHECK(r.dtype() == (is_floating(in[0].dtype()) ? in[0].dtype() : DType::f32));
            return r;
          },
      .reference =
          [log](const std::vector<Ref>& r, DType) {
            return along_dim(r[0], spec_of(r[1])[0], [&](const std::vector<double>& row) { return ref_softmax(row, log); });
          },
      .tol = float_result_tol,
  };
}
OpInfoRegistrar reg_softmax(softmax_entry("softmax", false));
OpInfoRegistrar reg_log_softmax(softmax_entry("log_softmax", true));

// ---- layer_norm / rms_norm: inputs {x, weight, bias, spec[has_weight, has_bias, norm_dims]} ----
struct NormCase {
  Shape x;
  L layout;
  int norm_dims;
  bool w, b;
};
std::vector<NormCase> norm_cases(DType dt) {
  std::vector<NormCase> c = {
      {{4, 8}, L::contiguous, 1, true, true},    {{4, 8}, L::transposed, 1, true, false},
      {{3, 4, 5}, L::sliced, 2, false, true},    {{3, 4, 5}, L::expanded, 1, false, false},
      {{2, 3, 4, 5}, L::transposed, 2, true, true}, {{6}, L::contiguous, 1, true, true},
      {{5, 1}, L::contiguous, 1, true, true},    {{0, 4}, L::contiguous, 1, true, true},
      {{3, 33}, L::sliced, 1, true, false},      {{2, 3, 4}, L::contiguous, 3, true, true},
  };
  if (dt == DType::f32) {
    c.push_back({{64, 1024}, L::contiguous, 1, true, true});
    c.push_back({{100, 96}, L::transposed, 1, true, false});
  }
  return c;
}
std::vector<OpSample> norm_samples(DType dt, Generator& g) {
  std::vector<OpSample> out;
  for (const NormCase& c : norm_cases(dt)) {
    Shape ns;
    for (int i = c.x.ndim() - c.norm_dims; i < c.x.ndim(); ++i) ns.push_back(c.x[i]);
    // Weights in [0.5, 2) and a transposed weight when it is 2-D.
    Tensor w = make_input(g, ns, dt, ns.ndim() >= 2 ? L::transposed : L::contiguous, 0.5, 2.0);
    Tensor b = make_input(g, ns, dt, L::sliced, -1.0, 1.0);
    out.push_back({fmt::format("{} {} over {} dims{}{}", layout_name(c.layout), c.x.str(), c.norm_dims,
                               c.w ? " +weight" : "", c.b ? " +bias" : ""),
                   {make_input(g, c.x, dt, c.layout, -3.0, 3.0), w, b, spec({c.w, c.b, c.norm_dims})}});
  }
  return out;
}
Shape trailing(const Shape& s, int n) {
  Shape r;
  for (int i = s.ndim() - n; i < s.ndim(); ++i) r.push_back(s[i]);
  return r;
}

// Applies f to each row of the trailing n elements (row-major flattening); f returns the whole
// output row, so per-row statistics are computed once per row.
Ref per_row(const Ref& x, int n_dims, const std::function<std::vector<double>(const std::vector<double>&)>& f) {
  Ref out(x.shape);
  const int64_t n = trailing(x.shape, n_dims).numel();
  for (int64_t r = 0; n > 0 && r < x.numel() / n; ++r) {
    std::vector<double> row(x.v.begin() + r * n, x.v.begin() + (r + 1) * n);
    const std::vector<double> y = f(row);
    std::copy(y.begin(), y.end(), out.v.begin() + r * n);
  }
  return out;
}

OpInfoRegistrar reg_layer_norm({
    .op = "layer_norm",
    .dtypes = float_dtypes(),
    .samples = norm_samples,
    .run =
        [](const std::vector<Tensor>& in) {
          auto s = spec_of(in[3]);
          const int nd = static_cast<int>(s[2]);
          Tensor r = layer_norm(in[0], trailing(in[0].shape(), nd), s[0] ? in[1] : Tensor(), s[1] ? in[2] : Tensor());
          CHECK(r.dtype() == in[0].dtype());
          return r;
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          auto s = spec_of(r[3]);
          return per_row(r[0], static_cast<int>(s[2]), [&](const std::vector<double>& row) {
            const double n = static_cast<double>(row.size());
            double mu = 0, var = 0;
            for (double x : row) mu += x;
            mu /= n;
            for (double x : row) var += (x - mu) * (x - mu);
            var /= n;
            std::vector<double> y(row.size());
            for (size_t i = 0; i < row.size(); ++i) {
              y[i] = (row[i] - mu) / std::sqrt(var + 1e-5);
              if (s[0]) y[i] *= r[1].v[i];
              if (s[1]) y[i] += r[2].v[i];
            }
            return y;
          });
        },
    .tol = [](DType t) { return t == DType::f32 ? Tol{1e-5, 1e-5} : default_tol(t); },
});

OpInfoRegistrar reg_rms_norm({
    .op = "rms_norm",
    .dtypes = float_dtypes(),
    .samples = norm_samples,
    .run =
        [](const std::vector<Tensor>& in) {
          auto s = spec_of(in[3]);
          const int nd = static_cast<int>(s[2]);
          // Alternate between the default eps and an explicit one (the bias flag picks).
          std::optional<double> eps;
          if (s[1]) eps = 1e-3;
          Tensor r = rms_norm(in[0], trailing(in[0].shape(), nd), s[0] ? in[1] : Tensor(), eps);
          CHECK(r.dtype() == in[0].dtype());
          return r;
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          auto s = spec_of(r[3]);
          const double eps = s[1] ? 1e-3 : static_cast<double>(FLT_EPSILON);
          return per_row(r[0], static_cast<int>(s[2]), [&](const std::vector<double>& row) {
            double ms = 0;
            for (double x : row) ms += x * x;
            ms /= static_cast<double>(row.size());
            std::vector<double> y(row.size());
            for (size_t i = 0; i < row.size(); ++i) {
              y[i] = row[i] / std::sqrt(ms + eps);
              if (s[0]) y[i] *= r[1].v[i];
            }
            return y;
          });
        },
    .tol = [](DType t) { return t == DType::f32 ? Tol{1e-5, 1e-5} : default_tol(t); },
});

}  // namespace

TEST_CASE("softmax: stable for large inputs, -inf and NaN rows as PyTorch", "[softmax]") {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor x = from_vector(std::vector<float>{1000, 1001, 1002, -1000, -1001, -inf}, Shape{2, 3});
  auto p = softmax(x, 1).to_vector<float>();
  const double e1 = std::exp(-1.0), e2 = std::exp(-2.0);
  CHECK(p[2] == Approx(1 / (1 + e1 + e2)).epsilon(1e-6));
  CHECK(p[3] == Approx(1 / (1 + e1)).epsilon(1e-6));
  CHECK(p[5] == 0.0f);
  auto lp = log_softmax(x, 1).to_vector<float>();
  CHECK(lp[0] == Approx(-2 - std::log(1 + e1 + e2)).epsilon(1e-6));
  CHECK(lp[5] == -inf);
  Tensor all_ninf = full({1, 3}, -inf);
  for (float v : softmax(all_ninf, 1).to_vector<float>()) CHECK(std::isnan(v));
  Tensor with_nan = from_vector(std::vector<float>{1, std::nanf(""), 2});
  for (float v : softmax(with_nan, 0).to_vector<float>()) CHECK(std::isnan(v));
  CHECK(softmax(ones({}), 0).item<double>() == 1.0);
  CHECK(log_softmax(ones({}), -1).item<double>() == 0.0);
  // Rows sum to one.
  Generator g(7);
  Tensor y = softmax(make_input(g, {5, 300}, DType::f32, Layout::transposed, -20, 20), 0);
  for (float v : sum(y, {0}).to_vector<float>()) CHECK(v == Approx(1.0).epsilon(1e-5));
}

TEST_CASE("layer_norm/rms_norm: mixed weight dtype, eps and defaults", "[norm]") {
  Tensor x = from_vector(std::vector<float>{1, 2, 3, 4}, Shape{1, 4});
  auto y = layer_norm(x, {4}).to_vector<float>();
  const double sd = std::sqrt(1.25 + 1e-5);
  CHECK(y[0] == Approx(-1.5 / sd).epsilon(1e-6));
  CHECK(y[3] == Approx(1.5 / sd).epsilon(1e-6));
  auto y2 = layer_norm(x, {4}, {}, {}, 1.0).to_vector<float>();
  CHECK(y2[0] == Approx(-1.5 / std::sqrt(2.25)).epsilon(1e-6));
  // bf16 input with an f32 weight: the output keeps the input's dtype.
  Tensor w = from_vector(std::vector<float>{1, 2, 3, 4});
  Tensor yb = layer_norm(x.to(DType::bf16), {4}, w);
  CHECK(yb.dtype() == DType::bf16);
  CHECK(yb.to_vector<float>()[3] == Approx(4 * 1.5 / sd).epsilon(1e-2));
  // rms_norm's default eps is the f32 machine epsilon.
  Tensor z = zeros({2, 3});
  for (float v : rms_norm(z, {3}).to_vector<float>()) CHECK(v == 0.0f);
  auto r = rms_norm(x, {4}).to_vector<float>();
  CHECK(r[3] == Approx(4 / std::sqrt(7.5 + FLT_EPSILON)).epsilon(1e-6));
  // Constant rows normalize to zero (var = 0 -> 1/sqrt(eps) times 0).
  for (float v : layer_norm(full({3, 5}, 7.0f), {5}).to_vector<float>()) CHECK(v == 0.0f);
}

TEST_CASE("softmax/norm: errors name the op and shapes", "[softmax][norm][errors]") {
  expect_error([] { softmax(ones({2, 3}), 2); }, {"softmax", "dim 2"});
  expect_error([] { log_softmax(ones({2, 3}), -3); }, {"log_softmax", "-3"});
  expect_error([] { layer_norm(ones({2, 3}), {4}); }, {"layer_norm", "[4]", "[2, 3]"});
  expect_error([] { layer_norm(ones({2, 3}), {2, 3, 1}); }, {"layer_norm", "[2, 3, 1]"});
  expect_error([] { layer_norm(ones({2, 3}), {3}, ones({4})); }, {"layer_norm", "weight", "[4]", "[3]"});
  expect_error([] { layer_norm(ones({2, 3}), {3}, ones({3}), ones({2, 3})); }, {"layer_norm", "bias", "[2, 3]"});
  expect_error([] { layer_norm(ones({2, 3}, DType::i32), {3}); }, {"layer_norm", "i32"});
  expect_error([] { layer_norm(ones({2, 3}), {}); }, {"layer_norm", "at least one"});
  expect_error([] { rms_norm(ones({2, 3}), {2}); }, {"rms_norm", "[2]", "[2, 3]"});
  expect_error([] { rms_norm(ones({2, 3}), {3}, ones({3, 1})); }, {"rms_norm", "weight", "[3, 1]"});
  expect_error([] { rms_norm(ones({4}, DType::u8), {4}); }, {"rms_norm", "u8"});
  CHECK(layer_norm(ones({2, 3}), {3}).shape() == Shape{2, 3});
}

}  // namespace tpu::testing
