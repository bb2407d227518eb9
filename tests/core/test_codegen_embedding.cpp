// embedding on the simulated chip (tiny preset, codegen/embedding_kernel.cpp): rows of the table
// gathered by DMA equal a naive loop over host copies, for f32 and bf16 tables, i32 and i64
// ids, ids of several dims, more ids than one program takes (chunks), a row-strided table view;
// it runs on the chip (no host fallback, no cast of the ids); a bad id is a tpu::Error naming
// it and the runtime stays usable.
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
