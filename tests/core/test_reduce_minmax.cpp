// amax, amin, max/min over a dim (values and indices), argmax, argmin, max()/min():
// OpInfo entries with naive references (first index on ties: integer inputs have many
// ties), NaN propagation, and the zero-size errors.
#include "test_reduce_util.h"

namespace tpu::testing {
namespace {
using namespace red;

// Index of the first maximum (kMax) or minimum of v; a NaN wins at its first position.
template <bool kMax>
int64_t ref_arg(const std::vector<double>& v) {
  int64_t best = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i])) return static_cast<int64_t>(i);
    if (kMax ? v[i] > v[static_cast<size_t>(best)] : v[i] < v[static_cast<size_t>(best)])
      best = static_cast<int64_t>(i);
  }
  return best;
}

// Single-dim cases for max/min(dim) and argmax/argmin(dim): extra = the dim.
std::vector<OpSample> one_dim_samples(DType dt, Generator& g) {
  using L = Layout;
  struct C {
    Shape s;
    L l;
    int64_t dim;
    bool keep;
  };
  std::vector<C> cs = {{{5, 7}, L::contiguous, 1, false}, {{5, 7}, L::transposed, 0, true},
                       {{3, 4, 5}, L::sliced, -1, true},  {{3, 4, 5}, L::expanded, 0, false},
                       {{3, 4, 5}, L::transposed, -2, false}, {{}, L::contiguous, 0, false},
                       {{}, L::contiguous, -1, true},     {{0, 4}, L::contiguous, 1, false},
                       {{9}, L::sliced, 0, false},        {{1, 1}, L::contiguous, 1, true}};
  if (dt == DType::f32 || dt == DType::i32) {
    cs.push_back({{40, 1000}, L::contiguous, 1, false});
    cs.push_back({{2, 50000}, L::contiguous, -1, false});
    cs.push_back({{300, 70}, L::transposed, 0, true});
  }
  std::vector<OpSample> out;
  for (const C& c : cs)
    out.push_back({fmt::format("{} {} dim {}{}", layout_name(c.l), c.s.str(), c.dim, c.keep ? " keepdim" : ""),
                   {make_input(g, c.s, dt, c.l), rspec(c.keep, 0, {c.dim})}});
  return out;
}

OpInfo extremum_entry(const char* name, bool is_max) {
  return OpInfo{
      .op = name,
      .dtypes = every_dtype(),
      .samples = [](DType dt, Generator& g) { return reduce_samples(dt, g, false, true); },
      .run =
          [is_max](const std::vector<Tensor>& in) {
            auto s = reduce_spec(spec_of(in[1]));
            Tensor r = is_max ? amax(in[0], s.dims, s.keepdim) : amin(in[0], s.dims, s.keepdim);
            CHECK(r.dtype() == in[0].dtype());
            return r;
          },
      .reference =
          [is_max](const std::vector<Ref>& r, DType) {
            auto s = reduce_spec(spec_of(r[1]));
            return reduce_ref(r[0], s.dims, s.keepdim, [&](const std::vector<double>& v) {
              return v[static_cast<size_t>(is_max ? ref_arg<true>(v) : ref_arg<false>(v))];
            });
          },
      .tol = [](DType) { return Tol{0, 0}; },
  };
}
OpInfoRegistrar reg_amax(extremum_entry("amax", true));
OpInfoRegistrar reg_amin(extremum_entry("amin", false));

