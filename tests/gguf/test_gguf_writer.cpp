// The GGUF writer (tools/tpu-gguf) against a parser of the test's own, written from the GGUF
// specification: header, typed key-value metadata, tensor infos (dimensions innermost first),
// the alignment of the data section and of every tensor, and the F32 / F16 / BF16 / Q8_0 / Q4_0
// payloads decoded here (IEEE half and bfloat16 by hand, the block formats by their definition).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gguf_writer.h"
#include "tpucore/models.h"
#include "tpucore/tpucore.h"

namespace {

// A value of the metadata: integers widened to int64, floats to double, strings, arrays.
struct GgufTestValue {
  uint32_t type = 0;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<GgufTestValue> items;
};

struct GgufTestTensor {
  std::vector<uint64_t> dims;  // innermost first
  uint32_t type = 0;
  uint64_t offset = 0;
};

struct GgufTestFile {
  uint32_t version = 0;
  std::map<std::string, GgufTestValue> kv;
  std::map<std::string, GgufTestTensor> tensors;
  std::vector<std::string> order;
  std::vector<uint8_t> bytes;
  size_t data_start = 0;
};

class GgufTestReader {
 public:
  explicit GgufTestReader(const std::vector<uint8_t>& b) : b_(b) {}
  template <typename T>
  T get() {
    REQUIRE(pos_ + sizeof(T) <= b_.size());
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str() {
    const auto n = get<uint64_t>();
    REQUIRE(pos_ + n <= b_.size());
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  GgufTestValue value(uint32_t type) {
    GgufTestValue v;
    v.type = type;
    switch (type) {
      case 0: v.i = get<uint8_t>(); break;
      case 1: v.i = get<int8_t>(); break;
      case 2: v.i = get<uint16_t>(); break;
      case 3: v.i = get<int16_t>(); break;
      case 4: v.i = get<uint32_t>(); break;
      case 5: v.i = get<int32_t>(); break;
      case 6: v.f = get<float>(); break;
      case 7: v.i = get<uint8_t>(); break;
      case 8: v.s = str(); break;
      case 9: {
        const auto t = get<uint32_t>();
        const auto n = get<uint64_t>();
        for (uint64_t k = 0; k < n; ++k) v.items.push_back(value(t));
        break;
      }
      case 10: v.i = static_cast<int64_t>(get<uint64_t>()); break;
      case 11: v.i = get<int64_t>(); break;
      case 12: v.f = get<double>(); break;
      default: FAIL("unknown GGUF value type " << type);
    }
    return v;
  }
  size_t pos() const { return pos_; }

 private:
  const std::vector<uint8_t>& b_;
  size_t pos_ = 0;
};

GgufTestFile read_gguf_for_test(const std::string& path) {
  GgufTestFile f;
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  f.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  GgufTestReader r(f.bytes);
  REQUIRE(r.get<uint8_t>() == 'G');
  REQUIRE(r.get<uint8_t>() == 'G');
  REQUIRE(r.get<uint8_t>() == 'U');
  REQUIRE(r.get<uint8_t>() == 'F');
  f.version = r.get<uint32_t>();
  const auto n_tensors = r.get<uint64_t>(), n_kv = r.get<uint64_t>();
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = r.str();
    const auto t = r.get<uint32_t>();
    f.kv[key] = r.value(t);
  }
  for (uint64_t k = 0; k < n_tensors; ++k) {
    std::string name = r.str();
    GgufTestTensor t;
    const auto nd = r.get<uint32_t>();
    for (uint32_t d = 0; d < nd; ++d) t.dims.push_back(r.get<uint64_t>());
    t.type = r.get<uint32_t>();
    t.offset = r.get<uint64_t>();
    f.order.push_back(name);
    f.tensors[name] = t;
  }
  const uint64_t align = f.kv.count("general.alignment") ? static_cast<uint64_t>(f.kv["general.alignment"].i) : 32;
  f.data_start = (r.pos() + align - 1) / align * align;
  return f;
}

float half_to_float_for_test(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  REQUIRE(e != 31);
  return static_cast<float>(s ? -v : v);
}

// The n values of tensor `name` decoded from the file.
std::vector<float> gguf_test_values(const GgufTestFile& f, const std::string& name) {
  const GgufTestTensor& t = f.tensors.at(name);
  uint64_t n = 1;
  for (auto d : t.dims) n *= d;
  const uint8_t* p = f.bytes.data() + f.data_start + t.offset;
  std::vector<float> v(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (t.type == 0) {
      std::memcpy(&v[i], p + 4 * i, 4);
    } else if (t.type == 1 || t.type == 30) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      if (t.type == 1) {
        v[i] = half_to_float_for_test(h);
      } else {
        const uint32_t u = static_cast<uint32_t>(h) << 16;
        std::memcpy(&v[i], &u, 4);
      }
    } else if (t.type == 8) {  // Q8_0: f16 scale, 32 x int8
      const uint8_t* blk = p + (i / 32) * 34;
      uint16_t d;
      std::memcpy(&d, blk, 2);
      v[i] = half_to_float_for_test(d) * static_cast<float>(static_cast<int8_t>(blk[2 + i % 32]));
    } else if (t.type == 2) {  // Q4_0: f16 scale, 16 bytes: low nibbles values 0-15, high 16-31
      const uint8_t* blk = p + (i / 32) * 18;
      uint16_t d;
      std::memcpy(&d, blk, 2);
      const int j = static_cast<int>(i % 32);
      const int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
      v[i] = half_to_float_for_test(d) * static_cast<float>(q - 8);
    } else {
      FAIL("unexpected tensor type " << t.type);
    }
  }
  return v;
}

std::string gguf_test_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tpu_gguf_test_" + name + ".gguf")).string();
}

}  // namespace

