// cat, stack, split, chunk: OpInfo entries (naive references), promotion across inputs,
// views of split/chunk, and the error cases.
#include "index_test_util.h"

namespace tpu::testing {
namespace {

using L = Layout;

std::vector<Tensor> tensors_of(const std::vector<Tensor>& ins) { return {ins.begin(), ins.end() - 1}; }

Ref cat_reference(const std::vector<Ref>& refs) {
  const int64_t dim0 = params_of(refs.back())[0];
  std::vector<const Ref*> xs;
  int nd = 0;
  for (size_t i = 0; i + 1 < refs.size(); ++i) nd = std::max(nd, refs[i].shape.ndim());
  for (size_t i = 0; i + 1 < refs.size(); ++i) {
    const Ref& r = refs[i];
    if (nd > 1 && r.shape.ndim() == 1 && r.shape[0] == 0) continue;  // legacy empty
    xs.push_back(&r);
  }
  const int d = wrap(dim0, nd);
  Shape out = xs[0]->shape;
  out[d] = 0;
  for (const Ref* r : xs) out[d] += r->shape[d];
  Ref o(out);
  for (int64_t f = 0; f < o.numel(); ++f) {
    auto idx = unflatten(out, f);
    int64_t k = idx[static_cast<size_t>(d)];
    for (const Ref* r : xs) {
      if (k < r->shape[d]) {
        auto j = idx;
        j[static_cast<size_t>(d)] = k;
        o.v[static_cast<size_t>(f)] = r->at(j);
        break;
      }
      k -= r->shape[d];
    }
  }
  return o;
}

OpInfoRegistrar reg_cat({
    .op = "cat",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          return std::vector<OpSample>{
              {"dim 0, contiguous + transposed", {mk({3, 4}, L::contiguous), mk({2, 4}, L::transposed), params({0})}},
              {"dim -1, sliced + expanded + contiguous",
               {mk({3, 2}, L::sliced), mk({3, 5}, L::expanded), mk({3, 1}, L::contiguous), params({-1})}},
              {"3-D dim 1", {mk({2, 3, 4}, L::transposed), mk({2, 1, 4}, L::sliced), params({1})}},
              {"3-D dim -3", {mk({2, 3, 2}, L::expanded), mk({1, 3, 2}, L::contiguous), params({-3})}},
              {"one 1-D input", {mk({5}, L::sliced), params({0})}},
              {"zero-size parts", {mk({0, 4}, L::contiguous), mk({2, 4}, L::transposed), mk({0, 4}, L::contiguous),
                                   params({0})}},
              {"zero-size result", {mk({3, 0}, L::contiguous), mk({3, 0}, L::contiguous), params({1})}},
              {"legacy empty [0] beside 2-D", {mk({0}, L::contiguous), mk({2, 3}, L::transposed), params({1})}},
              {"many inputs", {mk({1, 3}, L::contiguous), mk({2, 3}, L::sliced), mk({1, 3}, L::contiguous),
                               mk({3, 3}, L::transposed), mk({1, 3}, L::contiguous), params({0})}},
          };
        },
    .run = [](const std::vector<Tensor>& ins) { return cat(tensors_of(ins), params_of(ins.back())[0]); },
    .reference = [](const std::vector<Ref>& refs, DType) { return cat_reference(refs); },
    .tol = exact_tol,
});

Ref stack_reference(const std::vector<Ref>& refs) {
  const auto n = static_cast<int64_t>(refs.size() - 1);
  const Shape in = refs[0].shape;
  const int d = wrap(params_of(refs.back())[0], in.ndim() + 1);
  Shape out = in;
  out.insert(d, n);
  Ref o(out);
  for (int64_t f = 0; f < o.numel(); ++f) {
    auto idx = unflatten(out, f);
    const int64_t which = idx[static_cast<size_t>(d)];
    idx.erase(idx.begin() + d);
    o.v[static_cast<size_t>(f)] = refs[static_cast<size_t>(which)].at(idx);
  }
  return o;
}

OpInfoRegistrar reg_stack({
    .op = "stack",
    .dtypes = all_dtypes(),
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l); };
          return std::vector<OpSample>{
              {"two [3, 4] at dim 0", {mk({3, 4}, L::contiguous), mk({3, 4}, L::transposed), params({0})}},
              {"three [2, 3] at dim -1",
               {mk({2, 3}, L::sliced), mk({2, 3}, L::expanded), mk({2, 3}, L::contiguous), params({-1})}},
              {"3-D at dim 1", {mk({2, 3, 2}, L::transposed), mk({2, 3, 2}, L::sliced), params({1})}},
              {"3-D at dim 3", {mk({2, 1, 2}, L::contiguous), mk({2, 1, 2}, L::sliced), params({3})}},
              {"0-d inputs", {mk({}, L::contiguous), mk({}, L::contiguous), mk({}, L::contiguous), params({0})}},
              {"zero-size inputs", {mk({0, 3}, L::contiguous), mk({0, 3}, L::contiguous), params({2})}},
          };
        },
    .run = [](const std::vector<Tensor>& ins) { return stack(tensors_of(ins), params_of(ins.back())[0]); },
    .reference = [](const std::vector<Ref>& refs, DType) { return stack_reference(refs); },
    .tol = exact_tol,
});

