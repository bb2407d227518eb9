// i64: names, sizes, PyTorch's promotion results, exact 64-bit arithmetic, casts, printing,
// safetensors I64 tensors (a file built byte by byte here), and the ops that take or return
// indices (embedding, index_select, gather with i64 ids; argmax/max(dim) return i64).
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "core/testing.h"
#include "tpucore/ops.h"
#include "tpucore/safetensors.h"

using namespace tpu;
using tpu::testing::expect_error;

TEST_CASE("i64: name, size, parsing and category", "[dtype][i64]") {
  CHECK(dtype_size(DType::i64) == 8);
  CHECK(dtype_name(DType::i64) == "i64");
  CHECK(parse_dtype("int64") == DType::i64);
  CHECK(parse_dtype("long") == DType::i64);
  CHECK(is_integral(DType::i64));
  CHECK_FALSE(is_floating(DType::i64));
  CHECK(dtype_category(DType::i64) == DTypeCategory::integer);
}

TEST_CASE("i64: promotion follows PyTorch's table", "[dtype][i64]") {
  // torch.promote_types results (int64 with each type).
  CHECK(promote_types(DType::i64, DType::i32) == DType::i64);
  CHECK(promote_types(DType::i8, DType::i64) == DType::i64);
  CHECK(promote_types(DType::i64, DType::u8) == DType::i64);
  CHECK(promote_types(DType::boolean, DType::i64) == DType::i64);
  CHECK(promote_types(DType::i64, DType::f16) == DType::f16);
  CHECK(promote_types(DType::bf16, DType::i64) == DType::bf16);
  CHECK(promote_types(DType::i64, DType::f32) == DType::f32);
  // A wrapped int scalar keeps the tensor's integer type; a float scalar gives f32.
  Tensor a = from_vector(std::vector<int64_t>{1, 2}, Shape{2}, DType::i64);
  CHECK(add(a, 3).dtype() == DType::i64);
  CHECK(mul(a, 0.5).dtype() == DType::f32);
  CHECK(add(a, from_vector(std::vector<int32_t>{1, 1})).dtype() == DType::i64);
}

TEST_CASE("i64: values beyond 32 bits survive creation, arithmetic, casts and reductions", "[dtype][i64]") {
  const int64_t big = int64_t{3} << 40;  // needs more than 32 bits
  Tensor a = from_vector(std::vector<int64_t>{big, -big, 7}, Shape{3}, DType::i64);
  CHECK(a.dtype() == DType::i64);
  CHECK(a.to_vector<int64_t>() == std::vector<int64_t>{big, -big, 7});
  CHECK(add(a, a).to_vector<int64_t>() == std::vector<int64_t>{2 * big, -2 * big, 14});
  CHECK(mul(a, 3).to_vector<int64_t>() == std::vector<int64_t>{3 * big, -3 * big, 21});
  CHECK(sum(a).item<int64_t>() == 7);
  CHECK(sum(a).dtype() == DType::i64);
  CHECK(to(a, DType::f32).to_vector<float>()[0] == static_cast<float>(big));
  CHECK(to(from_vector(std::vector<float>{2.5f, -1099511627776.0f}), DType::i64).to_vector<int64_t>() ==
        std::vector<int64_t>{2, -(int64_t{1} << 40)});  // -2^40 is exact in f32
  CHECK(a.str().find("dtype=i64") != std::string::npos);
  // Without asking for i64, 64-bit vectors keep defaulting to i32 (the default integer type).
  CHECK(from_vector(std::vector<int64_t>{1, 2}).dtype() == DType::i32);
}

TEST_CASE("i64: argmax, argmin and max(dim) indices are i64 as in PyTorch", "[dtype][i64][reduce]") {
  Tensor x = from_vector(std::vector<float>{1, 9, 3, 7, 2, 8}, Shape{2, 3});
  Tensor am = argmax(x, 1);
  CHECK(am.dtype() == DType::i64);
  CHECK(am.to_vector<int64_t>() == std::vector<int64_t>{1, 2});
  CHECK(argmin(x).item<int64_t>() == 0);
  auto [v, i] = max(x, 0);
  CHECK(i.dtype() == DType::i64);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1});
}

TEST_CASE("i64: token ids index embedding, index_select and gather", "[dtype][i64][index]") {
  Tensor w = from_vector(std::vector<float>{0, 1, 10, 11, 20, 21, 30, 31}, Shape{4, 2});
  Tensor ids = from_vector(std::vector<int64_t>{3, 0, 2, 2}, Shape{2, 2}, DType::i64);
  Tensor e = embedding(w, ids);
  CHECK(e.shape() == Shape{2, 2, 2});
  CHECK(e.to_vector<float>() == std::vector<float>{30, 31, 0, 1, 20, 21, 20, 21});
  Tensor s = index_select(w, 0, from_vector(std::vector<int64_t>{1, 3}, Shape{2}, DType::i64));
  CHECK(s.to_vector<float>() == std::vector<float>{10, 11, 30, 31});
  Tensor g = gather(w, 1, from_vector(std::vector<int64_t>{1, 0, 0, 1}, Shape{4, 1}, DType::i64));
  CHECK(g.to_vector<float>() == std::vector<float>{1, 10, 20, 31});
  expect_error([&] { embedding(w, from_vector(std::vector<int64_t>{4}, Shape{1}, DType::i64)); }, {"embedding", "4"});
  // A value that would wrap to a valid i32 index (2^32 + 1 -> 1) is an error, not row 1.
  const int64_t wraps = (int64_t{1} << 32) + 1;
  expect_error([&] { embedding(w, from_vector(std::vector<int64_t>{0, wraps}, Shape{2}, DType::i64)); },
               {"embedding", std::to_string(wraps)});
  expect_error([&] { gather(w, 0, from_vector(std::vector<int64_t>{-wraps}, Shape{1, 1}, DType::i64)); },
               {"gather", std::to_string(-wraps)});
}

TEST_CASE("i64: safetensors I64 tensors read from a hand-built file and round trip", "[dtype][i64][safetensors]") {
  const std::string header = R"({"ids":{"dtype":"I64","shape":[3],"data_offsets":[0,24]}})";
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  bytes.insert(bytes.end(), header.begin(), header.end());
  for (int64_t v : {int64_t{-1}, int64_t{5} << 33, int64_t{42}})
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
  SafetensorsContents c = parse_safetensors(bytes, "ids.safetensors");
  Tensor ids = c.tensors.at("ids");
  CHECK(ids.dtype() == DType::i64);
  CHECK(ids.to_vector<int64_t>() == std::vector<int64_t>{-1, int64_t{5} << 33, 42});
  CHECK(safetensors_dtype_name(DType::i64) == "I64");
  SafetensorsContents back = parse_safetensors(serialize_safetensors({{"ids", ids}}));
  CHECK(back.tensors.at("ids").to_vector<int64_t>() == ids.to_vector<int64_t>());
}
