// var, std (with correction) and logsumexp: OpInfo entries with naive two-pass references in
// double, numerical stability for large values and a large offset, and error cases.
#include "test_reduce_util.h"

namespace tpu::testing {
namespace {
using namespace red;

double ref_var(const std::vector<double>& v, int64_t correction) {
  const double n = static_cast<double>(v.size());
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double mu = ref_sum(v) / n;
  double m2 = 0;
  for (double x : v) m2 += (x - mu) * (x - mu);
  return m2 / std::max(0.0, n - static_cast<double>(correction));
}

double ref_lse(const std::vector<double>& v) {
  if (v.empty()) return -std::numeric_limits<double>::infinity();
  double m = v[0];
  for (double x : v) m = std::max(m, x);
  if (std::isinf(m)) return m;
  double s = 0;
  for (double x : v) s += std::exp(x - m);
  return m + std::log(s);
}

// Tolerances: bf16/f16 results are rounded once; f32 var is accumulated in f32 blocks.
Tol stat_tol(DType t) { return t == DType::f32 ? Tol{1e-5, 2e-5} : default_tol(t); }

OpInfo var_entry(const char* name, bool is_std) {
  return OpInfo{
      .op = name,
      .dtypes = float_dtypes(),
      .samples =
          [](DType dt, Generator& g) {
            std::vector<OpSample> out;
            for (int64_t corr : {1, 0, 2}) {
              auto part = reduce_samples(dt, g, true, corr == 1, corr);
              for (auto& s : part) s.desc += fmt::format(" correction={}", corr);
              out.insert(out.end(), part.begin(), part.end());
            }
            return out;
          },
      .run =
          [is_std](const std::vector<Tensor>& in) {
            auto s = reduce_spec(spec_of(in[1]));
            Tensor r = is_std ? tpu::std(in[0], s.dims, s.extra, s.keepdim) : var(in[0], s.dims, s.extra, s.keepdim);
            CHECK(r.dtype() == in[0].dtype());
            return r;
          },
      .reference =
          [is_std](const std::vector<Ref>& r, DType) {
            auto s = reduce_spec(spec_of(r[1]));
            return reduce_ref(r[0], s.dims, s.keepdim, [&](const std::vector<double>& v) {
              const double x = ref_var(v, s.extra);
              return is_std ? std::sqrt(x) : x;
            });
          },
      .tol = stat_tol,
  };
}
OpInfoRegistrar reg_var(var_entry("var", false));
OpInfoRegistrar reg_std(var_entry("std", true));

OpInfoRegistrar reg_logsumexp({
    .op = "logsumexp",
    .dtypes = every_dtype(),
    // Values in [-8, 8) so that exp spans several orders of magnitude.
    .samples = [](DType dt, Generator& g) { return reduce_samples(dt, g, true, true, 0, -8.0, 8.0); },
    .run =
        [](const std::vector<Tensor>& in) {
          auto s = reduce_spec(spec_of(in[1]));
          Tensor r = logsumexp(in[0], s.dims, s.keepdim);
          CHECK(r.dtype() == (is_floating(in[0].dtype()) ? in[0].dtype() : DType::f32));
          return r;
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          auto s = reduce_spec(spec_of(r[1]));
          return reduce_ref(r[0], s.dims, s.keepdim, ref_lse);
        },
    .tol = [](DType t) { return stat_tol(is_floating(t) ? t : DType::f32); },  // ints compute in f32
});

}  // namespace

TEST_CASE("var/std: correction, single elements and large offsets", "[reduce]") {
  Tensor x = from_vector(std::vector<float>{1, 2, 3, 4}, Shape{2, 2});
  CHECK(var(x).item<double>() == Approx(5.0 / 3.0));
  CHECK(var(x, {}, 0).item<double>() == Approx(1.25));
  CHECK(tpu::std(x, {1}, 1).to_vector<float>()[0] == Approx(std::sqrt(0.5)));
  CHECK(var(x, {1}, 1, true).shape() == Shape{2, 1});
  CHECK(std::isnan(var(ones({1})).item<double>()));         // N - correction = 0 with m2 = 0
  CHECK(std::isinf(var(x, {1}, 2).to_vector<float>()[0]));  // m2 > 0 over 0
  CHECK(std::isnan(var(zeros({0})).item<double>()));
  // Catastrophic cancellation check: values 1e4 + {0, 1, 2, ...}.
  std::vector<float> v(100000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 10000.0f + static_cast<float>(i % 10);
  CHECK(var(from_vector(v), {}, 0).item<double>() == Approx(8.25).epsilon(1e-4));
}

TEST_CASE("logsumexp: stable for large values, infinities and NaN", "[reduce]") {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor big = from_vector(std::vector<float>{1000, 1000, 999});
  CHECK(logsumexp(big, {0}).item<double>() == Approx(1000 + std::log(2 + std::exp(-1.0))).epsilon(1e-6));
  CHECK(logsumexp(from_vector(std::vector<float>{-1000, -1000}), {0}).item<double>() ==
        Approx(-1000 + std::log(2.0)).epsilon(1e-6));
  CHECK(logsumexp(from_vector(std::vector<float>{-inf, -inf}), {0}).item<double>() == -inf);
  CHECK(logsumexp(from_vector(std::vector<float>{inf, 3}), {0}).item<double>() == inf);
  CHECK(std::isnan(logsumexp(from_vector(std::vector<float>{1, std::nanf("")}), {0}).item<double>()));
  CHECK(logsumexp(zeros({0, 2}), {0}).to_vector<float>() == std::vector<float>{-inf, -inf});
  CHECK(logsumexp(ones({3}, DType::i32), {0}).dtype() == DType::f32);
  // Split across threads: 200k equal values.
  CHECK(logsumexp(full({200000}, 5.0f), {}).item<double>() == Approx(5 + std::log(200000.0)).epsilon(1e-6));
}

TEST_CASE("var/std: integer inputs are an error naming the dtype", "[reduce][errors]") {
  expect_error([] { var(ones({2, 3}, DType::i32)); }, {"var", "i32", "[2, 3]"});
  expect_error([] { tpu::std(ones({2}, DType::u8)); }, {"std", "u8"});
  expect_error([] { var(ones({2, 3}), {3}); }, {"var", "dim 3"});
  expect_error([] { logsumexp(ones({2, 3}), {0, 0}); }, {"logsumexp", "more than once"});
}

}  // namespace tpu::testing
