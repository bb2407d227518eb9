// embedding on the simulated chip (tiny preset, codegen/embedding_kernel.cpp): rows of the table
// gathered by DMA equal a naive loop over host copies, for f32 and bf16 tables, i32 and i64
// ids, ids of several dims, more ids than one program takes (chunks), a row-strided table view;
// it runs on the chip (no host fallback, no cast of the ids); a bad id is a tpu::Error naming
// it and the runtime stays usable. The backward (scatter-add of grad rows by id) on the chip
// against a naive double loop, repeated ids included (one id more often than a program group
// holds), through autograd and as scatter_add onto a non-zero x; bad ids are a tpu::Error.
#include <catch2/catch.hpp>

#include "codegen_testing.h"
#include "tpucore/ops.h"

using namespace tpu;
using tpu::testing::expect_error;

namespace {

std::vector<float> naive_rows(const std::vector<float>& table, int64_t dim, const std::vector<int64_t>& ids) {
  std::vector<float> out;
  for (int64_t i : ids)
    for (int64_t d = 0; d < dim; ++d) out.push_back(table[static_cast<size_t>(i * dim + d)]);
  return out;
}

}  // namespace

TEST_CASE("embedding on the chip: rows gathered by DMA equal a naive loop", "[codegen][embedding]") {
  testing::TinySim tiny;
  const int64_t num = 50, dim = 12;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int64_t> pick(0, num - 1);
  for (DType dt : {DType::f32, DType::bf16})
    for (DType it : {DType::i64, DType::i32})
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{61}}) {
        CAPTURE(dtype_name(dt), dtype_name(it), n);
        const Tensor table = randn({num, dim}).to(dt);
        std::vector<int64_t> ids(static_cast<size_t>(n));
        for (auto& i : ids) i = pick(rng);
        ids.back() = num - 1;
        const Shape ishape = n % 2 == 0 ? Shape{2, n / 2} : Shape{n};
        const Tensor idx = from_vector(ids, ishape, DType::i64).to(it);
        const std::vector<float> want = naive_rows(table.to(DType::f32).to_vector<float>(), dim, ids);
        testing::ChipRunProbe::sync_all();
        codegen::reset_stats();
        const uint64_t fallbacks = ops::total_fallbacks();
        const Tensor got = embedding(table.to(tiny.dev()), idx.to(tiny.dev()));
        testing::ChipRunProbe::sync_all();
        Shape oshape = ishape;
        oshape.push_back(dim);
        CHECK(got.shape() == oshape);
        CHECK(got.to(Device()).to(DType::f32).to_vector<float>() == want);
        const codegen::CodegenStats s = codegen::stats();
        CHECK(s.host_fallbacks == 0);
        CHECK(ops::total_fallbacks() == fallbacks);
        CHECK(s.runs_by_kernel.at("embedding") == static_cast<uint64_t>((n + 23) / 24));
        // The cpu gives the same rows.
        CHECK(embedding(table, idx).to(DType::f32).to_vector<float>() == want);
      }
}

TEST_CASE("embedding on the chip: a row-strided table view and bad ids", "[codegen][embedding]") {
  testing::TinySim tiny;
  const Tensor wide = randn({10, 16}).to(tiny.dev());
  const Tensor table = narrow(wide, 1, 4, 8);  // rows 16 elements apart, 8 wide
  const std::vector<int64_t> ids{9, 0, 3, 3};
  const Tensor got = embedding(table, from_vector(ids, Shape{4}, TensorOptions(DType::i64, tiny.dev())));
  std::vector<float> host = contiguous(table).to(Device()).to_vector<float>();
  CHECK(got.to(Device()).to_vector<float>() == naive_rows(host, 8, ids));

  const Tensor w = randn({5, 4}).to(tiny.dev());
  expect_error([&] { embedding(w, from_vector(std::vector<int64_t>{1, 5}, Shape{2}, TensorOptions(DType::i64, tiny.dev()))); },
               {"embedding", "index 5 is out of range", "[5, 4]"});
  expect_error([&] { embedding(w, from_vector(std::vector<int64_t>{-1}, Shape{1}, TensorOptions(DType::i64, tiny.dev()))); },
               {"embedding", "index -1 is out of range"});
  const Tensor ok = embedding(w, from_vector(std::vector<int64_t>{4}, Shape{1}, TensorOptions(DType::i64, tiny.dev())));
  CHECK(ok.to(Device()).to_vector<float>() == narrow(w, 0, 4, 1).to(Device()).to_vector<float>());
}

namespace {

// weight grad [num, dim] of embedding(weight, ids) for output grads go [n, dim]: a naive loop in
// double, row i of go added to row ids[i].
std::vector<double> naive_scatter(const std::vector<float>& base, const std::vector<float>& go, int64_t dim,
                                  const std::vector<int64_t>& ids) {
  std::vector<double> w(base.begin(), base.end());
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t d = 0; d < dim; ++d) w[size_t(ids[i] * dim + d)] += double(go[i * size_t(dim) + size_t(d)]);
  return w;
}

