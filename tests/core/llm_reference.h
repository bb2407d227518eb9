// Tiny random decoder models written in Hugging Face layout by the tests themselves (config.json
// text and safetensors weights), and an independent reference forward in double with naive
// loops (no tpucore ops): embeddings, RMSNorm, q/k/v projections with optional biases and q/k
// norm, rotate-half RoPE with llama3 scaling, causal grouped-KV attention, SwiGLU, tied heads.
#pragma once

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "tpucore/ops.h"
#include "tpucore/safetensors.h"

namespace tpu::testing::llm {

struct TinyCfg {
  std::string model_type = "llama";
  int64_t vocab = 37, hidden = 24, inter = 40, layers = 2, heads = 4, kv_heads = 2, head_dim = 8;
  double theta = 10000.0, eps = 1e-5;
  bool tied = false, qkv_bias = false, o_bias = false, qk_norm = false;
  bool llama3 = false;  // rope_scaling llama3 (factor 8, low 1, high 4, original 16)
  std::string json() const {
    std::string s = "{\"model_type\": \"" + model_type + "\", \"vocab_size\": " + std::to_string(vocab) +
                    ", \"hidden_size\": " + std::to_string(hidden) + ", \"intermediate_size\": " + std::to_string(inter) +
                    ", \"num_hidden_layers\": " + std::to_string(layers) +
                    ", \"num_attention_heads\": " + std::to_string(heads) +
                    ", \"num_key_value_heads\": " + std::to_string(kv_heads) + ", \"head_dim\": " + std::to_string(head_dim) +
                    ", \"rope_theta\": " + std::to_string(theta) + ", \"rms_norm_eps\": 1e-05" +
                    ", \"tie_word_embeddings\": " + (tied ? "true" : "false") + ", \"hidden_act\": \"silu\"" +
                    ", \"attention_bias\": " + (o_bias ? "true" : "false");
    if (llama3)
      s += ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
           "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 16}";
    return s + ", \"eos_token_id\": [2, 3], \"bos_token_id\": 1}";
  }
};

using Weights = std::map<std::string, std::vector<double>>;  // values after rounding to the file dtype
using Shapes = std::map<std::string, std::vector<int64_t>>;

inline Shapes tiny_shapes(const TinyCfg& c) {
  Shapes s;
  const int64_t q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  s["model.embed_tokens.weight"] = {c.vocab, c.hidden};
  s["model.norm.weight"] = {c.hidden};
  if (!c.tied) s["lm_head.weight"] = {c.vocab, c.hidden};
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s[p + "input_layernorm.weight"] = {c.hidden};
    s[p + "post_attention_layernorm.weight"] = {c.hidden};
    s[p + "self_attn.q_proj.weight"] = {q, c.hidden};
    s[p + "self_attn.k_proj.weight"] = {kv, c.hidden};
    s[p + "self_attn.v_proj.weight"] = {kv, c.hidden};
    s[p + "self_attn.o_proj.weight"] = {c.hidden, q};
    if (c.qkv_bias) {
      s[p + "self_attn.q_proj.bias"] = {q};
      s[p + "self_attn.k_proj.bias"] = {kv};
      s[p + "self_attn.v_proj.bias"] = {kv};
    }
    if (c.o_bias) s[p + "self_attn.o_proj.bias"] = {c.hidden};
    if (c.qk_norm) {
      s[p + "self_attn.q_norm.weight"] = {c.head_dim};
      s[p + "self_attn.k_norm.weight"] = {c.head_dim};
    }
    s[p + "mlp.gate_proj.weight"] = {c.inter, c.hidden};
    s[p + "mlp.up_proj.weight"] = {c.inter, c.hidden};
    s[p + "mlp.down_proj.weight"] = {c.hidden, c.inter};
  }
  return s;
}

