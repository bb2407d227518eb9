// The indexing and joining ops under tpu::compile: their meta functions run on proxy tensors
// (shapes and dtypes only), and the compiled results equal eager ones.
#include "index_test_util.h"
#include "jit_testing.h"

namespace tpu::testing {

TEST_CASE("index ops: traced and compiled results equal eager", "[index][jit]") {
  auto fn = [](const Tensor& w, const Tensor& ids, const Tensor& x) {
    Tensor e = embedding(w, ids);                           // [2, 3, 4]
    Tensor c = cat({e.select(0, 0), x, e.select(0, 1)}, 0);  // [8, 4]
    auto parts = split(c, 3, 0);                            // 3, 3, 2 rows
    Tensor s = stack({parts[0], parts[1]}, 1);              // [3, 2, 4]
    Tensor m = masked_fill(s, gt(s, 0.5), 0.25);
    Tensor g = gather(m.flatten(1), 1, one_hot(ids.select(0, 0), 8));  // [3, 8]
    Tensor t = tril(g, -1) + triu(g, 2);
    Tensor sa = scatter_add(t, 0, zeros({1, 8}, DType::i32), ones({1, 8}));
    return index_select(sa, 1, ids.flatten()) + chunk(parts[2], 2, 1)[1].sum();
  };
  Generator g(3);
  Tensor w = make_input(g, {10, 4}, DType::f32, Layout::transposed);
  Tensor ids = make_input(g, {2, 3}, DType::i32, Layout::contiguous, 0, 8);
  Tensor x = make_input(g, {2, 4}, DType::f32, Layout::sliced);
  CompileOptions o;
  o.name = "index_ops";
  o.verify = 1;
  auto f = compile(fn, o);
  jit_testing::expect_close(f(w, ids, x), fn(w, ids, x), 1e-6, 1e-6, "first call");
  jit_testing::expect_close(f(w, ids, x), fn(w, ids, x), 1e-6, 1e-6, "cache hit");
}

TEST_CASE("index ops: out-of-range indices inside a compiled function are errors", "[index][jit][errors]") {
  auto fn = [](const Tensor& w, const Tensor& ids) { return embedding(w, ids) * 2.0; };
  auto f = compile(fn);
  Tensor w = ones({4, 3});
  CHECK(f(w, from_vector(std::vector<int32_t>{0, 3})).shape() == Shape{2, 3});
  expect_error([&] { f(w, from_vector(std::vector<int32_t>{0, 9})); }, {"embedding", "index 9", "size 4"});
  CHECK(f(w, from_vector(std::vector<int32_t>{1, 2})).to_vector<float>() == std::vector<float>(6, 2.0f));
}

}  // namespace tpu::testing
