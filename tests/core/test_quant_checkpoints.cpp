// Quantized checkpoints in the layouts published on the Hub (fine-grained fp8 with block scales,
// compressed-tensors fp8 per channel / tensor / block, GPTQ v1 / v2 with and without act-order,
// AWQ gemm), packed here by hand from random codes, zero points and scales following each
// format's published layout. fp8 weights must load as their bytes and scales (per row or per
// block), the others as floats. Each loaded weight must equal the test's own dequantization
// (code - zero) x scale or fp8 value x scale, the logits those of the float model holding the
// dequantized weights, and every unsupported variant a tpu::Error naming it.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "llm_reference.h"
#include "testing.h"
#include "tpucore/autograd.h"
#include "tpucore/models/causal_lm.h"
#include "tpucore/safetensors.h"

namespace tpu::testing {
namespace {

namespace fs = std::filesystem;
using qck_json = nlohmann::json;

// e4m3fn from its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
// subnormal (m x 2^-9).
float qck_e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float v = e == 0 ? static_cast<float>(m) * std::ldexp(1.0f, -9) : (1.0f + static_cast<float>(m) / 8.0f) * std::ldexp(1.0f, e - 7);
  return (b & 0x80) ? -v : v;
}

struct QckLayer {
  std::string name;  // "model.layers.0.self_attn.q_proj"
  int64_t n, k;      // weight [n, k]
};

const char* const kQckCfg = R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": false})";

std::vector<QckLayer> qck_layers() {
  const std::string p = "model.layers.0.";
  return {{p + "self_attn.q_proj", 64, 64}, {p + "self_attn.k_proj", 32, 64}, {p + "self_attn.v_proj", 32, 64},
          {p + "self_attn.o_proj", 64, 64}, {p + "mlp.gate_proj", 128, 64},   {p + "mlp.up_proj", 128, 64},
          {p + "mlp.down_proj", 64, 128}};
}

// One format's tensors for a weight, and the weight they stand for.
struct QckPacked {
  TensorList parts;      // (suffix, tensor)
  std::vector<float> w;  // dequantized [n, k]
  std::vector<uint8_t> fp8;  // the fp8 bytes (fp8 formats)
  std::vector<float> row_scale;  // per-row scales (per-channel fp8)
};

Tensor qck_bytes_as_fp8(const std::vector<uint8_t>& b, int64_t n, int64_t k) {
  std::vector<f8e4m3> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = f8e4m3::from_bits(b[i]);
  return from_vector(v, Shape{n, k});
}

// fp8 codes (never NaN) and scales: `layout` "block" (scales [ceil(n/br), ceil(k/bc)]), "channel" or "tensor".
QckPacked qck_pack_fp8(std::mt19937& rng, int64_t n, int64_t k, const std::string& layout, int64_t br, int64_t bc,
                       const char* scale_name, DType scale_dtype) {
  QckPacked p;
  std::uniform_int_distribution<int> byte(0, 255), sk(64, 255);
  p.fp8.resize(static_cast<size_t>(n * k));
  for (auto& b : p.fp8) {
    do b = static_cast<uint8_t>(byte(rng));
    while ((b & 0x7f) == 0x7f);
  }
  const int64_t nr = layout == "block" ? (n + br - 1) / br : layout == "channel" ? n : 1;
  const int64_t nc = layout == "block" ? (k + bc - 1) / bc : 1;
  std::vector<float> s(static_cast<size_t>(nr * nc));
  for (auto& x : s) x = static_cast<float>(sk(rng)) * std::ldexp(1.0f, -14);  // 8 significant bits: exact in bf16
  p.w.resize(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const float sc = layout == "block" ? s[(i / br) * nc + j / bc] : layout == "channel" ? s[i] : s[0];
      p.w[i * k + j] = qck_e4m3(p.fp8[i * k + j]) * sc;
    }
  if (layout != "block")
    for (int64_t i = 0; i < n; ++i) p.row_scale.push_back(layout == "channel" ? s[i] : s[0]);
  p.parts.emplace_back("weight", qck_bytes_as_fp8(p.fp8, n, k));
  const Shape ss = layout == "block" ? Shape{nr, nc} : layout == "channel" ? Shape{n, 1} : Shape{1};
  p.parts.emplace_back(scale_name, from_vector(s, ss).to(scale_dtype));
  return p;
}

// int4 codes and zero points per group: GPTQ (qweight [k/8, n], 8 input rows per int32; qzeros
// [groups, n/8]; v1 stores zero - 1) or AWQ gemm (qweight [k, n/8] and qzeros with nibble i
// holding column 8c + {0,2,4,6,1,3,5,7}[i]); scales f16 [groups, n]; g_idx (act-order: a shuffled
// group per input row) for GPTQ.
QckPacked qck_pack_int4(std::mt19937& rng, int64_t n, int64_t k, int64_t group, bool awq, bool v1, bool act_order,
                        bool write_g_idx) {
  const int64_t groups = k / group;
  std::uniform_int_distribution<int> code(0, 15), zero(1, 15), sk(16, 1023);
  std::vector<int> c(static_cast<size_t>(k * n)), z(static_cast<size_t>(groups * n));
  std::vector<float> s(static_cast<size_t>(groups * n));
  for (auto& x : c) x = code(rng);
  for (auto& x : z) x = zero(rng);
  for (auto& x : s) x = static_cast<float>(sk(rng)) * std::ldexp(1.0f, -12);  // 10 significant bits: exact in f16
  std::vector<int32_t> gi(static_cast<size_t>(k));
  for (int64_t r = 0; r < k; ++r) gi[r] = static_cast<int32_t>(r / group);
  if (act_order) std::shuffle(gi.begin(), gi.end(), rng);
  QckPacked p;
  p.w.resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < k; ++r)
    for (int64_t col = 0; col < n; ++col)
      p.w[col * k + r] = static_cast<float>(c[r * n + col] - z[gi[r] * n + col]) * s[gi[r] * n + col];
  static const int kOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  const auto pack = [](const int* v, int stride, const int* order, int offset) {
    uint32_t w = 0;
    for (int i = 0; i < 8; ++i) w |= static_cast<uint32_t>((v[(order ? order[i] : i) * stride] - offset) & 15) << (4 * i);
    return static_cast<int32_t>(w);
  };
  std::vector<int32_t> qw, qz;
  if (awq) {
    for (int64_t r = 0; r < k; ++r)
      for (int64_t col = 0; col < n / 8; ++col) qw.push_back(pack(&c[r * n + col * 8], 1, kOrder, 0));
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t col = 0; col < n / 8; ++col) qz.push_back(pack(&z[g * n + col * 8], 1, kOrder, 0));
    p.parts.emplace_back("qweight", from_vector(qw, Shape{k, n / 8}));
  } else {
    for (int64_t r = 0; r < k / 8; ++r)
      for (int64_t col = 0; col < n; ++col) qw.push_back(pack(&c[r * 8 * n + col], static_cast<int>(n), nullptr, 0));
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t col = 0; col < n / 8; ++col) qz.push_back(pack(&z[g * n + col * 8], 1, nullptr, v1 ? 1 : 0));
    p.parts.emplace_back("qweight", from_vector(qw, Shape{k / 8, n}));
    if (write_g_idx) p.parts.emplace_back("g_idx", from_vector(gi, Shape{k}));
  }
  p.parts.emplace_back("qzeros", from_vector(qz, Shape{groups, n / 8}));
  p.parts.emplace_back("scales", from_vector(s, Shape{groups, n}).to(DType::f16));
  return p;
}

