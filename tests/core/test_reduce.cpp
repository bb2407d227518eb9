// sum, mean, prod, all, any: OpInfo entries (naive references over indices in double),
// result dtypes, reductions over empty dims, and accuracy of long float sums.
#include "test_reduce_util.h"

namespace tpu::testing {
namespace {
using namespace red;

bool is_int_like(DType t) { return is_integral(t, true); }

// Tolerance of a float sum/mean over up to ~80k elements (f32 accumulates in lanes).
Tol sum_tol(DType t) {
  if (t == DType::f32) return {1e-4, 1e-5};
  return default_tol(t);
}

OpInfoRegistrar reg_sum({
    .op = "sum",
    .dtypes = every_dtype(),
    .samples = [](DType dt, Generator& g) { return reduce_samples(dt, g, true, true); },
    .run =
        [](const std::vector<Tensor>& in) {
          auto s = reduce_spec(spec_of(in[1]));
          Tensor r = sum(in[0], s.dims, s.keepdim);
          CHECK(r.dtype() == (is_int_like(in[0].dtype()) ? DType::i64 : in[0].dtype()));  // PyTorch: int64
          return r;
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          auto s = reduce_spec(spec_of(r[1]));
          return reduce_ref(r[0], s.dims, s.keepdim, [&](const std::vector<double>& v) {
            return ref_sum(v);
          });
        },
    .tol = sum_tol,
});

// sum(x, dtype=...): the input is converted to the requested dtype first (PyTorch's rule),
// extra = the requested dtype. Values lie in [0, 3): conversion to an integer type truncates;
// conversion to bf16 rounds each term (covered by the tolerance).
OpInfoRegistrar reg_sum_dtype({
    .op = "sum",
    .dtypes = every_dtype(),
    .samples =
        [](DType dt, Generator& g) {
          std::vector<OpSample> out;
          for (DType to : {DType::f32, DType::i32, DType::bf16, DType::u8}) {
            auto part = reduce_samples(dt, g, true, false, static_cast<int64_t>(to), 0.0, 3.0);
            for (auto& s : part) s.desc += fmt::format(" dtype={}", dtype_name(to));
            out.insert(out.end(), part.begin(), part.end());
          }
          return out;
        },
    .run =
        [](const std::vector<Tensor>& in) {
          auto s = reduce_spec(spec_of(in[1]));
          const auto to = static_cast<DType>(s.extra);
          Tensor r = sum(in[0], s.dims, s.keepdim, to);
          CHECK(r.dtype() == to);
          return r;
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          auto s = reduce_spec(spec_of(r[1]));
          const auto to = static_cast<DType>(s.extra);
          return reduce_ref(r[0], s.dims, s.keepdim, [&](const std::vector<double>& v) {
            double t = 0;
            for (double x : v) t += is_integral(to) ? std::trunc(x) : x;
            if (to == DType::u8) return static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(t)));
            return t;
          });
        },
    // bf16: each of up to 120 terms below 3 rounds by at most 2^-8 relative, and the result
    // (up to ~360) rounds once more.
    .tol = [](DType) { return Tol{1.0, 0.01}; },
});

OpInfoRegistrar reg_mean({
    .op = "mean",
    .dtypes = float_dtypes(),
    .samples = [](DType dt, Generator& g) { return reduce_samples(dt, g, true, true); },
    .run =
        [](const std::vector<Tensor>& in) {
          auto s = reduce_spec(spec_of(in[1]));
          Tensor r = mean(in[0], s.dims, s.keepdim);
          CHECK(r.dtype() == in[0].dtype());
          return r;
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          auto s = reduce_spec(spec_of(r[1]));
          return reduce_ref(r[0], s.dims, s.keepdim, ref_mean);
        },
    .tol = sum_tol,
});

