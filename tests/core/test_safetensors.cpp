// safetensors: round trips of every dtype and layout, a file built byte by byte by an encoder
// written here (not the library's writer), every malformed-file case as a named tpu::Error, and
// random corruptions that must only ever produce errors.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/testing.h"
#include "tpucore/ops.h"
#include "tpucore/safetensors.h"

using namespace tpu;
using tpu::testing::expect_error;

namespace {

using Bytes = std::vector<uint8_t>;

// Independent encoder: u64 LE header length, the header text verbatim, then the data bytes.
Bytes encode(const std::string& header, const Bytes& data, std::optional<uint64_t> len_override = std::nullopt) {
  Bytes out;
  const uint64_t n = len_override.value_or(header.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void put_f32(Bytes& b, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(u >> (8 * i)));
}
void put_u16(Bytes& b, uint16_t u) {
  b.push_back(static_cast<uint8_t>(u));
  b.push_back(static_cast<uint8_t>(u >> 8));
}
void put_i32(Bytes& b, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(u >> (8 * i)));
}

std::filesystem::path temp_dir() {
  static int counter = 0;
  auto p = std::filesystem::temp_directory_path() /
           fmt::format("tpucore_safetensors_{}_{}", static_cast<long>(::getpid()), counter++);
  std::filesystem::create_directories(p);
  return p;
}

void write_file(const std::filesystem::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

SafetensorsContents parse(const Bytes& b) { return parse_safetensors(b, "bad.safetensors"); }

// A header with one F32 tensor "w" of shape [2] at the given offsets, and n data bytes.
Bytes one_tensor(const std::string& entry, size_t data_bytes) {
  return encode("{\"w\":" + entry + "}", Bytes(data_bytes, 0));
}

}  // namespace

TEST_CASE("safetensors: round trip of every dtype, 0-d, zero-size and non-contiguous tensors", "[safetensors]") {
  Generator g(7);
  TensorList in;
  for (DType dt : tpu::testing::all_dtypes()) {
    const std::string n(dtype_name(dt));
    in.emplace_back(n + ".matrix", tpu::testing::make_input(g, {3, 5}, dt, tpu::testing::Layout::contiguous));
    in.emplace_back(n + ".transposed", tpu::testing::make_input(g, {4, 3}, dt, tpu::testing::Layout::transposed));
    in.emplace_back(n + ".scalar", tpu::testing::make_input(g, {}, dt, tpu::testing::Layout::contiguous));
    in.emplace_back(n + ".empty", zeros({0}, dt));
    in.emplace_back(n + ".empty3d", zeros({3, 0, 2}, dt));
  }
  in.emplace_back("on_sim", randn({2, 3}).to(Device("sim:0")));
  const StringMap meta{{"format", "pt"}, {"step", "42"}};

  auto check = [&](const SafetensorsContents& c) {
    REQUIRE(c.tensors.size() == in.size());
    CHECK(c.metadata == meta);
    for (const auto& [name, t] : in) {
      INFO(name);
      REQUIRE(c.tensors.count(name) == 1);
      const Tensor& got = c.tensors.at(name);
      CHECK(got.dtype() == t.dtype());
      CHECK(got.shape() == t.shape());
      CHECK(got.device().is_cpu());
      CHECK(got.is_contiguous());
      CHECK(equal(got, t.to(Device())));
    }
  };
  const Bytes bytes = serialize_safetensors(in, meta);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<size_t>(i)];
  CHECK((8 + n) % 8 == 0);  // data buffer 8-byte aligned
  check(parse_safetensors(bytes));

  const auto dir = temp_dir();
  const std::string path = (dir / "all.safetensors").string();
  save_safetensors(path, in, meta);
  check(read_safetensors(path));
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));

  // The map overload, and loading onto a device.
  std::map<std::string, Tensor> m{{"b", ones({2})}, {"a", arange(6).reshape({2, 3})}};
  save_safetensors(path, m);
  auto back = load_safetensors(path, Device("sim:0"));
  REQUIRE(back.size() == 2);
  CHECK(back.at("a").device() == Device("sim:0"));
  CHECK(equal(back.at("a").to(Device()), m.at("a")));
  std::filesystem::remove_all(dir);
}