double max_diff(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::abs(double(got[i]) - want[i]));
  return e;
}

}  // namespace

TEST_CASE("embedding backward on the chip: scatter-add of grad rows equals a naive loop, repeated ids included",
          "[codegen][embedding]") {
  testing::TinySim tiny;
  const int64_t num = 20, dim = 12;
  std::mt19937 rng(9);
  std::uniform_int_distribution<int64_t> pick(0, num - 1);
  for (DType dt : {DType::f32, DType::bf16})
    for (DType it : {DType::i64, DType::i32})
      for (int64_t n : {int64_t{1}, int64_t{9}, int64_t{80}}) {
        CAPTURE(dtype_name(dt), dtype_name(it), n);
        std::vector<int64_t> ids(static_cast<size_t>(n));
        for (auto& i : ids) i = pick(rng);
        if (n == 80)  // one id 40 times: more rows than one group of the program takes
          for (size_t i = 0; i < 40; ++i) ids[2 * i] = 3;
        if (n == 9) ids[8] = ids[0];  // a repeat
        const Tensor idx = from_vector(ids, Shape{n}, DType::i64).to(it);
        const Tensor go = randn({n, dim}).to(dt);
        const Tensor w0 = randn({num, dim}).to(dt);
        const std::vector<double> want_grad = naive_scatter(std::vector<float>(size_t(num * dim), 0.0f),
                                                            go.to(DType::f32).to_vector<float>(), dim, ids);
        const double tol = dt == DType::f32 ? 1e-4 : 0.08;
        // Through autograd: embedding forward and backward on the chip.
        testing::ChipRunProbe::sync_all();
        codegen::reset_stats();
        Tensor w = w0.to(tiny.dev()).requires_grad_();
        Tensor out = embedding(w, idx.to(tiny.dev()));
        Tensor loss = sum(mul(out, go.to(tiny.dev())).to(DType::f32));
        loss.backward();
        testing::ChipRunProbe::sync_all();
        REQUIRE(w.grad().defined());
        CHECK(max_diff(w.grad().to(Device()).to(DType::f32).to_vector<float>(), want_grad) < tol);
        const codegen::CodegenStats s = codegen::stats();
        CHECK(s.runs_by_kernel.count("scatter_add") == 1);
        CHECK(s.host_fallbacks == 0);  // forward, backward (zeros, scatter-add) and the loss on the chip
        // scatter_add itself, onto a non-zero x: x plus the rows.
        const std::vector<double> want = naive_scatter(w0.to(DType::f32).to_vector<float>(),
                                                       go.to(DType::f32).to_vector<float>(), dim, ids);
        testing::ChipRunProbe::sync_all();
        codegen::reset_stats();
        const Tensor got = scatter_add(w0.to(tiny.dev()), 0, expand(reshape(idx.to(tiny.dev()), Shape{n, 1}), Shape{n, dim}),
                                       go.to(tiny.dev()));
        testing::ChipRunProbe::sync_all();
        CHECK(max_diff(got.to(Device()).to(DType::f32).to_vector<float>(), want) < tol);
        CHECK(codegen::stats().host_fallbacks == 0);
        // The cpu's scatter_add agrees.
        CHECK(max_diff(scatter_add(w0, 0, expand(reshape(idx, Shape{n, 1}), Shape{n, dim}), go).to(DType::f32).to_vector<float>(),
                       want) < tol);
      }
}

TEST_CASE("embedding backward on the chip: an id out of range is a tpu::Error, other scatters take the host",
          "[codegen][embedding]") {
  testing::TinySim tiny;
  const TensorOptions f(DType::f32, tiny.dev());
  const Tensor x = zeros({5, 4}, f), src = ones({3, 4}, f);
  auto col = [&](std::vector<int64_t> v) {
    const int64_t n = static_cast<int64_t>(v.size());
    return expand(reshape(from_vector(v, Shape{n}, TensorOptions(DType::i64, tiny.dev())), Shape{n, 1}), Shape{n, 4});
  };
  expect_error([&] { scatter_add(x, 0, col({1, 5, 2}), src); }, {"scatter_add", "index 5 is out of range", "[5, 4]"});
  expect_error([&] { scatter_add(x, 0, col({-1, 0, 0}), src); }, {"scatter_add", "index -1 is out of range"});
  // Usable after; repeated ids add up.
  const std::vector<float> got = scatter_add(x, 0, col({4, 4, 0}), src).to(Device()).to_vector<float>();
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t c = 0; c < 4; ++c) CHECK(got[size_t(r * 4 + c)] == (r == 4 ? 2.0f : r == 0 ? 1.0f : 0.0f));
  // A general scatter (different ids within a row) runs on the host and still equals the cpu.
  const Tensor idx2 = from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1}, Shape{3, 4}, DType::i64);
  const Tensor want = scatter_add(zeros({5, 4}), 0, idx2, ones({3, 4}));
  const Tensor got2 = scatter_add(x, 0, idx2.to(tiny.dev()), src);
  CHECK(got2.to(Device()).to_vector<float>() == want.to_vector<float>());
}