struct QckCase {
  fs::path dir;                           // the quantized checkpoint
  std::shared_ptr<models::CausalLM> ref;  // the float model with the dequantized weights
  std::map<std::string, QckPacked> packed;
};

// A tiny float Llama saved, then its projections replaced by packed weights under
// `quantization_config`.
QckCase qck_make(const std::string& tag, const qck_json& qc,
                 const std::function<QckPacked(std::mt19937&, const QckLayer&)>& pack) {
  QckCase c;
  const fs::path fdir = llm::temp_dir("qck_f_" + tag);
  c.dir = llm::temp_dir("qck_q_" + tag);
  {
    Generator g(7);
    models::CausalLM m(models::ModelConfig::from_json(kQckCfg), &g);
    models::save_causal_lm(m, fdir.string());
  }
  c.ref = models::load_causal_lm(fdir.string());
  std::map<std::string, Tensor> tensors = load_safetensors((fdir / "model.safetensors").string());
  std::mt19937 rng(99);
  std::map<std::string, Tensor*> slots;
  for (auto& [name, slot] : c.ref->parameter_slots()) slots[name] = slot;
  for (const QckLayer& l : qck_layers()) {
    QckPacked p = pack(rng, l);
    tensors.erase(l.name + ".weight");
    for (auto& [suffix, t] : p.parts) tensors[l.name + "." + suffix] = t;
    NoGradGuard ng;
    slots.at(l.name + ".weight")->copy_(from_vector(p.w, Shape{l.n, l.k}));
    c.packed[l.name] = std::move(p);
  }
  save_safetensors((c.dir / "model.safetensors").string(), tensors);
  qck_json cfg = qck_json::parse(kQckCfg);
  cfg["quantization_config"] = qc;
  std::ofstream(c.dir / "config.json") << cfg.dump();
  return c;
}