TEST_CASE("safetensors: a file written byte by byte by an independent encoder", "[safetensors]") {
  // Offsets are deliberately not in name order, the header has padding spaces and an unknown
  // field, and the data of "w" comes after "idx".
  Bytes data;
  put_i32(data, -7);  // idx: I32 [2] at [0, 8)
  put_i32(data, 123456);
  put_f32(data, 1.5f);  // w: F32 [2, 2] at [8, 24)
  put_f32(data, -2.0f);
  put_f32(data, 0.0f);
  put_f32(data, 1e-3f);
  put_u16(data, 0x3F80);  // h: BF16 [2] at [24, 28): 1.0, -2.0
  put_u16(data, 0xC000);
  put_u16(data, 0x3C00);  // f: F16 [] at [28, 30): 1.0
  data.push_back(0xFE);   // i8: I8 [3] at [30, 33): -2, 127, 0
  data.push_back(0x7F);
  data.push_back(0x00);
  data.push_back(0x00);  // mask: BOOL [2] at [33, 35)
  data.push_back(0x01);
  data.push_back(200);  // u: U8 [1] at [35, 36)
  const std::string header =
      R"({"__metadata__":{"who":"hand"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]},)"
      R"("idx":{"dtype":"I32","shape":[2],"data_offsets":[0,8],"extra":"ignored"},)"
      R"("h":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]},"f":{"dtype":"F16","shape":[],"data_offsets":[28,30]},)"
      R"("i8":{"dtype":"I8","shape":[3],"data_offsets":[30,33]},"mask":{"dtype":"BOOL","shape":[2],"data_offsets":[33,35]},)"
      R"("u":{"dtype":"U8","shape":[1],"data_offsets":[35,36]},"z":{"dtype":"F32","shape":[0,4],"data_offsets":[36,36]}}   )";
  const auto c = parse_safetensors(encode(header, data));
  CHECK(c.metadata == StringMap{{"who", "hand"}});
  REQUIRE(c.tensors.size() == 8);
  CHECK(c.tensors.at("w").shape() == Shape{2, 2});
  CHECK(c.tensors.at("w").to_vector<float>() == std::vector<float>{1.5f, -2.0f, 0.0f, 1e-3f});
  CHECK(c.tensors.at("idx").to_vector<int32_t>() == std::vector<int32_t>{-7, 123456});
  CHECK(c.tensors.at("h").dtype() == DType::bf16);
  CHECK(c.tensors.at("h").to_vector<float>() == std::vector<float>{1.0f, -2.0f});
  CHECK(c.tensors.at("f").dim() == 0);
  CHECK(c.tensors.at("f").item<float>() == 1.0f);
  CHECK(c.tensors.at("i8").to_vector<int8_t>() == std::vector<int8_t>{-2, 127, 0});
  CHECK(c.tensors.at("mask").to_vector<bool>() == std::vector<bool>{false, true});
  CHECK(c.tensors.at("u").to_vector<uint8_t>() == std::vector<uint8_t>{200});
  CHECK(c.tensors.at("z").shape() == Shape{0, 4});

  // Our writer's bytes decode with the same independent reading of the format.
  const Bytes ours = serialize_safetensors({{"x", from_vector(std::vector<float>{3.0f, -1.0f})}});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | ours[static_cast<size_t>(i)];
  const std::string h(ours.begin() + 8, ours.begin() + 8 + static_cast<long>(n));
  CHECK(h.find(R"("x":{"data_offsets":[0,8],"dtype":"F32","shape":[2]})") != std::string::npos);
  REQUIRE(ours.size() == 8 + n + 8);
  float v[2];
  std::memcpy(v, ours.data() + 8 + n, 8);
  CHECK(v[0] == 3.0f);
  CHECK(v[1] == -1.0f);
}