// index_select along dim 0 of a tensor with contiguous rows is the embedding row gather:
// against a naive loop over the rows and against the cpu op, for f32 and bf16, i32 and i64
// indices, 1-D, 2-D and 3-D x, more indices than one program takes, repeated indices and a
// row-strided view (rows 2 apart); other selections (dim 1, rows not contiguous) still equal
// the cpu op through the host; a bad index is a tpu::Error.
TEST_CASE("index_select along dim 0 on the chip: rows gathered by DMA equal a naive loop and the cpu op",
          "[codegen][embedding]") {
  testing::TinySim tiny;
  std::mt19937 rng(9);
  const int64_t num = 40;
  const auto run = [&](const Tensor& x, const std::vector<int64_t>& ids, DType it, bool on_chip) {
    const Tensor idx = from_vector(ids, Shape{static_cast<int64_t>(ids.size())}, DType::i64).to(it);
    const Tensor xf = x.to(DType::f32).contiguous();
    const int64_t row = x.dim() > 1 ? xf.numel() / x.size(0) : 1;
    const std::vector<float> want = naive_rows(xf.to_vector<float>(), row, ids);
    testing::ChipRunProbe::sync_all();
    codegen::reset_stats();
    const uint64_t fallbacks = ops::total_fallbacks();
    const Tensor got = index_select(x.to(tiny.dev()), 0, idx.to(tiny.dev()));
    testing::ChipRunProbe::sync_all();
    const codegen::CodegenStats s = codegen::stats();
    Shape os = x.shape();
    os[0] = static_cast<int64_t>(ids.size());
    CHECK(got.shape() == os);
    CHECK(got.to(Device()).to(DType::f32).contiguous().to_vector<float>() == want);
    CHECK(index_select(x, 0, idx).to(DType::f32).contiguous().to_vector<float>() == want);
    if (on_chip) {
      CHECK(s.host_fallbacks == 0);
      CHECK(ops::total_fallbacks() == fallbacks);
      CHECK(s.runs_by_kernel.at("index_select") == (ids.size() + 23) / 24);
    }
  };
  for (DType dt : {DType::f32, DType::bf16})
    for (DType it : {DType::i64, DType::i32})
      for (const Shape& sh : {Shape{num}, Shape{num, 12}, Shape{num, 2, 3}})
        for (int64_t n : {int64_t{1}, int64_t{30}}) {
          CAPTURE(dtype_name(dt), dtype_name(it), sh.str(), n);
          std::uniform_int_distribution<int64_t> pick(0, num - 1);
          std::vector<int64_t> ids(static_cast<size_t>(n));
          for (auto& i : ids) i = pick(rng);
          ids.back() = num - 1;
          if (n > 2) ids[1] = ids[0];
          run(randn(sh).to(dt), ids, it, true);
        }
  // A row-strided view: rows of 5 elements, 10 apart.
  const Tensor wide = randn({num, 10});
  run(narrow(wide, 1, 2, 5), {3, 0, 39, 3}, DType::i64, true);
  // Selections the gather does not take equal the cpu op through the host.
  const Tensor x = randn({6, 7});
  const Tensor idx = from_vector(std::vector<int64_t>{4, 0, 4}, Shape{3}, DType::i64);
  CHECK(index_select(x.to(tiny.dev()), 1, idx.to(tiny.dev())).to(Device()).to_vector<float>() ==
        index_select(x, 1, idx).to_vector<float>());
  const Tensor xt = transpose(x, 0, 1);  // [7, 6] whose rows are not contiguous
  CHECK(index_select(transpose(x.to(tiny.dev()), 0, 1), 0, idx.to(tiny.dev())).to(Device()).contiguous()
            .to_vector<float>() == index_select(xt, 0, idx).contiguous().to_vector<float>());
  expect_error([&] { index_select(x.to(tiny.dev()), 0, from_vector(std::vector<int64_t>{1, 6}, Shape{2}, TensorOptions(DType::i64, tiny.dev()))); },
               {"index_select", "index 6 is out of range", "[6, 7]"});
  expect_error([&] { index_select(x.to(tiny.dev()), 0, from_vector(std::vector<int64_t>{-1}, Shape{1}, TensorOptions(DType::i64, tiny.dev()))); },
               {"index_select", "index -1 is out of range"});
  const Tensor ok = index_select(x.to(tiny.dev()), 0, from_vector(std::vector<int64_t>{5}, Shape{1}, DType::i64).to(tiny.dev()));
  CHECK(ok.to(Device()).to_vector<float>() == narrow(x, 0, 5, 1).to_vector<float>());
}