TEST_CASE("header, metadata, tensor infos, alignment and payloads") {
  using tpu::gguf::TensorType;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(3 * 64);
  for (auto& x : w) x = nd(rng);
  w[5] = 0.0f;
  for (int i = 64; i < 96; ++i) w[static_cast<size_t>(i)] = 0.0f;  // an all-zero block
  const uint32_t align = GENERATE(32u, 64u);
  tpu::gguf::Writer wr(align);
  wr.add_string("general.architecture", "test");
  wr.add_u32("a.u32", 123456);
  wr.add_i32("a.i32", -7);
  wr.add_f32("a.f32", 0.25f);
  wr.add_bool("a.bool", true);
  wr.add_strings("a.strings", {"x", "", "\xe2\x96\x81y"});
  wr.add_f32s("a.f32s", {1.5f, -2.0f});
  wr.add_i32s("a.i32s", {3, -4, 5});
  wr.add_tensor("odd", {1, 3}, TensorType::f32, w.data());  // 12 bytes: the next tensor is padded
  for (TensorType t : {TensorType::f32, TensorType::f16, TensorType::bf16, TensorType::q8_0, TensorType::q4_0})
    wr.add_tensor(std::string("w_") + tpu::gguf::type_name(t), {3, 64}, t, w.data());
  const std::string path = gguf_test_path("basic");
  wr.write(path);
  GgufTestFile f = read_gguf_for_test(path);
  std::filesystem::remove(path);

  CHECK(f.version == 3);
  CHECK(f.kv["general.architecture"].s == "test");
  CHECK(f.kv["a.u32"].type == 4);
  CHECK(f.kv["a.u32"].i == 123456);
  CHECK(f.kv["a.i32"].i == -7);
  CHECK(f.kv["a.f32"].f == 0.25);
  CHECK(f.kv["a.bool"].type == 7);
  CHECK(f.kv["a.bool"].i == 1);
  REQUIRE(f.kv["a.strings"].items.size() == 3);
  CHECK(f.kv["a.strings"].items[2].s == "\xe2\x96\x81y");
  CHECK(f.kv["a.f32s"].items[1].f == -2.0);
  CHECK(f.kv["a.i32s"].items[1].i == -4);
  CHECK(f.kv.count("general.alignment") == (align == 32 ? 0u : 1u));
  CHECK(f.data_start % align == 0);
  REQUIRE(f.order.size() == 6);
  CHECK(f.order[1] == "w_f32");
  for (const auto& [name, t] : f.tensors) CHECK(t.offset % align == 0);
  CHECK(f.tensors["odd"].dims == std::vector<uint64_t>{3, 1});
  CHECK(f.tensors["w_q8_0"].dims == std::vector<uint64_t>{64, 3});
  CHECK(f.tensors["w_q8_0"].type == 8);
  CHECK(f.tensors["w_q4_0"].type == 2);
  CHECK(f.tensors["w_bf16"].type == 30);
  CHECK(f.bytes.size() == f.data_start + f.tensors["w_q4_0"].offset + 6 * 18);

  const auto v32 = gguf_test_values(f, "w_f32"), v16 = gguf_test_values(f, "w_f16"),
             vb = gguf_test_values(f, "w_bf16"), q8 = gguf_test_values(f, "w_q8_0"), q4 = gguf_test_values(f, "w_q4_0");
  for (size_t b = 0; b < 6; ++b) {
    float amax = 0, m = 0;
    for (size_t j = 0; j < 32; ++j)
      if (std::fabs(w[b * 32 + j]) > amax) amax = std::fabs(w[b * 32 + j]), m = w[b * 32 + j];
    const double d8 = amax / 127.0, d4 = std::fabs(m) / 8.0;
    for (size_t j = 0; j < 32; ++j) {
      const size_t i = b * 32 + j;
      const double x = w[i];
      CHECK(v32[i] == w[i]);
      CHECK(std::fabs(v16[i] - x) <= std::fabs(x) * std::ldexp(1.0, -11) + 1e-7);
      CHECK(std::fabs(vb[i] - x) <= std::fabs(x) * std::ldexp(1.0, -8));
      // Q8_0: the code is round(x / d); the f16 scale adds a relative error of at most 2^-11.
      const double expect8 = d8 > 0 ? std::round(x / d8) * d8 : 0.0;
      CHECK(std::fabs(q8[i] - expect8) <= 127 * d8 * std::ldexp(1.0, -11) + 1e-7);
      CHECK(std::fabs(q8[i] - x) <= 0.5 * d8 + 127 * d8 * std::ldexp(1.0, -11) + 1e-7);
      // Q4_0: the nearest of the 16 levels (q - 8) * d, d = m / -8 (m: the value of largest
      // magnitude, which maps to code 0 exactly; -m lies past the last level, 7 d).
      double nearest = std::fabs(x);
      for (int q = 0; q < 16; ++q) nearest = std::min(nearest, std::fabs((q - 8) * (m / -8.0) - x));
      CHECK(std::fabs(q4[i] - x) <= nearest + 8 * d4 * std::ldexp(1.0, -11) + 1e-6);
      if (x == m && amax > 0) CHECK(std::fabs(q4[i] - x) <= std::fabs(x) * std::ldexp(1.0, -11));
    }
  }
  for (size_t i = 64; i < 96; ++i) CHECK((q8[i] == 0.0f && q4[i] == 0.0f));
}