// max/min(x, dim): want_values selects which of the two outputs the entry checks.
OpInfo value_index_entry(const char* name, bool is_max, bool want_values) {
  return OpInfo{
      .op = name,
      .dtypes = every_dtype(),
      .samples = one_dim_samples,
      .run =
          [is_max, want_values](const std::vector<Tensor>& in) {
            auto s = reduce_spec(spec_of(in[1]));
            auto [v, i] = is_max ? max(in[0], s.dims[0], s.keepdim) : min(in[0], s.dims[0], s.keepdim);
            CHECK(v.dtype() == in[0].dtype());
            CHECK(i.dtype() == DType::i64);  // as PyTorch
            CHECK(v.shape() == i.shape());
            return want_values ? v : i;
          },
      .reference =
          [is_max, want_values](const std::vector<Ref>& r, DType) {
            auto s = reduce_spec(spec_of(r[1]));
            return reduce_ref(r[0], s.dims, s.keepdim, [&](const std::vector<double>& v) {
              const int64_t k = is_max ? ref_arg<true>(v) : ref_arg<false>(v);
              return want_values ? v[static_cast<size_t>(k)] : static_cast<double>(k);
            });
          },
      .tol = [](DType) { return Tol{0, 0}; },
  };
}
OpInfoRegistrar reg_max_values(value_index_entry("max_dim", true, true));
OpInfoRegistrar reg_max_indices(value_index_entry("max_dim", true, false));
OpInfoRegistrar reg_min_values(value_index_entry("min_dim", false, true));
OpInfoRegistrar reg_min_indices(value_index_entry("min_dim", false, false));

// argmax/argmin: with a dim (extra = 1) or over all elements (extra = 0, flattened index).
OpInfo arg_entry(const char* name, bool is_max) {
  return OpInfo{
      .op = name,
      .dtypes = every_dtype(),
      .samples =
          [](DType dt, Generator& g) {
            auto out = one_dim_samples(dt, g);
            for (auto& s : out) s.inputs[1] = rspec(reduce_spec(spec_of(s.inputs[1])).keepdim, 1,
                                                     reduce_spec(spec_of(s.inputs[1])).dims);
            using L = Layout;
            for (auto [shape, l, keep] : {std::tuple{Shape{4, 6}, L::transposed, false},
                                          std::tuple{Shape{2, 3, 4}, L::sliced, true}, std::tuple{Shape{}, L::contiguous, false},
                                          std::tuple{Shape{3, 5}, L::expanded, false}})
              out.push_back({fmt::format("all elements {} {}{}", layout_name(l), shape.str(), keep ? " keepdim" : ""),
                             {make_input(g, shape, dt, l), rspec(keep, 0, {})}});
            if (dt == DType::f32)
              out.push_back({"all elements [70000]", {make_input(g, {70000}, dt, L::contiguous), rspec(false, 0, {})}});
            return out;
          },
      .run =
          [is_max](const std::vector<Tensor>& in) {
            auto s = reduce_spec(spec_of(in[1]));
            std::optional<int64_t> dim;
            if (s.extra) dim = s.dims[0];
            Tensor r = is_max ? argmax(in[0], dim, s.keepdim) : argmin(in[0], dim, s.keepdim);
            CHECK(r.dtype() == DType::i64);  // as PyTorch
            return r;
          },
      .reference =
          [is_max](const std::vector<Ref>& r, DType) {
            auto s = reduce_spec(spec_of(r[1]));
            // Over all elements the reduced dims are all dims: the row-major flat index.
            return reduce_ref(r[0], s.dims, s.keepdim, [&](const std::vector<double>& v) {
              return static_cast<double>(is_max ? ref_arg<true>(v) : ref_arg<false>(v));
            });
          },
      .tol = [](DType) { return Tol{0, 0}; },
  };
}
OpInfoRegistrar reg_argmax(arg_entry("argmax", true));
OpInfoRegistrar reg_argmin(arg_entry("argmin", false));

}  // namespace

