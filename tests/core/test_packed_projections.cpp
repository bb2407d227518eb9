// Packed projections (nn::pack_projections, nn::packed_forward): quantized q / k / v (or gate / up)
// linears whose weights share one buffer, run as one product. Each output against a naive
// double loop over the weights dequantized here from their documented layouts, and equal to
// what the same linears gave before they were packed (one product each); the cases in which
// the packed product must not be taken (hooks, replaced weights, autograd, mixed formats); and a
// quantized model, whose packs leave its checkpoint and greedy tokens as they were.
#include <cmath>

#include "quant_act_ref.h"
#include "testing.h"
#include "tpucore/autograd.h"
#include "tpucore/core/float8.h"
#include "tpucore/models/causal_lm.h"
#include "tpucore/models/generate.h"
#include "tpucore/nn/quantized.h"
#include "tpucore/nn/transformer.h"

namespace tpu::testing {
namespace {

// The dequantized weight [N, K] of a QuantizedLinear, read from its bytes as tpucore/quantize.h
// documents them (int8: q x scale[j]; int4: blocks of 32 weights in 16 bytes, low nibbles the
// first 16, stored as q + 8, times the group's scale; fp8: the e4m3 value times scale[j]).
std::vector<double> pp_dequantized(const nn::QuantizedLinear& l) {
  const int64_t N = l.weight.size(0), K = l.in_features;
  const std::vector<float> s = l.weight_scale.to(DType::f32).contiguous().to_vector<float>();
  std::vector<double> w(static_cast<size_t>(N * K));
  if (l.kind == nn::WeightQuant::int4) {
    const std::vector<uint8_t> q = l.weight.contiguous().to_vector<uint8_t>();
    const int64_t groups = K / l.group;
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t b = q[static_cast<size_t>(j * (K / 2) + (k / 32) * 16 + (k % 32) % 16)];
        const int v = ((k % 32) < 16 ? (b & 0xF) : (b >> 4)) - 8;
        w[static_cast<size_t>(j * K + k)] = v * static_cast<double>(s[static_cast<size_t>(j * groups + k / l.group)]);
      }
  } else if (l.kind == nn::WeightQuant::int8) {
    const std::vector<int8_t> q = l.weight.contiguous().to_vector<int8_t>();
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k)
        w[static_cast<size_t>(j * K + k)] = q[static_cast<size_t>(j * K + k)] * static_cast<double>(s[static_cast<size_t>(j)]);
  } else {
    const std::vector<uint8_t> q = l.weight.contiguous().to_vector<uint8_t>();
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k)
        w[static_cast<size_t>(j * K + k)] = static_cast<double>(f8e4m3::from_bits(q[static_cast<size_t>(j * K + k)]).to_f32()) *
                                            s[static_cast<size_t>(j)];
  }
  return w;
}

struct PpParts {
  std::vector<std::shared_ptr<nn::QuantizedLinear>> owned;
  std::vector<nn::Linear*> parts;
};

// Three quantized linears of 40, 24 and 8 output features over 64 inputs (output counts that
// are not multiples of the kernels' 16-row panels), with biases or without.
PpParts pp_parts(nn::WeightQuant kind, bool bias, uint64_t seed) {
  Generator g(seed);
  PpParts p;
  for (const int64_t n : {40, 24, 8}) {
    nn::Linear f(64, n, bias, &g);
    p.owned.push_back(std::make_shared<nn::QuantizedLinear>(f, kind, 32));
    p.parts.push_back(p.owned.back().get());
  }
  return p;
}

Tensor pp_input(int64_t rows, uint64_t seed) {
  Generator g(seed);
  std::vector<float> v(static_cast<size_t>(rows * 64));
  for (float& x : v) x = static_cast<float>(2.0 * g.next_double() - 1.0);
  return from_vector(v, Shape{rows, 64});
}

}  // namespace