void qck_write_config(const fs::path& dir, const qck_json& qc) {
  qck_json cfg = qck_json::parse(kQckCfg);
  cfg["quantization_config"] = qc;
  std::ofstream(dir / "config.json") << cfg.dump();
}

// How a checkpoint's linear weights must come out of the loader.
enum class QckKept {
  float_weight,  // dequantized to a float parameter
  fp8_rows,      // fp8 bytes and one scale per row
  fp8_blocks,    // fp8 bytes and one scale per block of br x bc
};

// (a) every weight equals the test's dequantization; (b) the logits equal the float model's
// (holding the dequantized weights) to 1e-5 of their largest magnitude for 6 tokens (the fp8
// few-row kernels) and 5e-5 for 40 (the block-scaled many-row path; f32 sums in another order
// than the float model's GEMM, over more positions).
void qck_check(const QckCase& c, QckKept kept, int64_t br = 0, int64_t bc = 0) {
  auto m = models::load_causal_lm(c.dir.string());
  std::map<std::string, Tensor> params, buffers;
  for (auto& [name, t] : m->named_parameters()) params[name] = t;
  for (auto& [name, t] : m->named_buffers()) buffers[name] = t;
  for (const QckLayer& l : qck_layers()) {
    const QckPacked& p = c.packed.at(l.name);
    INFO(l.name);
    if (kept == QckKept::fp8_blocks) {  // fp8 bytes (one byte per weight) and the block scales as stored
      REQUIRE(buffers.count(l.name + ".weight_scale"));
      CHECK(!params.count(l.name + ".weight"));
      const Tensor& wq = buffers.at(l.name + ".weight");
      CHECK(wq.nbytes() == static_cast<size_t>(l.n * l.k));
      const std::vector<uint8_t> bytes = wq.to_vector<uint8_t>();
      const Tensor& st = buffers.at(l.name + ".weight_scale");
      const int64_t nc = (l.k + bc - 1) / bc;
      CHECK(st.shape() == Shape{(l.n + br - 1) / br, nc});
      const std::vector<float> scale = st.to_vector<float>();
      CHECK(bytes == p.fp8);
      std::vector<float> w(bytes.size());
      for (int64_t i = 0; i < l.n; ++i)
        for (int64_t j = 0; j < l.k; ++j) w[i * l.k + j] = qck_e4m3(bytes[i * l.k + j]) * scale[(i / br) * nc + j / bc];
      CHECK(w == p.w);
    } else if (kept == QckKept::fp8_rows) {  // fp8 bytes and per-row scales kept as they are stored
      REQUIRE(buffers.count(l.name + ".weight_scale"));
      const std::vector<uint8_t> bytes = buffers.at(l.name + ".weight").to_vector<uint8_t>();
      const std::vector<float> scale = buffers.at(l.name + ".weight_scale").to_vector<float>();
      CHECK(bytes == p.fp8);
      CHECK(scale == p.row_scale);
      std::vector<float> w(bytes.size());
      for (int64_t i = 0; i < l.n; ++i)
        for (int64_t j = 0; j < l.k; ++j) w[i * l.k + j] = qck_e4m3(bytes[i * l.k + j]) * scale[i];
      CHECK(w == p.w);
    } else {
      REQUIRE(params.count(l.name + ".weight"));
      CHECK(params.at(l.name + ".weight").to_vector<float>() == p.w);
    }
  }
  for (const int64_t len : {6, 40}) {
    std::vector<int64_t> tok(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) tok[static_cast<size_t>(i)] = (i * 37 + 3) % 64;
    const Tensor ids = from_vector(tok, Shape{1, len});
    const std::vector<float> want = c.ref->forward(ids).to_vector<float>(), got = m->forward(ids).to_vector<float>();
    REQUIRE(want.size() == got.size());
    double err = 0, mag = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, static_cast<double>(std::abs(want[i] - got[i])));
      mag = std::max(mag, static_cast<double>(std::abs(want[i])));
    }
    INFO("tokens " << len);
    CHECK(mag > 0.01);
    CHECK(err <= (len == 6 ? 1e-5 : 5e-5) * std::max(1.0, mag));
  }
}