TEST_CASE("safetensors: every malformed file is a tpu::Error naming the file and the field", "[safetensors]") {
  const std::string ok = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  // Truncation and header length.
  expect_error([&] { parse({}); }, {"bad.safetensors", "truncated file", "0 bytes"});
  expect_error([&] { parse(Bytes{1, 2, 3, 4, 5}); }, {"truncated file", "5 bytes"});
  expect_error([&] { parse(encode("{}", {}, 1000)); }, {"bad.safetensors", "truncated file", "header length is 1000"});
  expect_error([&] { parse(encode("{}", {}, uint64_t{1} << 40)); }, {"absurd header length 1099511627776"});
  expect_error([&] { parse(encode("{}", {}, ~uint64_t{0})); }, {"absurd header length"});
  expect_error([&] { parse(encode("", {})); }, {"must start with '{'"});
  // JSON.
  expect_error([&] { parse(encode("[1, 2]", {})); }, {"must start with '{'"});
  expect_error([&] { parse(encode(R"({"w": {"dtype": )", {})); }, {"bad.safetensors", "not valid JSON"});
  expect_error([&] { parse(encode(R"({"w": 1} trailing)", {})); }, {"not valid JSON"});
  expect_error([&] { parse(encode("{\"w\":" + ok + ",\"w\":" + ok + "}", Bytes(8, 0))); },
               {"duplicate tensor name 'w'"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8)); },
               {"duplicate key 'dtype'"});
  expect_error([&] { parse(one_tensor("[1]", 0)); }, {"tensor 'w'", "must be an object", "array"});
  // Missing or ill-typed fields.
  expect_error([&] { parse(one_tensor(R"({"shape":[2],"data_offsets":[0,8]})", 8)); },
               {"bad.safetensors", "tensor 'w'", "missing field 'dtype'"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F32","data_offsets":[0,8]})", 8)); }, {"missing field 'shape'"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F32","shape":[2]})", 8)); }, {"missing field 'data_offsets'"});
  expect_error([&] { parse(one_tensor(R"({"dtype":7,"shape":[2],"data_offsets":[0,8]})", 8)); },
               {"field 'dtype' must be a string"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F33","shape":[2],"data_offsets":[0,8]})", 8)); },
               {"tensor 'w'", "unknown dtype 'F33'", "supported: F32, BF16"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F64","shape":[1],"data_offsets":[0,8]})", 8)); },
               {"tensor 'w'", "dtype 'F64' is not supported by tpucore"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})", 8)); },
               {"field 'shape' must be an array"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", 8)); },
               {"tensor 'w'", "negative dimension -2"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,8]})", 8)); },
               {"not an integer"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]})", 8)); },
               {"9 dimensions"});
  expect_error(
      [&] { parse(one_tensor(R"({"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]})", 8)); },
      {"too large"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})", 8)); },
               {"field 'data_offsets' must be [begin, end]"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})", 8)); },
               {"non-negative integers"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F32","shape":[0],"data_offsets":[8,4]})", 8)); },
               {"end before they begin"});
  // Sizes and layout.
  expect_error([&] { parse(one_tensor(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})", 8)); },
               {"tensor 'w'", "span 8 bytes", "shape [3] of F32 needs 12"});
  expect_error([&] { parse(one_tensor(ok, 4)); }, {"tensor 'w'", "out of range", "data buffer has 4 bytes"});
  expect_error([&] { parse(one_tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[8,16]})", 16)); },
               {"bytes [0, 8) of the data buffer belong to no tensor"});
  expect_error([&] { parse(one_tensor(ok, 12)); }, {"12 bytes but the tensors cover only 8", "trailing"});
  expect_error(
      [&] {
        parse(encode(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                     Bytes(12, 0)));
      },
      {"tensors 'a' [0, 8) and 'b' [4, 12) overlap"});
  expect_error(
      [&] {
        parse(encode(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                     R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                     Bytes(4, 0)));
      },
      {"overlap"});
  // Metadata.
  expect_error([&] { parse(encode(R"({"__metadata__":{"k":1}})", {})); }, {"'__metadata__' entry 'k' must be a string"});
  expect_error([&] { parse(encode(R"({"__metadata__":[]})", {})); }, {"'__metadata__' must be an object"});

  // Files: missing, truncated on disk (the message names the path).
  const auto dir = temp_dir();
  const std::string path = (dir / "cut.safetensors").string();
  expect_error([&] { load_safetensors(path); }, {"cannot open", "cut.safetensors"});
  Bytes full = serialize_safetensors({{"w", randn({16})}});
  full.resize(full.size() - 3);
  write_file(path, full);
  expect_error([&] { load_safetensors(path); }, {path, "tensor 'w'", "out of range"});
  full.resize(20);
  write_file(path, full);
  expect_error([&] { load_safetensors(path); }, {path, "truncated file"});

  // The runtime keeps working.
  const Tensor x = arange(4).to(DType::f32);
  auto back = parse_safetensors(serialize_safetensors({{"x", x}}));
  CHECK(equal(back.tensors.at("x"), x));
  std::filesystem::remove_all(dir);
}