TEST_CASE("packed projections: one product equals each projection's, against a naive loop", "[packed_proj]") {
  NoGradGuard ng;
  for (const nn::WeightQuant kind : {nn::WeightQuant::int8, nn::WeightQuant::int4, nn::WeightQuant::fp8})
    for (const bool bias : {false, true}) {
      PpParts p = pp_parts(kind, bias, 7 + static_cast<uint64_t>(bias));
      for (const int64_t rows : {1, 3, 16, 40}) {
        INFO(nn::weight_quant_name(kind) << " bias " << bias << " rows " << rows);
        const Tensor x = pp_input(rows, 100 + static_cast<uint64_t>(rows));
        std::vector<std::vector<float>> before;
        for (nn::Linear* l : p.parts) before.push_back(l->forward(x).to_vector<float>());
        std::vector<std::vector<double>> w;
        for (nn::Linear* l : p.parts) w.push_back(pp_dequantized(static_cast<nn::QuantizedLinear&>(*l)));
        std::vector<std::vector<float>> b;
        for (nn::Linear* l : p.parts) b.push_back(bias ? l->bias.to_vector<float>() : std::vector<float>());

        const nn::PackedProjections pack = nn::pack_projections(p.parts);
        REQUIRE(pack.defined());
        REQUIRE(pack.rows == std::vector<int64_t>{40, 24, 8});
        // The parts now view the pack, with the values they had.
        for (size_t i = 0; i < p.parts.size(); ++i) {
          REQUIRE(p.parts[i]->weight.storage() == pack.weight.storage());
          REQUIRE(pp_dequantized(static_cast<nn::QuantizedLinear&>(*p.parts[i])) == w[i]);
        }
        const std::vector<Tensor> out = nn::packed_forward(pack, p.parts, x);
        REQUIRE(out.size() == 3);
        const std::vector<float> xs = kind == nn::WeightQuant::fp8    ? x.to_vector<float>()
                                      : kind == nn::WeightQuant::int4 ? int4_rows_as_seen(x.to_vector<float>(), rows, 64)
                                                                      : rows_as_seen(x.to_vector<float>(), rows, 64);
        for (size_t i = 0; i < 3; ++i) {
          const int64_t n = pack.rows[i];
          REQUIRE(out[i].shape() == Shape{rows, n});
          const std::vector<float> got = out[i].contiguous().to_vector<float>();
          CHECK(got == before[i]);  // the product of each linear alone, before packing
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < n; ++j) {
              double ref = bias ? b[i][static_cast<size_t>(j)] : 0.0, mag = std::fabs(ref);
              for (int64_t k = 0; k < 64; ++k) {
                const double t = static_cast<double>(xs[static_cast<size_t>(r * 64 + k)]) * w[i][static_cast<size_t>(j * 64 + k)];
                ref += t;
                mag += std::fabs(t);
              }
              REQUIRE(std::fabs(got[static_cast<size_t>(r * n + j)] - ref) <= 1e-5 * mag + 1e-6);
            }
          // A part's own forward (through its views) still gives its product.
          CHECK(p.parts[i]->forward(x).to_vector<float>() == before[i]);
        }
      }
    }
}

