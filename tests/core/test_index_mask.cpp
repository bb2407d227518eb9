// masked_fill, tril/triu, one_hot: OpInfo entries with naive references and error cases.
#include "index_test_util.h"

namespace tpu::testing {
namespace {

using L = Layout;

// The fill value used for each dtype (exact in every float type).
double fill_value(DType dt) {
  if (dt == DType::boolean) return 1;
  if (is_integral(dt)) return 7;
  return -3.25;
}
Scalar fill_scalar(DType dt) {
  if (dt == DType::boolean) return Scalar(true);
  if (is_integral(dt)) return Scalar(7);
  return Scalar(-3.25);
}

OpInfoRegistrar reg_masked_fill({
    .op = "masked_fill",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          auto mask = [&](const Shape& s, L l) { return make_input(g, s, DType::boolean, l); };
          return std::vector<OpSample>{
              {"same shape", {mk({3, 4}, L::contiguous), mask({3, 4}, L::contiguous)}},
              {"transposed x, broadcast row mask", {mk({3, 4}, L::transposed), mask({4}, L::sliced)}},
              {"sliced x, column mask", {mk({3, 4}, L::sliced), mask({3, 1}, L::contiguous)}},
              {"expanded x, transposed mask", {mk({3, 4}, L::expanded), mask({3, 4}, L::transposed)}},
              {"mask broadcasts x up", {mk({3, 4}, L::contiguous), mask({2, 3, 4}, L::expanded)}},
              {"0-d", {mk({}, L::contiguous), mask({}, L::contiguous)}},
              {"zero-size", {mk({0, 4}, L::contiguous), mask({4}, L::contiguous)}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return masked_fill(in[0], in[1], fill_scalar(in[0].dtype())); },
    .reference =
        [](const std::vector<Ref>& r, DType dt) {
          const double v = fill_value(dt);
          return ref_map({r[0], r[1]}, [v](const std::vector<double>& a) { return a[1] != 0 ? v : a[0]; });
        },
    .tol = exact_tol,
});

Ref triangle_reference(const std::vector<Ref>& r, bool lower) {
  const Ref& x = r[0];
  const int64_t diag = params_of(r[1])[0];
  Ref o = x;
  const int nd = x.shape.ndim();
  for (int64_t f = 0; f < o.numel(); ++f) {
    auto pos = unflatten(x.shape, f);
    const int64_t i = pos[static_cast<size_t>(nd - 2)], j = pos[static_cast<size_t>(nd - 1)];
    const bool keep = lower ? j - i <= diag : j - i >= diag;
    if (!keep) o.v[static_cast<size_t>(f)] = 0;
  }
  return o;
}

std::vector<OpSample> triangle_samples(DType dt, Generator& g) {
  auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
  return {
      {"[4, 5] diagonal 0", {mk({4, 5}, L::contiguous), params({0})}},
      {"transposed [5, 3] diagonal -1", {mk({5, 3}, L::transposed), params({-1})}},
      {"batched sliced diagonal 2", {mk({2, 3, 4}, L::sliced), params({2})}},
      {"expanded diagonal -10", {mk({3, 4}, L::expanded), params({-10})}},
      {"4-D diagonal 10", {mk({2, 2, 3, 3}, L::contiguous), params({10})}},
      {"4-D diagonal 1", {mk({2, 1, 3, 4}, L::transposed), params({1})}},
      {"zero rows", {mk({0, 3}, L::contiguous), params({0})}},
      {"zero cols", {mk({3, 0}, L::contiguous), params({0})}},
  };
}

OpInfoRegistrar reg_tril({
    .op = "tril",
    .dtypes = all_dtypes(),
    .samples = triangle_samples,
    .run = [](const std::vector<Tensor>& in) { return tril(in[0], params_of(in[1])[0]); },
    .reference = [](const std::vector<Ref>& r, DType) { return triangle_reference(r, true); },
    .tol = exact_tol,
});
OpInfoRegistrar reg_triu({
    .op = "triu",
    .dtypes = all_dtypes(),
    .samples = triangle_samples,
    .run = [](const std::vector<Tensor>& in) { return triu(in[0], params_of(in[1])[0]); },
    .reference = [](const std::vector<Ref>& r, DType) { return triangle_reference(r, false); },
    .tol = exact_tol,
});

OpInfoRegistrar reg_one_hot({
    .op = "one_hot",
    .dtypes = {DType::i64, DType::i32, DType::i8, DType::u8},
    .samples =
        [](DType dt, Generator& g) {
          auto idx = [&](const Shape& s, int64_t n, L l) { return make_input(g, s, dt, l, 0.0, static_cast<double>(n)); };
          return std::vector<OpSample>{
              {"1-D, 4 classes", {idx({5}, 4, L::contiguous), params({4})}},
              {"transposed 2-D, inferred classes", {idx({2, 3}, 6, L::transposed), params({-1})}},
              {"sliced, more classes than values", {idx({4}, 3, L::sliced), params({7})}},
              {"expanded", {idx({3, 2}, 5, L::expanded), params({5})}},
              {"0-d", {idx({}, 3, L::contiguous), params({6})}},
              {"zero-size", {idx({0}, 3, L::contiguous), params({3})}},
              {"zero classes of nothing", {idx({2, 0}, 3, L::contiguous), params({0})}},
          };
        },
    .run =
        [](const std::vector<Tensor>& in) {
          Tensor r = one_hot(in[0], params_of(in[1])[0]);
          CHECK(r.dtype() == DType::i64);
          return r;
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          const Ref& idx = r[0];
          int64_t c = params_of(r[1])[0];
          if (c < 0) {
            c = 0;
            for (double v : idx.v) c = std::max(c, static_cast<int64_t>(v) + 1);
          }
          Shape out = idx.shape;
          out.push_back(c);
          Ref o(out);
          for (int64_t f = 0; f < o.numel(); ++f) {
            auto pos = unflatten(out, f);
            const int64_t k = pos.back();
            pos.pop_back();
            o.v[static_cast<size_t>(f)] = static_cast<int64_t>(idx.at(pos)) == k ? 1 : 0;
          }
          return o;
        },
    .tol = exact_tol,
});

}  // namespace

TEST_CASE("masked_fill: NaN and Inf values, dtype and broadcast result", "[index]") {
  Tensor x = arange(6, DType::f32).reshape({2, 3});
  Tensor m = from_vector(std::vector<bool>{true, false, true}, {3});
  auto v = masked_fill(x, m, -INFINITY).to_vector<float>();
  CHECK(std::isinf(v[0]));
  CHECK(v[1] == 1.0f);
  CHECK(std::isnan(masked_fill(x.to(DType::bf16), m, NAN).to_vector<float>()[5]));
  Tensor r = masked_fill(x.to(DType::u8), m, 255);
  CHECK(r.dtype() == DType::u8);
  CHECK(r.to_vector<int32_t>() == std::vector<int32_t>{255, 1, 255, 255, 4, 255});
  CHECK(masked_fill(x.to(DType::i32), m, 2.9).to_vector<int32_t>()[0] == 2);  // truncates like a cast
}

TEST_CASE("tril/triu: large batched inputs (parallel rows)", "[index]") {
  Generator g(5);
  Tensor x = make_input(g, {3, 130, 260}, DType::f32, Layout::transposed);
  for (int64_t d : {-70, 0, 3, 200}) {
    INFO("diagonal " << d);
    check_close(tril(x, d), triangle_reference({ref_of(x), ref_of(params({d}))}, true), {0, 0}, "tril");
    check_close(triu(x, d), triangle_reference({ref_of(x), ref_of(params({d}))}, false), {0, 0}, "triu");
  }
  // Extreme diagonals keep all or nothing without overflow.
  CHECK(equal(tril(x, INT64_MAX), x));
  CHECK(equal(triu(x, INT64_MIN), x));
  CHECK(equal(tril(x, INT64_MIN), zeros_like(x)));
}

TEST_CASE("masked_fill, tril/triu, one_hot: errors", "[index][errors]") {
  Tensor x = zeros({3, 4});
  expect_error([&] { masked_fill(x, zeros({3, 4}), 1.0); }, {"masked_fill", "bool", "f32"});
  expect_error([&] { masked_fill(x, zeros({3, 4}, DType::u8), 1.0); }, {"masked_fill", "bool", "u8"});
  expect_error([&] { masked_fill(x, zeros({2, 4}, DType::boolean), 1.0); }, {"masked_fill", "[3, 4]", "[2, 4]"});
  expect_error([&] { masked_fill(x.to(DType::u8), zeros({4}, DType::boolean), 256); }, {"masked_fill", "256", "u8"});
  expect_error([&] { masked_fill(x.to(DType::i8), zeros({4}, DType::boolean), -129); }, {"masked_fill", "-129", "i8"});
  expect_error([&] { masked_fill(x.to(DType::i32), zeros({4}, DType::boolean), NAN); }, {"masked_fill", "i32"});
  expect_error([&] { masked_fill(x, on_fake_device(zeros({4}, DType::boolean)), 1.0); }, {"masked_fill", "same device"});
  expect_error([&] { tril(zeros({4})); }, {"tril", "2 dims", "[4]"});
  expect_error([&] { triu(scalar_tensor(1.0)); }, {"triu", "2 dims", "[]"});

  Tensor idx = from_vector(std::vector<int32_t>{0, 2, 1});
  expect_error([&] { one_hot(idx, 2); }, {"one_hot", "index 2", "size 2", "num_classes = 2"});
  expect_error([&] { one_hot(from_vector(std::vector<int32_t>{1, -1}), 3); }, {"one_hot", "index -1", "negative"});
  expect_error([&] { one_hot(from_vector(std::vector<int32_t>{-3, -1}), -1); }, {"one_hot", "index -3"});
  expect_error([&] { one_hot(idx.to(DType::f32)); }, {"one_hot", "integer", "f32"});
  expect_error([&] { one_hot(idx.to(DType::f32), 3); }, {"one_hot", "f32"});
  expect_error([&] { one_hot(idx.to(DType::boolean), 3); }, {"one_hot", "bool"});
  expect_error([&] { one_hot(zeros({0}, DType::i32)); }, {"one_hot", "empty", "num_classes"});
  expect_error([&] { one_hot(idx, -2); }, {"one_hot", "-2"});
  CHECK(one_hot(idx).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 0, 0, 1, 0, 1, 0});
  // int64 whatever the index dtype, as PyTorch's one_hot.
  for (DType t : {DType::i32, DType::i64, DType::i8, DType::u8}) CHECK(one_hot(idx.to(t), 3).dtype() == DType::i64);
}

}  // namespace tpu::testing