TEST_CASE("safetensors: bad saves and the checkpoint-tensor check", "[safetensors]") {
  const Tensor a = ones({2});
  expect_error([&] { serialize_safetensors({{"a", a}, {"a", a}}); }, {"save_safetensors", "duplicate tensor name 'a'"});
  expect_error([&] { serialize_safetensors({{"__metadata__", a}}); }, {"'__metadata__' is reserved"});
  expect_error([&] { serialize_safetensors({{"u", Tensor()}}); }, {"tensor 'u' is undefined"});
  expect_error([&] { save_safetensors("/nonexistent-dir/x.safetensors", TensorList{{"a", a}}); },
               {"save_safetensors", "/nonexistent-dir/x.safetensors.tmp"});

  expect_error([&] { check_checkpoint_tensor("load_state_dict", "fc.weight", "m.safetensors", ones({10, 4}, DType::bf16), ones({10, 4})); },
               {"load_state_dict: tensor 'fc.weight' in m.safetensors is bf16 [10, 4], the module expects f32 [10, 4]"});
  expect_error([&] { check_checkpoint_tensor("load_state_dict", "b", "m.safetensors", ones({3}), ones({4})); },
               {"is f32 [3], the module expects f32 [4]"});
  expect_error([&] { check_checkpoint_tensor("load_state_dict", "b", "m.safetensors", Tensor(), ones({4})); },
               {"tensor 'b' is missing from m.safetensors"});
  check_checkpoint_tensor("load_state_dict", "b", "m.safetensors", zeros({4}), ones({4}));
}

TEST_CASE("safetensors: random corruptions of a valid file raise errors, never crash", "[safetensors]") {
  const Bytes valid = serialize_safetensors({{"w", randn({3, 4})},
                                             {"b", ones({4}, DType::bf16)},
                                             {"ids", arange(5)},
                                             {"m", ones({2}, DType::boolean)}},
                                            {{"k", "v"}});
  Generator g(11);
  int ok = 0, errors = 0;
  for (int it = 0; it < 3000; ++it) {
    Bytes b = valid;
    const int mode = static_cast<int>(g.next_u64() % 3);
    if (mode == 0) {  // flip 1-3 bytes
      const int flips = 1 + static_cast<int>(g.next_u64() % 3);
      for (int f = 0; f < flips; ++f) b[g.next_u64() % b.size()] ^= static_cast<uint8_t>(1 + g.next_u64() % 255);
    } else if (mode == 1) {  // truncate
      b.resize(g.next_u64() % b.size());
    } else {  // set a header byte to a JSON-significant character
      const char specials[] = "{}[]\":,-0123456789 e.";
      b[8 + g.next_u64() % (b.size() - 8 - 60)] = static_cast<uint8_t>(specials[g.next_u64() % (sizeof(specials) - 1)]);
    }
    try {
      auto c = parse_safetensors(b);
      ++ok;
    } catch (const tpu::Error&) {
      ++errors;
    }
  }
  INFO("parsed " << ok << ", errors " << errors);
  CHECK(errors > 1000);
}