TEST_CASE("errors name the problem") {
  using tpu::gguf::TensorType;
  std::vector<float> w(40, 1.0f);
  tpu::gguf::Writer wr;
  CHECK_THROWS_WITH(wr.add_tensor("w", {1, 40}, TensorType::q8_0, w.data()), Catch::Contains("multiple of 32"));
  CHECK_THROWS_WITH(tpu::gguf::parse_type("q5_k"), Catch::Contains("q5_k"));
  CHECK_THROWS_WITH(tpu::gguf::Writer(12), Catch::Contains("alignment"));
  wr.add_tensor("w", {1, 40}, TensorType::f32, w.data());
  CHECK_THROWS_WITH(wr.add_tensor("w", {40}, TensorType::f32, w.data()), Catch::Contains("twice"));
}

TEST_CASE("a Llama model as llama.cpp's llama architecture") {
  using tpu::gguf::TensorType;
  tpu::models::ModelConfig c;
  c.vocab_size = 300, c.hidden_size = 64, c.intermediate_size = 96, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.tie_word_embeddings = false;
  tpu::Generator gen(3);
  tpu::models::CausalLM m(c, &gen);
  const std::string path = gguf_test_path("llama");
  tpu::gguf::write_llama_gguf(m, path, {.type = TensorType::bf16, .embed_type = TensorType::f32, .name = "tiny"});
  GgufTestFile f = read_gguf_for_test(path);
  std::filesystem::remove(path);
  CHECK(f.kv["general.architecture"].s == "llama");
  CHECK(f.kv["llama.block_count"].i == 2);
  CHECK(f.kv["llama.embedding_length"].i == 64);
  CHECK(f.kv["llama.feed_forward_length"].i == 96);
  CHECK(f.kv["llama.attention.head_count"].i == 4);
  CHECK(f.kv["llama.attention.head_count_kv"].i == 2);
  CHECK(f.kv["llama.rope.dimension_count"].i == 16);
  CHECK(std::fabs(f.kv["llama.attention.layer_norm_rms_epsilon"].f - 1e-6) < 1e-12);
  CHECK(f.kv["tokenizer.ggml.model"].s == "llama");
  REQUIRE(f.kv["tokenizer.ggml.tokens"].items.size() == 300);
  CHECK(f.kv["tokenizer.ggml.tokens"].items[3 + 10].s == "<0x0A>");
  CHECK(f.kv["tokenizer.ggml.token_type"].items.size() == 300);
  CHECK(f.kv["tokenizer.ggml.scores"].items.size() == 300);
  CHECK(f.tensors.size() == 3 + 2 * 9);
  CHECK(f.tensors["token_embd.weight"].type == 0);
  CHECK(f.tensors["token_embd.weight"].dims == std::vector<uint64_t>{64, 300});
  CHECK(f.tensors["output.weight"].type == 30);
  CHECK(f.tensors["blk.0.attn_q.weight"].type == 30);
  CHECK(f.tensors["blk.1.ffn_down.weight"].dims == std::vector<uint64_t>{96, 64});
  CHECK(f.tensors["blk.0.attn_norm.weight"].type == 0);

  auto params = m.named_parameters();
  auto param = [&](const std::string& n) {
    for (auto& [k, t] : params)
      if (k == n) return t.contiguous();
    FAIL("no parameter " << n);
    return tpu::Tensor();
  };
  const tpu::Tensor emb = param("model.embed_tokens.weight");
  const auto e = gguf_test_values(f, "token_embd.weight");
  for (int64_t i = 0; i < emb.numel(); ++i) REQUIRE(e[static_cast<size_t>(i)] == emb.data<float>()[i]);
  // The key projection (2 heads of 16 rows): GGUF row h * 16 + 2 i + part is the checkpoint's
  // row h * 16 + part * 8 + i (llama.cpp rotates adjacent pairs, the Hub layout the two halves).
  const tpu::Tensor wk = param("model.layers.1.self_attn.k_proj.weight");
  const auto k = gguf_test_values(f, "blk.1.attn_k.weight");
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t part = 0; part < 2; ++part)
        for (int64_t col = 0; col < 64; ++col) {
          const float src = wk.data<float>()[(h * 16 + part * 8 + i) * 64 + col];
          const float got = k[static_cast<size_t>((h * 16 + 2 * i + part) * 64 + col)];
          REQUIRE(std::fabs(got - src) <= std::fabs(src) * 0.004f);
        }
  tpu::models::ModelConfig g = c;
  g.mlp_bias = true;
  tpu::models::CausalLM mb(g, &gen);
  CHECK_THROWS_WITH(tpu::gguf::write_llama_gguf(mb, path), Catch::Contains("Llama-layout"));
}