Tensor iota(const Shape& s, DType dt = DType::f32) {
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return from_vector(v, s).to(dt);
}

}  // namespace

TEST_CASE("cat/stack: type promotion across inputs", "[join]") {
  struct Case {
    DType a, b, want;
  };
  for (Case c : {Case{DType::i32, DType::f32, DType::f32}, Case{DType::u8, DType::i8, DType::i32},
                 Case{DType::bf16, DType::f16, DType::f32}, Case{DType::boolean, DType::u8, DType::u8},
                 Case{DType::i8, DType::bf16, DType::bf16}, Case{DType::boolean, DType::boolean, DType::boolean}}) {
    INFO(dtype_name(c.a) << " + " << dtype_name(c.b));
    Tensor x = iota({2, 2}, c.a), y = iota({1, 2}, c.b);
    Tensor r = cat({x, y}, 0);
    CHECK(r.dtype() == c.want);
    check_close(r, cat_reference({ref_of(x), ref_of(y), ref_of(params({0}))}), {0, 0}, "promoted cat");
    CHECK(stack({x, x.to(c.b)}, 1).dtype() == promote_types(c.a, c.b));
  }
}

TEST_CASE("cat/stack: more inputs than the front half's cast mask", "[join]") {
  std::vector<Tensor> xs;
  for (int i = 0; i < 40; ++i) xs.push_back(full({1, 2}, i, DType::i32));
  xs.push_back(full({1, 2}, 0.5, DType::f32));  // input 40 decides the dtype
  Tensor r = cat(xs, 0);
  REQUIRE(r.dtype() == DType::f32);
  REQUIRE(r.shape() == Shape{41, 2});
  auto v = r.to_vector<float>();
  for (int i = 0; i < 40; ++i) CHECK(v[static_cast<size_t>(2 * i + 1)] == static_cast<float>(i));
  CHECK(v[80] == 0.5f);
  Tensor s = stack(xs, -1);
  CHECK(s.shape() == Shape{1, 2, 41});
  CHECK(s.select(2, 40).to_vector<float>() == std::vector<float>{0.5f, 0.5f});
}

TEST_CASE("cat/stack: large inputs match the reference (parallel paths)", "[join]") {
  Generator g(7);
  // Few large inputs (each copy parallel) and many mid-sized ones (parallel over inputs).
  std::vector<Tensor> big{make_input(g, {300, 130}, DType::f32, Layout::transposed),
                          make_input(g, {300, 257}, DType::f32, Layout::contiguous)};
  std::vector<Ref> refs{ref_of(big[0]), ref_of(big[1]), ref_of(params({1}))};
  check_close(cat(big, 1), cat_reference(refs), {0, 0}, "cat of two large inputs");
  std::vector<Tensor> many;
  std::vector<Ref> mrefs;
  for (int i = 0; i < 12; ++i) {
    many.push_back(make_input(g, {64, 100}, DType::bf16, i % 2 ? Layout::sliced : Layout::contiguous));
    mrefs.push_back(ref_of(many.back()));
  }
  mrefs.push_back(ref_of(params({0})));
  check_close(cat(many, 0), cat_reference(mrefs), {0, 0}, "cat of many inputs");
  mrefs.back() = ref_of(params({1}));
  check_close(stack(many, 1), stack_reference(mrefs), {0, 0}, "stack of many inputs");
}