TEST_CASE("max/min/argmax: NaN propagates and ties pick the first index", "[reduce]") {
  const float nan = std::nanf("");
  Tensor x = from_vector(std::vector<float>{1, 5, nan, 5, nan, -3}, Shape{2, 3});
  auto [v, i] = max(x, 1);
  Ref rv = ref_of(v);
  CHECK(std::isnan(rv.v[0]));
  CHECK(std::isnan(rv.v[1]));
  CHECK(i.to_vector<int32_t>() == std::vector<int32_t>{2, 1});
  CHECK(argmax(x).item<int>() == 2);
  CHECK(argmin(x).item<int>() == 2);
  CHECK(std::isnan(amax(x).item<double>()));
  CHECK(std::isnan(amin(x, {0}).to_vector<float>()[2]));
  CHECK(amin(x, {0}).to_vector<float>()[0] == 1.0f);
  CHECK(std::isnan(amin(x, {0}).to_vector<float>()[1]));
  Tensor t = from_vector(std::vector<int32_t>{3, 7, 7, 1, 1, 7}, Shape{6});
  CHECK(argmax(t).item<int>() == 1);
  CHECK(argmin(t).item<int>() == 3);
  CHECK(std::get<1>(min(t, 0)).item<int>() == 3);
  CHECK(max(t).item<int>() == 7);
  CHECK(min(t).item<int>() == 1);
  CHECK(max(ones({}, DType::boolean)).item<bool>());
  CHECK(argmax(ones({2, 2}), std::nullopt, true).shape() == Shape{1, 1});
  // Long rows take the lane path: ties across lanes and NaN in several lanes.
  std::vector<float> row(200, 0.0f);
  row[100] = row[17] = row[190] = 3.0f;
  CHECK(argmax(from_vector(row)).item<int>() == 17);
  row[150] = row[37] = row[21] = nan;
  row[21] = 1.0f;
  CHECK(argmax(from_vector(row)).item<int>() == 37);
  CHECK(argmin(from_vector(row)).item<int>() == 37);
  row[150] = row[37] = 0.0f;
  row[64] = row[5] = -2.0f;
  CHECK(argmin(from_vector(row)).item<int>() == 5);
  CHECK(std::get<1>(min(from_vector(row).reshape({2, 100}), 1)).to_vector<int32_t>() == std::vector<int32_t>{5, 1});
  // A long f32 reduction split across threads keeps the first index of equal maxima.
  std::vector<float> b(100000, 0.0f);
  b[70001] = b[90001] = 1.0f;
  b[20001] = b[99999] = -1.0f;
  Tensor big = from_vector(b);
  CHECK(argmax(big).item<int>() == 70001);
  CHECK(argmin(big).item<int>() == 20001);
  CHECK(std::get<1>(max(big.reshape({1, 100000}), 1)).item<int>() == 70001);
}

TEST_CASE("amax/argmax/max: reducing a zero-size dim is an error naming the op and shape", "[reduce][errors]") {
  expect_error([] { amax(zeros({0, 3}), {0}); }, {"amax", "[0, 3]", "size 0"});
  expect_error([] { amin(zeros({2, 0}), {}); }, {"amin", "[2, 0]"});
  expect_error([] { argmax(zeros({0})); }, {"argmax", "[0]"});
  expect_error([] { argmin(zeros({3, 0}), 1); }, {"argmin", "[3, 0]"});
  expect_error([] { max(zeros({3, 0}), 1); }, {"max_dim", "[3, 0]"});
  expect_error([] { min(zeros({0, 2}), 0); }, {"min_dim", "[0, 2]"});
  expect_error([] { max(zeros({0, 2})); }, {"max", "[0, 2]", "empty"});
  expect_error([] { min(zeros({0})); }, {"min", "[0]"});
  expect_error([] { max(zeros({2, 3}), 2); }, {"max_dim", "dim 2"});
  expect_error([] { argmax(zeros({2, 3}), -3); }, {"argmax", "-3"});
  // Reducing a non-empty dim of a tensor with an empty other dim is fine (empty result).
  CHECK(amax(zeros({0, 3}), {1}).shape() == Shape{0});
  CHECK(std::get<0>(max(zeros({0, 3}), 1)).shape() == Shape{0});
  CHECK(amax(ones({2, 3})).item<double>() == 1.0);
}

}  // namespace tpu::testing