inline std::filesystem::path temp_dir(const std::string& tag) {
  static int counter = 0;
  auto p = std::filesystem::temp_directory_path() /
           ("tpucore_llm_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::create_directories(p);
  return p;
}

// Writes config.json and the weights in file dtype `dt` (shards > 1: split over that many files
// with an index). Returns the values the file holds, for the reference.
inline Weights write_tiny_model(const std::filesystem::path& dir, const TinyCfg& c, DType dt, int shards, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  Weights w;
  std::vector<TensorList> files(static_cast<size_t>(shards));
  std::string index = "{\"metadata\": {}, \"weight_map\": {";
  int k = 0;
  for (const auto& [name, shape] : tiny_shapes(c)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    const bool is_norm = name.find("norm") != std::string::npos;
    for (float& x : v) x = is_norm ? 1.0f + u(rng) : u(rng);
    Tensor t = to(from_vector(v, Shape(shape)), dt);
    std::vector<double>& ref = w[name];
    for (float x : to(t, DType::f32).to_vector<float>()) ref.push_back(x);
    const size_t f = static_cast<size_t>(k % shards);
    files[f].emplace_back(name, t);
    index += std::string(k ? ", " : "") + "\"" + name + "\": \"model-0000" + std::to_string(f + 1) + "-of-0000" +
             std::to_string(shards) + ".safetensors\"";
    ++k;
  }
  std::ofstream(dir / "config.json") << c.json();
  if (shards == 1) {
    save_safetensors((dir / "model.safetensors").string(), files[0]);
  } else {
    for (size_t f = 0; f < files.size(); ++f)
      save_safetensors((dir / ("model-0000" + std::to_string(f + 1) + "-of-0000" + std::to_string(shards) +
                               ".safetensors")).string(), files[f]);
    std::ofstream(dir / "model.safetensors.index.json") << index << "}}";
  }
  return w;
}

// ---- reference forward ----
inline std::vector<double> matvec(const std::vector<double>& W, int64_t out, int64_t in, const double* x,
                                  const std::vector<double>* bias = nullptr) {
  std::vector<double> y(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double s = bias ? (*bias)[static_cast<size_t>(o)] : 0.0;
    for (int64_t i = 0; i < in; ++i) s += W[static_cast<size_t>(o * in + i)] * x[i];
    y[static_cast<size_t>(o)] = s;
  }
  return y;
}
inline void rmsnorm(double* x, int64_t n, const std::vector<double>& w, double eps) {
  double ms = 0;
  for (int64_t i = 0; i < n; ++i) ms += x[i] * x[i];
  const double r = 1.0 / std::sqrt(ms / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * r * w[static_cast<size_t>(i)];
}
inline std::vector<double> ref_inv_freq(const TinyCfg& c) {
  std::vector<double> f;
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    double v = 1.0 / std::pow(c.theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
    if (c.llama3) {  // factor 8, low_freq_factor 1, high_freq_factor 4, original context 16
      const double wl = 2 * M_PI / v;
      if (wl > 16.0) v = v / 8.0;
      else if (wl >= 4.0) {
        const double sm = (16.0 / wl - 1.0) / 3.0;
        v = (1 - sm) * v / 8.0 + sm * v;
      }
    }
    f.push_back(v);
  }
  return f;
}

// Logits [T][vocab] of one sequence at positions pos[0..T).
inline std::vector<std::vector<double>> ref_forward(const TinyCfg& c, Weights& w, const std::vector<int64_t>& ids,
                                                    const std::vector<int64_t>& pos) {
  const int64_t T = static_cast<int64_t>(ids.size()), E = c.hidden, D = c.head_dim, H = c.heads, HK = c.kv_heads;
  std::vector<std::vector<double>> h(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    auto& e = w["model.embed_tokens.weight"];
    h[t].assign(e.begin() + ids[t] * E, e.begin() + (ids[t] + 1) * E);
  }
  const auto inv = ref_inv_freq(c);
  auto rope = [&](std::vector<double>& v, int64_t nheads, int64_t p) {
    for (int64_t hh = 0; hh < nheads; ++hh)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double a = static_cast<double>(p) * inv[i];
        double& x1 = v[hh * D + i];
        double& x2 = v[hh * D + i + D / 2];
        const double y1 = x1 * std::cos(a) - x2 * std::sin(a), y2 = x2 * std::cos(a) + x1 * std::sin(a);
        x1 = y1;
        x2 = y2;
      }
  };
  auto get = [&](const std::string& n) -> std::vector<double>* { return w.count(n) ? &w[n] : nullptr; };
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> x = h[t];
      rmsnorm(x.data(), E, w[p + "input_layernorm.weight"], c.eps);
      q[t] = matvec(w[p + "self_attn.q_proj.weight"], H * D, E, x.data(), get(p + "self_attn.q_proj.bias"));
      k[t] = matvec(w[p + "self_attn.k_proj.weight"], HK * D, E, x.data(), get(p + "self_attn.k_proj.bias"));
      v[t] = matvec(w[p + "self_attn.v_proj.weight"], HK * D, E, x.data(), get(p + "self_attn.v_proj.bias"));
      if (c.qk_norm) {
        for (int64_t hh = 0; hh < H; ++hh) rmsnorm(q[t].data() + hh * D, D, w[p + "self_attn.q_norm.weight"], c.eps);
        for (int64_t hh = 0; hh < HK; ++hh) rmsnorm(k[t].data() + hh * D, D, w[p + "self_attn.k_norm.weight"], c.eps);
      }
      rope(q[t], H, pos[t]);
      rope(k[t], HK, pos[t]);
    }
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> att(static_cast<size_t>(H * D), 0.0);
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t kh = hh / (H / HK);
        std::vector<double> sc(static_cast<size_t>(t + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += q[t][hh * D + d] * k[j][kh * D + d];
          sc[j] = s / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (double& s : sc) z += (s = std::exp(s - mx));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t d = 0; d < D; ++d) att[hh * D + d] += sc[j] / z * v[j][kh * D + d];
      }
      auto o = matvec(w[p + "self_attn.o_proj.weight"], E, H * D, att.data(), get(p + "self_attn.o_proj.bias"));
      for (int64_t i = 0; i < E; ++i) h[t][i] += o[i];
      std::vector<double> x = h[t];
      rmsnorm(x.data(), E, w[p + "post_attention_layernorm.weight"], c.eps);
      auto g = matvec(w[p + "mlp.gate_proj.weight"], c.inter, E, x.data());
      auto u = matvec(w[p + "mlp.up_proj.weight"], c.inter, E, x.data());
      for (int64_t i = 0; i < c.inter; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      auto dn = matvec(w[p + "mlp.down_proj.weight"], E, c.inter, g.data());
      for (int64_t i = 0; i < E; ++i) h[t][i] += dn[i];
    }
  }
  std::vector<std::vector<double>> logits(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    rmsnorm(h[t].data(), E, w["model.norm.weight"], c.eps);
    logits[t] = matvec(w[c.tied ? "model.embed_tokens.weight" : "lm_head.weight"], c.vocab, E, h[t].data());
  }
  return logits;
}

}  // namespace tpu::testing::llm