TEST_CASE("packed projections: the cases that take one product per projection", "[packed_proj]") {
  NoGradGuard ng;
  const Tensor x = pp_input(2, 5);
  {  // a forward hook on one part: each part through its own call, so the hook runs
    PpParts p = pp_parts(nn::WeightQuant::int4, false, 1);
    const nn::PackedProjections pack = nn::pack_projections(p.parts);
    REQUIRE(pack.defined());
    REQUIRE(nn::packed_forward(pack, p.parts, x).size() == 3);
    auto h = p.parts[1]->register_forward_hook([](nn::Module&, std::span<const Tensor>, Tensor&) {});
    CHECK(nn::packed_forward(pack, p.parts, x).empty());
  }
  {  // a weight replaced after packing (loaded, moved): it no longer views the pack
    PpParts p = pp_parts(nn::WeightQuant::int8, true, 2);
    const nn::PackedProjections pack = nn::pack_projections(p.parts);
    REQUIRE(pack.defined());
    p.parts[2]->weight = p.parts[2]->weight.clone();
    CHECK(nn::packed_forward(pack, p.parts, x).empty());
    PpParts p2 = pp_parts(nn::WeightQuant::int8, true, 3);
    const nn::PackedProjections pack2 = nn::pack_projections(p2.parts);
    p2.parts[0]->bias = p2.parts[0]->bias.clone();
    CHECK(nn::packed_forward(pack2, p2.parts, x).empty());
    // parts given in another order than packed
    PpParts p3 = pp_parts(nn::WeightQuant::int8, false, 4);
    const nn::PackedProjections pack3 = nn::pack_projections(p3.parts);
    CHECK(nn::packed_forward(pack3, {p3.parts[1], p3.parts[0], p3.parts[2]}, x).empty());
  }
  {  // an input recorded by autograd
    PpParts p = pp_parts(nn::WeightQuant::int4, false, 5);
    const nn::PackedProjections pack = nn::pack_projections(p.parts);
    GradModeGuard eg(true);
    Tensor xg = x.clone();
    xg.requires_grad_(true);
    CHECK(nn::packed_forward(pack, p.parts, xg).empty());
  }
  {  // sets that do not pack: mixed formats, a float linear, one part, bias on some only
    Generator g(9);
    nn::Linear a(64, 16, false, &g), b(64, 16, false, &g), c(64, 16, true, &g);
    nn::QuantizedLinear qa(a, nn::WeightQuant::int8), qb(b, nn::WeightQuant::int4), qc(c, nn::WeightQuant::int8);
    CHECK_FALSE(nn::pack_projections({&qa, &qb}).defined());
    CHECK_FALSE(nn::pack_projections({&qa, &b}).defined());
    CHECK_FALSE(nn::pack_projections({&qa}).defined());
    CHECK_FALSE(nn::pack_projections({&qa, &qc}).defined());
    nn::Linear d(32, 16, false, &g);
    nn::QuantizedLinear qd(d, nn::WeightQuant::int8);
    CHECK_FALSE(nn::pack_projections({&qa, &qd}).defined());  // another input width
  }
}

TEST_CASE("packed projections: a quantized model keeps its checkpoint and greedy tokens", "[packed_proj]") {
  const std::string cfg = R"({"model_type": "qwen2", "vocab_size": 80, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": false})";
  for (const nn::WeightQuant kind : {nn::WeightQuant::int8, nn::WeightQuant::int4}) {
    INFO(nn::weight_quant_name(kind));
    Generator g(77);
    models::CausalLM m(models::ModelConfig::from_json(cfg), &g);
    m.eval();
    models::quantize_causal_lm(m, kind, 32);
    for (auto& layer : m.model->layers) {
      REQUIRE(layer->self_attn->qkv_pack);  // Qwen2's q / k / v biases packed with them
      REQUIRE(layer->self_attn->qkv_pack->bias.defined());
      REQUIRE(layer->mlp->gate_up_pack);
    }
    // The state dict has the names, shapes and values of the unpacked projections.
    const auto named = m.named_buffers();
    for (const auto& [name, t] : named)
      if (name.find("self_attn.k_proj.weight_scale") != std::string::npos) REQUIRE(t.size(0) == 32);
    std::vector<std::vector<int64_t>> prompts{{3, 14, 15}, {9, 2}};
    models::GenerationConfig gc;
    gc.max_new_tokens = 12;
    const auto packed = models::generate(m, prompts, gc);
    // The same model with the packs dropped: every projection on its own.
    for (auto& layer : m.model->layers) {
      layer->self_attn->qkv_pack.reset();
      layer->mlp->gate_up_pack.reset();
    }
    CHECK(models::generate(m, prompts, gc) == packed);
  }
}

}  // namespace tpu::testing