TEST_CASE("cat/stack: errors", "[join][errors]") {
  Tensor a = zeros({2, 3}), b = zeros({2, 4}), c = zeros({2, 3, 1});
  expect_error([&] { cat({}, 0); }, {"cat", "empty"});
  expect_error([&] { stack({}, 0); }, {"stack", "empty"});
  expect_error([&] { cat({a, b}, 0); }, {"cat", "tensor 1", "[2, 4]", "tensor 0", "[2, 3]", "dim 1"});
  expect_error([&] { cat({a, c}, 0); }, {"cat", "tensor 1", "3 dims", "[2, 3, 1]"});
  expect_error([&] { cat({a, a}, 2); }, {"cat", "dim 2", "out of range"});
  expect_error([&] { cat({a, a}, -3); }, {"cat", "dim -3"});
  expect_error([&] { cat({a, scalar_tensor(1.0)}, 0); }, {"cat", "zero-dimensional", "input 1"});
  expect_error([&] { cat({a, Tensor()}, 0); }, {"cat", "undefined"});
  expect_error([&] { cat({a, on_fake_device(a)}, 0); }, {"cat", "same device", "cpu", "sim:0"});
  expect_error([&] { stack({a, b}, 0); }, {"stack", "tensor 1", "[2, 4]", "[2, 3]"});
  expect_error([&] { stack({a, a}, 3); }, {"stack", "dim 3"});
  expect_error([&] { stack({a, on_fake_device(a)}, 0); }, {"stack", "same device"});
  // The runtime keeps working afterwards.
  CHECK(cat({a, a}, 1).shape() == Shape{2, 6});
}

TEST_CASE("split/chunk: views of the right pieces", "[join]") {
  Tensor x = iota({7, 3});
  auto parts = split(x, 3, 0);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].shape() == Shape{3, 3});
  CHECK(parts[2].shape() == Shape{1, 3});
  CHECK(parts[2].to_vector<float>() == std::vector<float>{18, 19, 20});
  for (auto& p : parts) CHECK(p.storage() == x.storage());  // no copy
  parts[1].fill_(-1.0);
  CHECK(x.select(0, 4).to_vector<float>() == std::vector<float>{-1, -1, -1});

  auto cols = split(x, std::vector<int64_t>{1, 0, 2}, -1);
  REQUIRE(cols.size() == 3);
  CHECK(cols[0].shape() == Shape{7, 1});
  CHECK(cols[1].shape() == Shape{7, 0});
  CHECK(cols[2].shape() == Shape{7, 2});
  CHECK(cols[2].select(0, 0).to_vector<float>() == std::vector<float>{1, 2});
  CHECK(cols[2].stride(0) == 3);

  auto ch = chunk(x, 3, 0);  // ceil(7 / 3) = 3 rows per chunk
  REQUIRE(ch.size() == 3);
  CHECK(ch[0].shape() == Shape{3, 3});
  CHECK(ch[2].shape() == Shape{1, 3});
  CHECK(chunk(x, 4, 0).size() == 4);   // 2, 2, 2, 1
  CHECK(chunk(x, 6, 0).size() == 4);   // 2 rows each: fewer chunks than asked, as PyTorch
  CHECK(chunk(x, 10, 1).size() == 3);  // one column each
  auto ec = chunk(zeros({0, 2}), 3, 0);
  CHECK(ec.size() == 3);
  for (auto& e : ec) CHECK(e.shape() == Shape{0, 2});
  auto es = split(zeros({0, 2}), 2, 0);
  REQUIRE(es.size() == 1);
  CHECK(es[0].shape() == Shape{0, 2});
  CHECK(split(zeros({0, 2}), 0, 0).size() == 1);
  // Non-contiguous input: pieces are views of the transposed layout.
  Tensor t = iota({3, 4}).t();
  auto tp = split(t, 2, 0);
  REQUIRE(tp.size() == 2);
  CHECK(tp[1].to_vector<float>() == std::vector<float>{2, 6, 10, 3, 7, 11});
  // cat of split pieces gives back the input.
  CHECK(equal(cat(split(t, 3, 1), 1), t));
  CHECK(equal(cat(chunk(x, 3, 0), 0), x));
}

TEST_CASE("split/chunk: errors", "[join][errors]") {
  Tensor x = zeros({5, 3});
  expect_error([&] { split(x, std::vector<int64_t>{2, 2}, 0); }, {"split", "[2, 2]", "sum to 4", "size 5"});
  expect_error([&] { split(x, std::vector<int64_t>{6, -1}, 0); }, {"split", "non-negative"});
  expect_error([&] { split(x, std::vector<int64_t>{}, 0); }, {"split", "empty"});
  expect_error([&] { split(x, 0, 0); }, {"split", "split_size", "size 5"});
  expect_error([&] { split(x, -2, 0); }, {"split", "-2"});
  expect_error([&] { split(x, 2, 2); }, {"split", "dim 2"});
  expect_error([&] { split(scalar_tensor(1.0), 1, 0); }, {"split", "0-d"});
  expect_error([&] { chunk(x, 0, 0); }, {"chunk", "positive", "0"});
  expect_error([&] { chunk(x, 2, -3); }, {"chunk", "dim -3"});
  CHECK(split(x, 2, 0).size() == 3);
}

}  // namespace tpu::testing