TEST_CASE("quantized checkpoints: fine-grained fp8 with block scales", "[quant][qckpt]") {
  const qck_json qc = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"fmt", "e4m3"},
                       {"weight_block_size", {32, 48}}, {"modules_to_not_convert", {"lm_head"}}};
  QckCase c = qck_make("fp8", qc, [](std::mt19937& r, const QckLayer& l) {
    return qck_pack_fp8(r, l.n, l.k, "block", 32, 48, "weight_scale_inv", DType::f32);
  });
  qck_check(c, QckKept::fp8_blocks, 32, 48);
  // A module listed as not converted but stored quantized.
  qck_json bad = qc;
  bad["modules_to_not_convert"] = {"lm_head", "down_proj"};
  qck_write_config(c.dir, bad);
  CHECK_THROWS_WITH(models::load_causal_lm(c.dir.string()), Catch::Contains("not converted"));
  for (auto [key, value, what] : {std::tuple<const char*, qck_json, const char*>{"activation_scheme", "static", "static"},
                                  {"fmt", "e5m2", "e5m2"}, {"weight_block_size", nullptr, "weight_block_size"},
                                  {"weight_block_size", {128}, "weight_block_size"}, {"quant_method", "bitsandbytes",
                                  "bitsandbytes"}, {"load_in_4bit", true, "load_in_4bit"}}) {
    bad = qc;
    bad[key] = value;
    qck_write_config(c.dir, bad);
    CHECK_THROWS_WITH(models::load_causal_lm(c.dir.string()), Catch::Contains(what));
  }
}

qck_json qck_ct_config(const std::string& strategy, const qck_json& act) {
  qck_json w = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"dynamic", false}, {"strategy", strategy},
                {"group_size", nullptr}, {"observer", "minmax"}};
  if (strategy == "block") w["block_structure"] = {32, 32};
  return {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}, {"quantization_status", "compressed"},
          {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", w}, {"input_activations", act},
                                          {"output_activations", nullptr}}}}},
          {"ignore", {"lm_head"}}, {"kv_cache_scheme", nullptr}};
}

TEST_CASE("quantized checkpoints: compressed-tensors fp8 per channel, per tensor and per block", "[quant][qckpt]") {
  const qck_json dyn = {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}, {"symmetric", true}};
  for (const char* strategy : {"channel", "tensor", "block"}) {
    INFO(strategy);
    const std::string s = strategy;
    QckCase c = qck_make(std::string("ct_") + strategy, qck_ct_config(s, dyn), [&](std::mt19937& r, const QckLayer& l) {
      return qck_pack_fp8(r, l.n, l.k, s, 32, 32, "weight_scale", DType::bf16);
    });
    qck_check(c, s == "block" ? QckKept::fp8_blocks : QckKept::fp8_rows, 32, 32);
    if (s != "channel") continue;
    qck_json static_act = dyn;
    static_act["dynamic"] = false;
    qck_write_config(c.dir, qck_ct_config(s, static_act));
    CHECK_THROWS_WITH(models::load_causal_lm(c.dir.string()), Catch::Contains("static input_activations"));
    qck_json bad = qck_ct_config("group", dyn);
    qck_write_config(c.dir, bad);
    CHECK_THROWS_WITH(models::load_causal_lm(c.dir.string()), Catch::Contains("strategy 'group'"));
    bad = qck_ct_config(s, dyn);
    bad["format"] = "pack-quantized";
    qck_write_config(c.dir, bad);
    CHECK_THROWS_WITH(models::load_causal_lm(c.dir.string()), Catch::Contains("pack-quantized"));
    bad = qck_ct_config(s, dyn);
    bad["kv_cache_scheme"] = {{"num_bits", 8}};
    qck_write_config(c.dir, bad);
    CHECK_THROWS_WITH(models::load_causal_lm(c.dir.string()), Catch::Contains("kv_cache_scheme"));
    bad = qck_ct_config(s, dyn);
    bad["ignore"] = {"lm_head", "re:.*q_proj"};
    qck_write_config(c.dir, bad);
    CHECK_THROWS_WITH(models::load_causal_lm(c.dir.string()), Catch::Contains("q_proj' is stored quantized"));
  }
}