OpInfoRegistrar reg_prod({
    .op = "prod",
    .dtypes = every_dtype(),
    // Values in [-1.5, 1.5) (ints: -2..1) over at most 120 elements per output stay in range.
    .samples = [](DType dt, Generator& g) { return reduce_samples(dt, g, true, false, 0, -1.5, 1.5); },
    .run =
        [](const std::vector<Tensor>& in) {
          auto s = reduce_spec(spec_of(in[1]));
          Tensor r = prod(in[0], s.dims, s.keepdim);
          CHECK(r.dtype() == (is_int_like(in[0].dtype()) ? DType::i64 : in[0].dtype()));  // PyTorch: int64
          return r;
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          auto s = reduce_spec(spec_of(r[1]));
          return reduce_ref(r[0], s.dims, s.keepdim, [&](const std::vector<double>& v) {
            double p = 1;
            for (double x : v) p *= x;
            return p;
          });
        },
    .tol = [](DType t) { return t == DType::f32 ? Tol{1e-6, 1e-5} : default_tol(t); },
});

OpInfo logical_entry(const char* name, bool is_all) {
  return OpInfo{
      .op = name,
      .dtypes = every_dtype(),
      // Values 0..2 so that zeros are common (ints: 0, 1; floats: [0, 2)) and both results occur.
      .samples = [](DType dt, Generator& g) { return reduce_samples(dt, g, true, true, 0, 0.0, 2.0); },
      .run =
          [is_all](const std::vector<Tensor>& in) {
            auto s = reduce_spec(spec_of(in[1]));
            Tensor r = is_all ? all(in[0], s.dims, s.keepdim) : any(in[0], s.dims, s.keepdim);
            CHECK(r.dtype() == (in[0].dtype() == DType::u8 ? DType::u8 : DType::boolean));  // PyTorch keeps uint8
            return r;
          },
      .reference =
          [is_all](const std::vector<Ref>& r, DType) {
            auto s = reduce_spec(spec_of(r[1]));
            return reduce_ref(r[0], s.dims, s.keepdim, [&](const std::vector<double>& v) {
              bool acc = is_all;
              for (double x : v) acc = is_all ? (acc && x != 0) : (acc || x != 0);
              return acc ? 1.0 : 0.0;
            });
          },
      .tol = [](DType) { return Tol{0, 0}; },
  };
}
OpInfoRegistrar reg_all(logical_entry("all", true));
OpInfoRegistrar reg_any(logical_entry("any", false));

}  // namespace

TEST_CASE("sum/mean/prod: identities over empty dims and result dtypes", "[reduce]") {
  Tensor e = zeros({0, 3});
  CHECK(sum(e).item<double>() == 0.0);
  CHECK(prod(e).item<double>() == 1.0);
  CHECK(std::isnan(mean(e).item<double>()));
  CHECK(sum(e, {0}).shape() == Shape{3});
  CHECK(all(e).item<bool>());
  CHECK(!any(e).item<bool>());
  // PyTorch's promotion: bool and integer sums and products are int64 (torch.sum, torch.prod);
  // an explicit dtype converts the input first.
  for (DType t : {DType::boolean, DType::u8, DType::i8, DType::i32, DType::i64}) {
    CHECK(sum(ones({4}, t)).dtype() == DType::i64);
    CHECK(sum(ones({2, 2}, t), {1}, true).dtype() == DType::i64);
    CHECK(prod(ones({4}, t)).dtype() == DType::i64);
  }
  CHECK(sum(ones({4}, DType::boolean)).item<int64_t>() == 4);
  CHECK(sum(full({3}, 100, DType::u8)).item<int>() == 300);  // no u8 overflow: i64 result
  CHECK(sum(full({3}, 100, DType::u8), {}, false, DType::u8).item<int>() == 300 % 256);
  CHECK(sum(ones({3}, DType::u8), {}, false, DType::i32).dtype() == DType::i32);
  CHECK(prod(full({4}, 3, DType::i8)).item<int>() == 81);
  // No i32 overflow: 3 * (2^31 - 1) and (2^31 - 1)^2 in closed form.
  const int64_t big = 2147483647;
  CHECK(sum(full({3}, big, DType::i32)).item<int64_t>() == 3 * big);
  CHECK(prod(full({2}, big, DType::i32)).item<int64_t>() == big * big);
  CHECK(sum(full({2, 3}, big, DType::i32), {1}).to_vector<int64_t>() == std::vector<int64_t>{3 * big, 3 * big});
  // Float inputs keep their dtype.
  CHECK(sum(ones({4}, DType::bf16)).dtype() == DType::bf16);
  CHECK(prod(ones({4}, DType::f32)).dtype() == DType::f32);
  CHECK(sum(ones({2, 3}), {0, 1}, true).shape() == Shape{1, 1});
  // Tensor methods.
  Tensor x = arange(6, DType::f32).reshape({2, 3});
  CHECK(x.sum({1}).to_vector<float>() == std::vector<float>{3, 12});
  CHECK(x.mean({0}, true).to_vector<float>() == std::vector<float>{1.5f, 2.5f, 3.5f});
  CHECK(x.sum().item<double>() == 15.0);
}

