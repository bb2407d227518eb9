// index_select, gather, scatter_add, embedding: OpInfo entries with naive references,
// large (parallel) cases, and the error cases (out-of-range indices never read memory).
#include "index_test_util.h"

namespace tpu::testing {
namespace {

using L = Layout;

// Index values in [0, n) of an index dtype, in a given layout.
Tensor make_index(Generator& g, const Shape& s, int64_t n, DType dt, L l) {
  return make_input(g, s, dt, l, 0.0, static_cast<double>(n));
}
// Cycles the index dtypes over samples so that each appears.
DType index_dtype(int k) {
  static const DType v[] = {DType::i32, DType::u8, DType::i8, DType::i64};
  return v[k % 4];
}
int64_t iv(const Ref& idx, const std::vector<int64_t>& pos) { return static_cast<int64_t>(idx.at(pos)); }

// ---- index_select ----
Ref index_select_reference(const std::vector<Ref>& r) {
  const Ref& x = r[0];
  const Ref& idx = r[1];
  if (x.shape.ndim() == 0) return x;
  const int d = wrap(params_of(r[2])[0], x.shape.ndim());
  Shape out = x.shape;
  out[d] = idx.numel();
  Ref o(out);
  for (int64_t f = 0; f < o.numel(); ++f) {
    auto pos = unflatten(out, f);
    pos[static_cast<size_t>(d)] = static_cast<int64_t>(idx.v[static_cast<size_t>(pos[static_cast<size_t>(d)])]);
    o.v[static_cast<size_t>(f)] = x.at(pos);
  }
  return o;
}

OpInfoRegistrar reg_index_select({
    .op = "index_select",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          return std::vector<OpSample>{
              {"dim 0", {mk({5, 4}, L::contiguous), make_index(g, {3}, 5, DType::i32, L::contiguous), params({0})}},
              {"i64 index, dim 1", {mk({3, 6}, L::contiguous), make_index(g, {5}, 6, DType::i64, L::sliced), params({1})}},
              {"transposed x, sliced u8 index, dim -1",
               {mk({4, 6}, L::transposed), make_index(g, {4}, 6, DType::u8, L::sliced), params({-1})}},
              {"3-D sliced x, repeated i8 index, dim 1",
               {mk({2, 5, 3}, L::sliced), make_index(g, {7}, 5, DType::i8, L::contiguous), params({1})}},
              {"expanded x, 0-d index", {mk({3, 4}, L::expanded), make_index(g, {}, 3, DType::i32, L::contiguous),
                                         params({0})}},
              {"0-d x", {mk({}, L::contiguous), make_index(g, {1}, 1, DType::i32, L::contiguous), params({0})}},
              {"empty index", {mk({3, 4}, L::transposed), make_index(g, {0}, 4, DType::i32, L::contiguous), params({1})}},
              {"zero-size x", {mk({0, 3}, L::contiguous), make_index(g, {2}, 3, DType::i32, L::contiguous), params({1})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return index_select(in[0], params_of(in[2])[0], in[1]); },
    .reference = [](const std::vector<Ref>& r, DType) { return index_select_reference(r); },
    .tol = exact_tol,
});

// ---- gather ----
Ref gather_reference(const std::vector<Ref>& r) {
  const Ref& x = r[0];
  const Ref& idx = r[1];
  const int d = wrap(params_of(r[2])[0], std::max(1, x.shape.ndim()));
  Ref o(idx.shape);
  for (int64_t f = 0; f < o.numel(); ++f) {
    auto pos = unflatten(idx.shape, f);
    const int64_t k = iv(idx, pos);
    if (x.shape.ndim()) pos[static_cast<size_t>(d)] = k;
    o.v[static_cast<size_t>(f)] = x.at(pos);
  }
  return o;
}

OpInfoRegistrar reg_gather({
    .op = "gather",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          return std::vector<OpSample>{
              {"dim 1", {mk({4, 5}, L::contiguous), make_index(g, {4, 3}, 5, index_dtype(0), L::contiguous), params({1})}},
              {"transposed x, dim 0, index smaller",
               {mk({4, 5}, L::transposed), make_index(g, {2, 5}, 4, index_dtype(1), L::contiguous), params({0})}},
              {"3-D sliced x, dim 1, index longer in dim",
               {mk({3, 4, 5}, L::sliced), make_index(g, {2, 6, 3}, 4, index_dtype(2), L::contiguous), params({1})}},
              {"expanded x, transposed index, dim -1",
               {mk({3, 4}, L::expanded), make_index(g, {3, 2}, 4, DType::i32, L::transposed), params({-1})}},
              {"sliced index", {mk({3, 4}, L::contiguous), make_index(g, {3, 3}, 3, DType::i32, L::sliced), params({0})}},
              {"i64 index, dim 0", {mk({4, 3}, L::contiguous), make_index(g, {2, 3}, 4, index_dtype(3), L::contiguous), params({0})}},
              {"0-d", {mk({}, L::contiguous), make_index(g, {}, 1, DType::i32, L::contiguous), params({0})}},
              {"zero-size index", {mk({2, 3}, L::contiguous), make_index(g, {0, 3}, 2, DType::i32, L::contiguous),
                                   params({0})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return gather(in[0], params_of(in[2])[0], in[1]); },
    .reference = [](const std::vector<Ref>& r, DType) { return gather_reference(r); },
    .tol = exact_tol,
});

// ---- scatter_add ----
Ref scatter_add_reference(const std::vector<Ref>& r, DType dt) {
  const Ref& x = r[0];
  const Ref& idx = r[1];
  const Ref& src = r[2];
  const int d = wrap(params_of(r[3])[0], std::max(1, x.shape.ndim()));
  Ref o = x;
  for (int64_t f = 0; f < idx.numel(); ++f) {
    auto pos = unflatten(idx.shape, f);
    const double s = src.at(pos);
    if (x.shape.ndim()) pos[static_cast<size_t>(d)] = iv(idx, pos);
    o.at(pos) += s;
  }
  if (dt == DType::boolean)
    for (auto& v : o.v) v = v != 0 ? 1 : 0;
  return o;
}

OpInfoRegistrar reg_scatter_add({
    .op = "scatter_add",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          return std::vector<OpSample>{
              {"dim 0 with repeats",
               {mk({4, 5}, L::contiguous), make_index(g, {3, 5}, 4, index_dtype(0), L::contiguous), mk({3, 5}, L::contiguous),
                params({0})}},
              {"transposed x, larger sliced src, dim 1",
               {mk({3, 6}, L::transposed), make_index(g, {3, 4}, 6, index_dtype(1), L::contiguous), mk({4, 5}, L::sliced),
                params({1})}},
              {"3-D, expanded src, dim -2",
               {mk({2, 3, 4}, L::contiguous), make_index(g, {2, 5, 4}, 3, index_dtype(2), L::transposed),
                mk({2, 5, 4}, L::expanded), params({-2})}},
              {"0-d", {mk({}, L::contiguous), make_index(g, {}, 1, DType::i32, L::contiguous), mk({}, L::contiguous),
                       params({0})}},
              {"empty index", {mk({2, 5}, L::sliced), make_index(g, {0, 5}, 2, DType::i32, L::contiguous),
                               mk({1, 5}, L::contiguous), params({0})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return scatter_add(in[0], params_of(in[3])[0], in[1], in[2]); },
    .reference = scatter_add_reference,
});

// ---- embedding ----
Ref embedding_reference(const std::vector<Ref>& r) {
  const Ref& w = r[0];
  const Ref& idx = r[1];
  Shape out = idx.shape;
  out.push_back(w.shape[1]);
  Ref o(out);
  for (int64_t f = 0; f < o.numel(); ++f) {
    auto pos = unflatten(out, f);
    const int64_t k = pos.back();
    pos.pop_back();
    o.v[static_cast<size_t>(f)] = w.at({iv(idx, pos), k});
  }
  return o;
}

OpInfoRegistrar reg_embedding({
    .op = "embedding",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          return std::vector<OpSample>{
              {"1-D indices", {mk({10, 4}, L::contiguous), make_index(g, {3}, 10, DType::i32, L::contiguous)}},
              {"2-D i64 token ids", {mk({9, 4}, L::contiguous), make_index(g, {2, 5}, 9, DType::i64, L::contiguous)}},
              {"transposed i64 indices", {mk({7, 3}, L::sliced), make_index(g, {4, 2}, 7, DType::i64, L::transposed)}},
              {"transposed weight, 2-D u8 indices", {mk({6, 5}, L::transposed), make_index(g, {2, 3}, 6, DType::u8, L::sliced)}},
              {"sliced weight, 0-d index", {mk({5, 3}, L::sliced), make_index(g, {}, 5, DType::i32, L::contiguous)}},
              {"expanded weight, expanded i8 indices",
               {mk({4, 3}, L::expanded), make_index(g, {3, 4}, 4, DType::i8, L::expanded)}},
              {"zero-size indices", {mk({4, 2}, L::contiguous), make_index(g, {0, 2}, 4, DType::i32, L::contiguous)}},
              {"zero-width weight", {mk({4, 0}, L::contiguous), make_index(g, {3}, 4, DType::i32, L::contiguous)}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); },
    .reference = [](const std::vector<Ref>& r, DType) { return embedding_reference(r); },
    .tol = exact_tol,
});

}  // namespace

TEST_CASE("index ops: large inputs take the parallel paths and match", "[index]") {
  Generator g(11);
  Tensor w = make_input(g, {1000, 64}, DType::f32, Layout::contiguous);
  Tensor ids = make_index(g, {40, 50}, 1000, DType::i32, Layout::contiguous);
  check_close(embedding(w, ids), embedding_reference({ref_of(w), ref_of(ids)}), {0, 0}, "embedding 2000 x 64");
  Tensor wt = make_input(g, {300, 70}, DType::bf16, Layout::transposed);
  Tensor ids2 = make_index(g, {1500}, 300, DType::i32, Layout::sliced);
  check_close(embedding(wt, ids2), embedding_reference({ref_of(wt), ref_of(ids2)}), {0, 0}, "embedding transposed");
  check_close(index_select(wt, 0, ids2), index_select_reference({ref_of(wt), ref_of(ids2), ref_of(params({0}))}),
              {0, 0}, "index_select rows");
  Tensor ids3 = make_index(g, {900}, 70, DType::i32, Layout::contiguous);
  check_close(index_select(wt, 1, ids3), index_select_reference({ref_of(wt), ref_of(ids3), ref_of(params({1}))}),
              {0, 0}, "index_select columns");
  Tensor x = make_input(g, {200, 300}, DType::f32, Layout::sliced);
  Tensor gi = make_index(g, {200, 400}, 300, DType::i32, Layout::contiguous);
  check_close(gather(x, 1, gi), gather_reference({ref_of(x), ref_of(gi), ref_of(params({1}))}), {0, 0}, "gather");
  Tensor src = make_input(g, {200, 400}, DType::f32, Layout::contiguous);
  check_close(scatter_add(x, 1, gi, src), scatter_add_reference({ref_of(x), ref_of(gi), ref_of(src), ref_of(params({1}))}, DType::f32),
              {1e-4, 1e-5}, "scatter_add");
}

TEST_CASE("scatter_add: bf16 accumulates in f32 and rounds once", "[index]") {
  // 256 additions of 1 into one element: bf16 steps of 2 above 256 would stall per-step
  // rounding at 256; one rounding of the f32 sum gives the exact 257.
  Tensor x = ones({1}, DType::bf16);
  Tensor idx = zeros({256}, DType::i32);
  Tensor src = ones({256}, DType::bf16);
  CHECK(scatter_add(x, 0, idx, src).item<double>() == 256.0);  // 257 rounds to even: 256
  Tensor src2 = ones({257}, DType::bf16);
  CHECK(scatter_add(x, 0, zeros({257}, DType::i32), src2).item<double>() == 258.0);
}

TEST_CASE("index ops: inputs are not modified and outputs are fresh", "[index]") {
  Tensor x = arange(6, DType::f32).reshape({2, 3});
  Tensor idx = from_vector(std::vector<int32_t>{0, 0, 1}, {1, 3});
  Tensor out = scatter_add(x, 0, idx, ones({1, 3}));
  CHECK(x.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(out.to_vector<float>() == std::vector<float>{1, 2, 2, 3, 4, 6});
  CHECK(out.storage() != x.storage());
}

TEST_CASE("index ops: errors name the op, the bad value, the dim and its size", "[index][errors]") {
  Tensor x = zeros({5, 3});
  Tensor ok = from_vector(std::vector<int32_t>{0, 4});
  Tensor bad = from_vector(std::vector<int32_t>{1, 5, 2});
  Tensor neg = from_vector(std::vector<int32_t>{-1});
  expect_error([&] { index_select(x, 0, bad); }, {"index_select", "index 5", "dim 0", "size 5", "[5, 3]"});
  expect_error([&] { index_select(x, 1, ok); }, {"index_select", "index 4", "dim 1", "size 3"});
  expect_error([&] { index_select(x, 0, neg); }, {"index_select", "index -1", "negative"});
  expect_error([&] { index_select(x, 0, ok.to(DType::f32)); }, {"index_select", "integer", "f32"});
  expect_error([&] { index_select(x, 0, ok.to(DType::boolean)); }, {"index_select", "bool"});
  expect_error([&] { index_select(x, 0, ok.reshape({1, 2})); }, {"index_select", "0-d or 1-d", "[1, 2]"});
  expect_error([&] { index_select(x, 2, ok); }, {"index_select", "dim 2"});
  expect_error([&] { index_select(scalar_tensor(1.0), 0, ok); }, {"index_select", "0-d", "[2]"});
  expect_error([&] { index_select(x, 0, on_fake_device(ok)); }, {"index_select", "same device"});

  Tensor gi = from_vector(std::vector<int32_t>{0, 3, 1, 0}, {2, 2});
  expect_error([&] { gather(x, 1, gi); }, {"gather", "index 3", "dim 1", "size 3"});
  expect_error([&] { gather(x, 0, ok); }, {"gather", "as many dims", "[2]", "[5, 3]"});
  expect_error([&] { gather(x, 0, zeros({2, 4}, DType::i32)); }, {"gather", "index.size(1) = 4", "x.size(1) = 3"});
  expect_error([&] { gather(x, 0, zeros({2, 2}, DType::f16)); }, {"gather", "f16"});
  expect_error([&] { gather(x, -3, gi); }, {"gather", "dim -3"});

  expect_error([&] { scatter_add(x, 1, gi, ones({2, 2})); }, {"scatter_add", "index 3", "dim 1", "size 3"});
  expect_error([&] { scatter_add(x, 0, gi, ones({2, 2}, DType::i32)); }, {"scatter_add", "dtype", "i32", "f32"});
  expect_error([&] { scatter_add(x, 0, gi, ones({2, 1})); }, {"scatter_add", "src", "index.size(1) = 2", "src.size(1) = 1"});
  expect_error([&] { scatter_add(x, 0, zeros({2}, DType::i32), ones({2})); }, {"scatter_add", "same number of dims"});
  expect_error([&] { scatter_add(x, 0, gi.to(DType::f32), ones({2, 2})); }, {"scatter_add", "f32"});

  Tensor w = zeros({4, 2});
  expect_error([&] { embedding(w, from_vector(std::vector<int32_t>{0, 4})); }, {"embedding", "index 4", "dim 0", "size 4", "[4, 2]"});
  expect_error([&] { embedding(w, neg); }, {"embedding", "index -1"});
  expect_error([&] { embedding(zeros({4}), ok); }, {"embedding", "2-D", "[4]"});
  expect_error([&] { embedding(w, ok.to(DType::bf16)); }, {"embedding", "bf16"});

  // A bad value at the far end of a large index (checked by the parallel range check).
  std::vector<int32_t> big(200000, 1);
  big.back() = 1000;
  Tensor bigi = from_vector(big);
  expect_error([&] { embedding(w, bigi); }, {"embedding", "index 1000", "size 4"});
  expect_error([&] { index_select(w, 0, bigi); }, {"index_select", "index 1000"});
  // The runtime keeps working afterwards.
  CHECK(index_select(x, 0, ok).shape() == Shape{2, 3});
  CHECK(embedding(w, from_vector(std::vector<int32_t>{0, 3})).shape() == Shape{2, 2});
}

}  // namespace tpu::testing