TEST_CASE("quantized checkpoints: fine-grained fp8 block scales of the wrong shape name the tensor and both shapes",
          "[quant][qckpt]") {
  const qck_json qc = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {32, 48}}};
  // down_proj [64, 128] needs [2, 3] scales; its scales are stored transposed (as many values).
  QckCase c = qck_make("fp8_bad_scale", qc, [](std::mt19937& r, const QckLayer& l) {
    QckPacked p = qck_pack_fp8(r, l.n, l.k, "block", 32, 48, "weight_scale_inv", DType::f32);
    if (l.name.ends_with("down_proj")) p.parts[1].second = p.parts[1].second.reshape(Shape{3, 2});
    return p;
  });
  CHECK_THROWS_WITH(models::load_causal_lm(c.dir.string()),
                    Catch::Contains("down_proj.weight_scale_inv' has shape [3, 2]") && Catch::Contains("[2, 3]"));
}

TEST_CASE("quantized checkpoints: fp8 input_scale (static activations) is refused", "[quant][qckpt]") {
  const qck_json qc = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {32, 32}}};
  QckCase c = qck_make("fp8_static", qc, [](std::mt19937& r, const QckLayer& l) {
    QckPacked p = qck_pack_fp8(r, l.n, l.k, "block", 32, 32, "weight_scale_inv", DType::f32);
    p.parts.emplace_back("input_scale", from_vector(std::vector<float>{0.5f}, Shape{1}));
    return p;
  });
  CHECK_THROWS_WITH(models::load_causal_lm(c.dir.string()), Catch::Contains("input_scale"));
}

TEST_CASE("quantized checkpoints: GPTQ v1 and v2, with and without act-order, and AWQ", "[quant][qckpt]") {
  struct V {
    const char* tag;
    bool awq, v1, act_order;
  };
  for (const V v : {V{"gptq", false, true, false}, V{"gptq_v2_act", false, false, true}, V{"gptq_act", false, true, true},
                    V{"awq", true, false, false}}) {
    INFO(v.tag);
    qck_json qc;
    if (v.awq)
      qc = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}, {"zero_point", true}, {"version", "gemm"},
            {"modules_to_not_convert", nullptr}};
    else
      qc = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 32}, {"desc_act", v.act_order}, {"sym", false},
            {"damp_percent", 0.01}, {"true_sequential", true}, {"checkpoint_format", v.v1 ? "gptq" : "gptq_v2"}};
    QckCase c = qck_make(v.tag, qc, [&](std::mt19937& r, const QckLayer& l) {
      return qck_pack_int4(r, l.n, l.k, 32, v.awq, v.v1, v.act_order, !v.awq);
    });
    qck_check(c, QckKept::float_weight);
    if (v.awq) {
      for (auto [key, value, what] : {std::tuple<const char*, qck_json, const char*>{"version", "gemv", "gemv"},
                                      {"zero_point", false, "zero_point"}, {"bits", 3, "bits 3"}}) {
        qck_json bad = qc;
        bad[key] = value;
        qck_write_config(c.dir, bad);
        CHECK_THROWS_WITH(models::load_causal_lm(c.dir.string()), Catch::Contains(what));
      }
    } else if (v.v1 && !v.act_order) {
      for (auto [key, value, what] : {std::tuple<const char*, qck_json, const char*>{"bits", 8, "bits 8"},
                                      {"checkpoint_format", "marlin", "marlin"}, {"group_size", 0, "group_size 0"}}) {
        qck_json bad = qc;
        bad[key] = value;
        qck_write_config(c.dir, bad);
        CHECK_THROWS_WITH(models::load_causal_lm(c.dir.string()), Catch::Contains(what));
      }
    }
  }
  // act-order without the g_idx that gives each input row its group.
  const qck_json qc = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 32}, {"desc_act", true}, {"sym", true}};
  QckCase c = qck_make("gptq_no_gidx", qc, [](std::mt19937& r, const QckLayer& l) {
    return qck_pack_int4(r, l.n, l.k, 32, false, true, false, false);
  });
  CHECK_THROWS_WITH(models::load_causal_lm(c.dir.string()), Catch::Contains("g_idx"));
}

}  // namespace
}  // namespace tpu::testing
