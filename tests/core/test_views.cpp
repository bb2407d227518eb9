// View ops (view, reshape, permute, transpose, squeeze, unsqueeze, expand, flatten, slice,
// narrow, select) and contiguous/clone: OpInfo entries with naive references, storage
// sharing (writes through a view reach the base), strides and offsets, 0-d and zero-size
// tensors, and the error cases.
#include "index_test_util.h"

namespace tpu::testing {
namespace {

using L = Layout;

Shape shape_of(const std::vector<int64_t>& v) { return Shape(v); }

// ---- view: same row-major values under a new shape ----
OpInfoRegistrar reg_view({
    .op = "view",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          return std::vector<OpSample>{
              {"[3, 4] -> [2, 6]", {mk({3, 4}, L::contiguous), params({2, 6})}},
              {"[3, 4] -> [-1, 3]", {mk({3, 4}, L::contiguous), params({-1, 3})}},
              {"[2, 3, 4] -> [24]", {mk({2, 3, 4}, L::contiguous), params({24})}},
              {"sliced [3, 4] splits its last dim", {mk({3, 4}, L::sliced), params({3, 2, -1})}},
              {"sliced [2, 3, 4] merges leading dims", {mk({2, 3, 4}, L::sliced), params({6, 4})}},
              {"transposed, size-1 dims added", {mk({3, 4}, L::transposed), params({1, 3, 1, 4})}},
              {"expanded, last dim split", {mk({3, 4}, L::expanded), params({3, 2, 2})}},
              {"0-d -> [1, 1]", {mk({}, L::contiguous), params({1, 1})}},
              {"[1] -> 0-d", {mk({1}, L::contiguous), params({})}},
              {"zero-size [0, 3] -> [3, 0, 2]", {mk({0, 3}, L::contiguous), params({3, 0, 2})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return view(in[0], shape_of(params_of(in[1]))); },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          auto p = params_of(r[1]);
          int64_t known = 1;
          for (int64_t v : p)
            if (v != -1) known *= v;
          for (auto& v : p)
            if (v == -1) v = r[0].numel() / known;
          Ref o = r[0];
          o.shape = shape_of(p);
          return o;
        },
    .tol = exact_tol,
});

// ---- permute ----
OpInfoRegistrar reg_permute({
    .op = "permute",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          return std::vector<OpSample>{
              {"[2, 3, 4] by (2, 0, 1)", {mk({2, 3, 4}, L::contiguous), params({2, 0, 1})}},
              {"negative dims", {mk({2, 3, 4}, L::sliced), params({-1, 0, -2})}},
              {"transposed input", {mk({3, 5}, L::transposed), params({1, 0})}},
              {"expanded input", {mk({3, 2, 2}, L::expanded), params({1, 2, 0})}},
              {"identity", {mk({4, 3}, L::contiguous), params({0, 1})}},
              {"0-d", {mk({}, L::contiguous), params({})}},
              {"zero-size", {mk({0, 2, 3}, L::contiguous), params({2, 0, 1})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return permute(in[0], shape_of(params_of(in[1]))); },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          const Ref& x = r[0];
          auto p = params_of(r[1]);
          const int n = x.shape.ndim();
          Shape out;
          for (int64_t d : p) out.push_back(x.shape[wrap(d, n)]);
          Ref o(out);
          for (int64_t f = 0; f < o.numel(); ++f) {
            auto pos = unflatten(out, f);
            std::vector<int64_t> src(static_cast<size_t>(n));
            for (size_t i = 0; i < p.size(); ++i) src[static_cast<size_t>(wrap(p[i], n))] = pos[i];
            o.v[static_cast<size_t>(f)] = x.at(src);
          }
          return o;
        },
    .tol = exact_tol,
});

// ---- expand ----
OpInfoRegistrar reg_expand({
    .op = "expand",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          return std::vector<OpSample>{
              {"[3, 1] -> [3, 4]", {mk({3, 1}, L::contiguous), params({3, 4})}},
              {"sliced [1, 4] -> [2, 3, 4]", {mk({1, 4}, L::sliced), params({2, 3, 4})}},
              {"-1 keeps a dim", {mk({3, 1}, L::contiguous), params({-1, 5})}},
              {"transposed [1, 3] -> [2, 2, 3]", {mk({1, 3}, L::transposed), params({2, 2, 3})}},
              {"expand an expanded view", {mk({3, 4}, L::expanded), params({2, 3, 4})}},
              {"0-d -> [2, 3]", {mk({}, L::contiguous), params({2, 3})}},
              {"[1] -> [0]", {mk({1}, L::contiguous), params({0})}},
              {"same shape", {mk({2, 3}, L::sliced), params({2, 3})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return expand(in[0], shape_of(params_of(in[1]))); },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          auto p = params_of(r[1]);
          const int lead = static_cast<int>(p.size()) - r[0].shape.ndim();
          for (size_t i = 0; i < p.size(); ++i)
            if (p[i] == -1) p[i] = r[0].shape[static_cast<int>(i) - lead];
          Ref o(shape_of(p));
          for (int64_t f = 0; f < o.numel(); ++f) o.v[static_cast<size_t>(f)] = r[0].bcast(o.shape, unflatten(o.shape, f));
          return o;
        },
    .tol = exact_tol,
});

// ---- slice: Python slice semantics, written out independently ----
Ref slice_reference(const Ref& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  const int d = wrap(dim, x.shape.ndim());
  const int64_t n = x.shape[d];
  auto norm = [n](int64_t v) {
    if (v < 0) v += n;
    return v < 0 ? 0 : (v > n ? n : v);
  };
  const int64_t s = norm(start), e = norm(end);
  const int64_t len = e > s ? (e - s + step - 1) / step : 0;
  Shape out = x.shape;
  out[d] = len;
  Ref o(out);
  for (int64_t f = 0; f < o.numel(); ++f) {
    auto pos = unflatten(out, f);
    pos[static_cast<size_t>(d)] = s + pos[static_cast<size_t>(d)] * step;
    o.v[static_cast<size_t>(f)] = x.at(pos);
  }
  return o;
}

OpInfoRegistrar reg_slice({
    .op = "slice",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          return std::vector<OpSample>{
              {"rows 1..4", {mk({5, 4}, L::contiguous), params({0, 1, 4, 1})}},
              {"negative bounds", {mk({5, 4}, L::contiguous), params({1, -3, -1, 1})}},
              {"clamped end, step 2", {mk({5, 4}, L::transposed), params({0, 0, 100, 2})}},
              {"clamped negative start", {mk({5, 4}, L::sliced), params({-1, -100, 2, 1})}},
              {"end before start is empty", {mk({5, 4}, L::contiguous), params({0, 3, 1, 1})}},
              {"step 3 of a sliced view", {mk({2, 7}, L::sliced), params({1, 1, 7, 3})}},
              {"expanded input", {mk({4, 3}, L::expanded), params({0, 1, 3, 1})}},
              {"1-D, start past the end", {mk({6}, L::contiguous), params({0, 9, 12, 1})}},
              {"zero-size input", {mk({0, 3}, L::contiguous), params({1, 1, 2, 1})}},
          };
        },
    .run =
        [](const std::vector<Tensor>& in) {
          auto p = params_of(in[1]);
          return slice(in[0], p[0], p[1], p[2], p[3]);
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          auto p = params_of(r[1]);
          return slice_reference(r[0], p[0], p[1], p[2], p[3]);
        },
    .tol = exact_tol,
});

// ---- select ----
OpInfoRegistrar reg_select({
    .op = "select",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          return std::vector<OpSample>{
              {"row 1", {mk({3, 4}, L::contiguous), params({0, 1})}},
              {"last column", {mk({3, 4}, L::transposed), params({1, -1})}},
              {"negative dim", {mk({2, 3, 4}, L::sliced), params({-2, 2})}},
              {"1-D -> 0-d", {mk({5}, L::contiguous), params({0, 3})}},
              {"expanded", {mk({3, 4}, L::expanded), params({0, 2})}},
              {"zero-size rest", {mk({2, 0}, L::contiguous), params({0, 1})}},
          };
        },
    .run =
        [](const std::vector<Tensor>& in) {
          auto p = params_of(in[1]);
          return select(in[0], p[0], p[1]);
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          auto p = params_of(r[1]);
          const Ref& x = r[0];
          const int d = wrap(p[0], x.shape.ndim());
          const int64_t i = p[1] < 0 ? p[1] + x.shape[d] : p[1];
          Shape out = x.shape;
          out.erase(d);
          Ref o(out);
          for (int64_t f = 0; f < o.numel(); ++f) {
            auto pos = unflatten(out, f);
            pos.insert(pos.begin() + d, i);
            o.v[static_cast<size_t>(f)] = x.at(pos);
          }
          return o;
        },
    .tol = exact_tol,
});

// ---- contiguous (also clone) ----
OpInfoRegistrar reg_contiguous({
    .op = "contiguous",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          return std::vector<OpSample>{
              {"contiguous", {mk({3, 4}, L::contiguous)}}, {"transposed", {mk({3, 5}, L::transposed)}},
              {"sliced", {mk({2, 3, 4}, L::sliced)}},      {"expanded", {mk({3, 4}, L::expanded)}},
              {"0-d", {mk({}, L::contiguous)}},            {"zero-size", {mk({0, 3}, L::transposed)}},
          };
        },
    .run =
        [](const std::vector<Tensor>& in) {
          Tensor c = contiguous(in[0]);
          REQUIRE(c.is_contiguous());
          Tensor k = clone(in[0]);
          REQUIRE(k.is_contiguous());
          REQUIRE((k.numel() == 0 || k.storage() != in[0].storage()));
          REQUIRE(equal(k, c));
          return c;
        },
    .reference = [](const std::vector<Ref>& r, DType) { return r[0]; },
    .tol = exact_tol,
});

Tensor iota(const Shape& s) {
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return from_vector(v, s);
}
std::vector<float> vals(const Tensor& t) { return t.to_vector<float>(); }

}  // namespace

TEST_CASE("views: share storage, writes through a view reach the base", "[views]") {
  Tensor x = iota({3, 4});
  Tensor v = x.view({4, 3});
  CHECK(v.storage() == x.storage());
  v.select(0, 1).fill_(-1.0);  // elements 3, 4, 5 of the base
  CHECK(vals(x) == std::vector<float>{0, 1, 2, -1, -1, -1, 6, 7, 8, 9, 10, 11});

  Tensor s = x.slice(1, 0, 4, 2);  // columns 0 and 2
  CHECK(s.storage() == x.storage());
  s.copy_(full({3, 2}, 5.0));
  CHECK(vals(x) == std::vector<float>{5, 1, 5, -1, 5, -1, 5, 7, 5, 9, 5, 11});

  Tensor t = x.t();
  t.select(0, 3).fill_(0.0);  // column 3 of the base
  CHECK(vals(x.select(1, 3)) == std::vector<float>{0, 0, 0});
  Tensor n = x.narrow(0, 1, 2);
  n.copy_(from_vector(std::vector<float>{1, 2, 3, 4}, {4}));  // broadcast over rows
  CHECK(vals(x.select(0, 2)) == std::vector<float>{1, 2, 3, 4});
  CHECK(vals(x.select(0, 0)) == std::vector<float>{5, 1, 5, 0});

  Tensor u = x.unsqueeze(0).permute({2, 0, 1}).squeeze();
  CHECK(u.storage() == x.storage());
  u.select(0, 1).fill_(8.0);  // column 1 of the base
  CHECK(vals(x.select(1, 1)) == std::vector<float>{8, 8, 8});
  Tensor f = x.flatten();
  CHECK(f.storage() == x.storage());
  CHECK(f.shape() == Shape{12});
}

TEST_CASE("views: strides and offsets", "[views]") {
  Tensor x = iota({2, 3, 4});
  CHECK(x.strides() == Shape{12, 4, 1});
  Tensor p = x.permute({2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  CHECK(!p.is_contiguous());
  Tensor tr = x.transpose(0, -1);
  CHECK(tr.shape() == Shape{4, 3, 2});
  CHECK(tr.strides() == Shape{1, 4, 12});
  Tensor s = x.slice(2, 1, 4, 2);
  CHECK(s.shape() == Shape{2, 3, 2});
  CHECK(s.strides() == Shape{12, 4, 2});
  CHECK(s.offset() == 1);
  Tensor sel = x.select(1, 2);
  CHECK(sel.shape() == Shape{2, 4});
  CHECK(sel.strides() == Shape{12, 1});
  CHECK(sel.offset() == 8);
  Tensor e = iota({3, 1}).expand({2, 3, 5});
  CHECK(e.strides() == Shape{0, 1, 0});
  CHECK(vals(e.select(0, 1).select(0, 2)) == std::vector<float>{2, 2, 2, 2, 2});
  Tensor un = x.unsqueeze(-1);
  CHECK(un.shape() == Shape{2, 3, 4, 1});
  CHECK(un.is_contiguous());
  Tensor sq = iota({1, 3, 1}).squeeze(0);
  CHECK(sq.shape() == Shape{3, 1});
  CHECK(iota({1, 3, 1}).squeeze().shape() == Shape{3});
  CHECK(iota({1, 3, 1}).squeeze(1).shape() == Shape{1, 3, 1});  // not size 1: unchanged
  CHECK(iota({1, 3, 1}).squeeze(-1).shape() == Shape{1, 3});
  Tensor nr = x.narrow(-1, -3, 2);
  CHECK(nr.offset() == 1);
  CHECK(vals(nr.select(0, 0).select(0, 0)) == std::vector<float>{1, 2});
  CHECK(x.flatten(1).shape() == Shape{2, 12});
  CHECK(x.flatten(0, 1).shape() == Shape{6, 4});
  CHECK(x.flatten(-2, -1).shape() == Shape{2, 12});
}

TEST_CASE("views: reshape views when possible and copies when needed", "[views]") {
  Tensor x = iota({3, 4});
  Tensor r = x.reshape({2, -1});
  CHECK(r.shape() == Shape{2, 6});
  CHECK(r.storage() == x.storage());
  Tensor t = x.t();  // [4, 3], not viewable as [12]
  Tensor rt = t.reshape({-1});
  CHECK(rt.storage() != x.storage());
  CHECK(vals(rt) == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  CHECK(t.reshape({1, 4, 3, 1}).storage() == x.storage());  // size-1 dims: still a view
  Tensor e = iota({4}).expand({3, 4});
  CHECK(vals(e.reshape({12})) == std::vector<float>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3});
  CHECK(scalar_tensor(2.5).reshape({1, 1}).shape() == Shape{1, 1});
  CHECK(iota({1}).reshape({}).dim() == 0);
  expect_error([&] { zeros({0, 3}).reshape({3, -1, 0}); }, {"reshape", "[3, -1, 0]"});  // -1 is ambiguous
  CHECK(zeros({0, 3}).reshape({0, 7}).shape() == Shape{0, 7});
}

TEST_CASE("views: 0-d and zero-size tensors", "[views]") {
  Tensor s = scalar_tensor(3.0);
  CHECK(s.unsqueeze(0).shape() == Shape{1});
  CHECK(s.unsqueeze(-1).shape() == Shape{1});
  CHECK(s.squeeze().dim() == 0);
  CHECK(s.squeeze(0).dim() == 0);
  CHECK(s.flatten().shape() == Shape{1});
  CHECK(s.permute({}).dim() == 0);
  CHECK(s.transpose(0, -1).dim() == 0);
  CHECK(s.expand({2, 2}).to_vector<float>() == std::vector<float>{3, 3, 3, 3});
  CHECK(s.t().dim() == 0);
  CHECK(s.contiguous().item<double>() == 3.0);
  CHECK(s.clone().item<double>() == 3.0);
  Tensor z = zeros({2, 0, 3});
  CHECK(z.permute({2, 1, 0}).shape() == Shape{3, 0, 2});
  CHECK(z.slice(2, 1, 3).shape() == Shape{2, 0, 2});
  CHECK(z.select(0, 1).shape() == Shape{0, 3});
  CHECK(z.flatten().shape() == Shape{0});
  CHECK(z.view({0}).numel() == 0);
  CHECK(z.transpose(0, 1).contiguous().shape() == Shape{0, 2, 3});
  CHECK(z.clone().shape() == z.shape());
  CHECK(zeros({1}).expand({0}).shape() == Shape{0});
}

TEST_CASE("views: contiguous and clone", "[views]") {
  Tensor x = iota({3, 4});
  CHECK(x.contiguous().storage() == x.storage());  // already contiguous: no copy
  Tensor c = x.t().contiguous();
  CHECK(c.storage() != x.storage());
  CHECK(c.strides() == Shape{3, 1});
  Tensor k = x.clone();
  CHECK(k.storage() != x.storage());
  k.fill_(0.0);
  CHECK(vals(x)[5] == 5.0f);  // the clone is independent
  Tensor e = iota({3}).expand({2, 3}).clone();
  CHECK(e.strides() == Shape{3, 1});
  e.select(0, 0).fill_(9.0);
  CHECK(vals(e) == std::vector<float>{9, 9, 9, 0, 1, 2});
  for (DType dt : all_dtypes()) {
    Tensor y = iota({2, 3}).to(dt);
    CHECK(y.t().contiguous().dtype() == dt);
    CHECK(y.clone().dtype() == dt);
  }
}

TEST_CASE("views: errors", "[views][errors]") {
  Tensor x = iota({3, 4});
  expect_error([&] { x.reshape({5, -1}); }, {"reshape", "[5, -1]", "[3, 4]"});
  expect_error([&] { x.reshape({7}); }, {"reshape", "[7]", "12"});
  expect_error([&] { x.reshape({-1, -1}); }, {"reshape", "only one", "-1"});
  expect_error([&] { x.reshape({-2, 6}); }, {"reshape", "-2"});
  expect_error([&] { x.view({-1, 0}); }, {"view", "[-1, 0]"});
  expect_error([&] { x.t().view({12}); }, {"view", "[4, 3]", "strides", "reshape"});
  expect_error([&] { x.slice(1, 0, 3).view({9}); }, {"view", "[3, 3]", "[4, 1]"});
  CHECK(x.slice(1, 0, 4, 2).view({6}).strides() == Shape{2});  // evenly strided: a view
  expect_error([&] { x.permute({0}); }, {"permute", "1 dims", "2 dims"});
  expect_error([&] { x.permute({1, 1}); }, {"permute", "repeated"});
  expect_error([&] { x.permute({0, 2}); }, {"permute", "dim 2"});
  expect_error([&] { x.transpose(0, 2); }, {"transpose", "dim 2"});
  expect_error([&] { x.squeeze(3); }, {"squeeze", "dim 3"});
  expect_error([&] { x.unsqueeze(3); }, {"unsqueeze", "dim 3"});
  expect_error([&] { x.unsqueeze(-4); }, {"unsqueeze", "dim -4"});
  expect_error([&] { x.expand({3}); }, {"expand", "fewer dims"});
  expect_error([&] { x.expand({3, 5}); }, {"expand", "[3, 4]", "[3, 5]"});
  expect_error([&] { x.expand({-1, 3, 4}); }, {"expand", "-1"});
  expect_error([&] { x.flatten(1, 0); }, {"flatten", "start_dim"});
  expect_error([&] { x.flatten(0, 2); }, {"flatten", "dim 2"});
  expect_error([&] { x.slice(2, 0, 1); }, {"slice", "dim 2"});
  expect_error([&] { x.slice(0, 0, 3, 0); }, {"slice", "step", "0"});
  expect_error([&] { x.slice(0, 3, 0, -1); }, {"slice", "step", "-1"});
  expect_error([&] { scalar_tensor(1.0).slice(0, 0, 1); }, {"slice", "0-d"});
  expect_error([&] { x.narrow(0, 2, 2); }, {"narrow", "start 2", "length 2", "size 3"});
  expect_error([&] { x.narrow(1, 0, -1); }, {"narrow", "length -1"});
  expect_error([&] { scalar_tensor(1.0).narrow(0, 0, 1); }, {"narrow", "0-d"});
  expect_error([&] { x.select(0, 3); }, {"select", "index 3", "size 3"});
  expect_error([&] { x.select(1, -5); }, {"select", "index -5", "size 4"});
  expect_error([&] { x.select(2, 0); }, {"select", "dim 2"});
  expect_error([&] { scalar_tensor(1.0).select(0, 0); }, {"select", "0-d"});
  expect_error([&] { iota({2, 3, 4}).t(); }, {"t", "[2, 3, 4]"});
  expect_error([&] { Tensor().reshape({1}); }, {"undefined"});
  // The runtime keeps working afterwards.
  CHECK(x.reshape({2, 6}).shape() == Shape{2, 6});
}

}  // namespace tpu::testing