TEST_CASE("sum: long f32 sums stay accurate", "[reduce]") {
  // 2^22 copies of 0.1f: a naive f32 running sum drifts by percents; the result must be
  // within a few f32 ulps of the exact value.
  const int64_t n = int64_t{1} << 22;
  Tensor x = full({n}, 0.1f);
  const double exact = static_cast<double>(0.1f) * static_cast<double>(n);
  CHECK(std::fabs(sum(x).item<double>() - exact) <= exact * 1e-6);
  CHECK(std::fabs(mean(x).item<double>() - static_cast<double>(0.1f)) <= 1e-7);
  // Reduced over the last dim of many rows, and over the first dim (vertical path).
  Tensor y = full({64, 4096}, 0.1f);
  Tensor rows = sum(y, {1});
  Tensor cols = sum(y, {0});
  for (float v : rows.to_vector<float>()) CHECK(std::fabs(v - 409.6f) < 1e-3);
  for (float v : cols.to_vector<float>()) CHECK(std::fabs(v - 6.4f) < 1e-5);
}

TEST_CASE("all/any: NaN counts as true, any dtype", "[reduce]") {
  Tensor x = from_vector(std::vector<float>{0.0f, std::nanf("")});
  CHECK(any(x).item<bool>());
  CHECK(!all(x).item<bool>());
  CHECK(all(from_vector(std::vector<float>{std::nanf(""), -1.0f})).item<bool>());
  CHECK(all(ones({3, 2}, DType::bf16), {1}).to_vector<bool>() == std::vector<bool>{true, true, true});
  // As torch.all / torch.any: bool results, except uint8 in, uint8 0 / 1 out.
  Tensor u = from_vector(std::vector<uint8_t>{2, 0, 4, 8}, {2, 2});
  CHECK(all(u, {1}).dtype() == DType::u8);
  CHECK(all(u, {1}).to_vector<uint8_t>() == std::vector<uint8_t>{0, 1});
  CHECK(any(u, {1}).to_vector<uint8_t>() == std::vector<uint8_t>{1, 1});
  CHECK(all(u.to(DType::i8)).dtype() == DType::boolean);
}

TEST_CASE("mean: integer inputs are an error naming the dtype", "[reduce][errors]") {
  expect_error([] { mean(ones({2, 3}, DType::i32)); }, {"mean", "i32", "[2, 3]"});
  expect_error([] { mean(ones({2}, DType::boolean)); }, {"mean", "bool"});
  expect_error([] { sum(ones({2, 3}), {2}); }, {"sum", "dim 2", "out of range"});
  expect_error([] { sum(ones({2, 3}), {1, -1}); }, {"sum", "more than once"});
  expect_error([] { prod(ones({2, 3}), {-3}); }, {"prod", "-3"});
  expect_error([] { all(ones({}), {1}); }, {"all", "dim 1"});
  // The runtime keeps working after errors.
  CHECK(sum(ones({2, 3})).item<double>() == 6.0);
}

}  // namespace tpu::testing
