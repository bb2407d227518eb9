// Tiny random decoder models written in Hugging Face layout by the tests themselves (config.json
// text and safetensors weights), and an independent reference forward in double with naive
// loops (no tpucore ops): embeddings, RMSNorm, q/k/v projections with optional biases and q/k
// norm, rotate-half RoPE with llama3 scaling, causal grouped-KV attention, SwiGLU, tied heads.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

#include "tpucore/ops.h"
#include "tpucore/safetensors.h"

namespace tpu::testing::llm {

// Logits of one sequence, [T][vocab], in double.
using Logits = std::vector<std::vector<double>>;

// max |got - want| / max |want| over every logit; got is [1, T, vocab] (or [T, vocab]).
inline double rel_error(const Tensor& got, const Logits& want) {
  std::vector<float> g = to(got, DType::f32).to_vector<float>();
  const size_t v = want[0].size();
  if (g.size() != want.size() * v)
    throw std::runtime_error("rel_error: " + std::to_string(g.size()) + " logits, the reference has " +
                             std::to_string(want.size() * v));
  double err = 0, mag = 0;
  for (size_t t = 0; t < want.size(); ++t)
    for (size_t i = 0; i < v; ++i) {
      err = std::max(err, std::abs(g[t * v + i] - want[t][i]));
      mag = std::max(mag, std::abs(want[t][i]));
    }
  return err / mag;
}

// Token ids as a [1, T] i64 batch of one row.
inline Tensor row(const std::vector<int64_t>& ids) {
  return from_vector(ids, Shape{1, static_cast<int64_t>(ids.size())}, DType::i64);
}

using Weights = std::map<std::string, std::vector<double>>;  // values after rounding to the file dtype
using Shapes = std::map<std::string, std::vector<int64_t>>;

struct TinyCfg {
  std::string model_type = "llama";
  int64_t vocab = 37, hidden = 24, inter = 40, layers = 2, heads = 4, kv_heads = 2, head_dim = 8;
  double theta = 10000.0, eps = 1e-5;
  bool tied = false, qkv_bias = false, o_bias = false, qk_norm = false;
  bool llama3 = false;  // rope_scaling llama3 (factor 8, low 1, high 4, original 16)
  // Gemma 2/3 blocks: (1 + w) norms, sandwich norms, GELU-tanh, embeddings x sqrt(hidden).
  bool gemma = false;
  double qpas = 0;                // query_pre_attn_scalar (0: 1 / sqrt(head_dim))
  double attn_cap = 0, final_cap = 0;  // soft-capping of scores and logits (0: none)
  int64_t window = 0;             // sliding window of the layers marked in `sliding`
  std::vector<bool> sliding;      // per layer
  double local_theta = 0;         // rope base of sliding layers (0: as the others)
  std::vector<double> inv_freq;   // global rope frequencies given by the test (empty: ref_inv_freq)
  double rope_scale = 1.0;        // multiplies cos and sin
  std::string extra_json;         // further config.json fields (", \"key\": value, ...")
  // Mixture-of-experts layers (moe_reference.h): where sparse(l) holds, layer l's feed-forward
  // weights are moe_shapes' (under the layer prefix "model.layers.l.") and its output moe_forward's.
  std::function<bool(int64_t)> sparse;
  std::function<void(Shapes&, const std::string&)> moe_shapes;
  std::function<std::vector<double>(Weights&, const std::string&, const std::vector<double>&)> moe_forward;
  bool is_sparse(int64_t l) const { return sparse && sparse(l); }
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
    return s + extra_json + ", \"eos_token_id\": [2, 3], \"bos_token_id\": 1}";
  }
};

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
    if (c.gemma) {
      s[p + "pre_feedforward_layernorm.weight"] = {c.hidden};
      s[p + "post_feedforward_layernorm.weight"] = {c.hidden};
    }
    if (c.is_sparse(l)) {
      c.moe_shapes(s, p);
      continue;
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
inline void rmsnorm(double* x, int64_t n, const std::vector<double>& w, double eps, bool unit_offset = false) {
  double ms = 0;
  for (int64_t i = 0; i < n; ++i) ms += x[i] * x[i];
  const double r = 1.0 / std::sqrt(ms / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * r * (w[static_cast<size_t>(i)] + (unit_offset ? 1.0 : 0.0));
}
inline std::vector<double> ref_inv_freq(const TinyCfg& c) {
  if (!c.inv_freq.empty()) return c.inv_freq;
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
    if (c.gemma)
      for (double& x : h[t]) x *= std::sqrt(static_cast<double>(E));
  }
  const auto inv_global = ref_inv_freq(c);
  std::vector<double> inv_local;
  for (int64_t i = 0; i < D / 2; ++i) inv_local.push_back(std::pow(c.local_theta, -2.0 * i / static_cast<double>(D)));
  const auto is_sliding = [&](int64_t l) { return c.window > 0 && l < static_cast<int64_t>(c.sliding.size()) && c.sliding[l]; };
  // Rotate-half over the first 2 * inv.size() dims of each head (the rest passes).
  auto rope = [&](std::vector<double>& v, int64_t nheads, int64_t p, const std::vector<double>& inv, double sc) {
    const int64_t half = static_cast<int64_t>(inv.size());
    for (int64_t hh = 0; hh < nheads; ++hh)
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(p) * inv[i];
        double& x1 = v[hh * D + i];
        double& x2 = v[hh * D + i + half];
        const double y1 = sc * (x1 * std::cos(a) - x2 * std::sin(a)), y2 = sc * (x2 * std::cos(a) + x1 * std::sin(a));
        x1 = y1;
        x2 = y2;
      }
  };
  const bool g = c.gemma;
  auto get = [&](const std::string& n) -> std::vector<double>* { return w.count(n) ? &w[n] : nullptr; };
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(T), k(T), v(T);
    const bool sl = is_sliding(l);
    const auto& inv = sl && c.local_theta > 0 ? inv_local : inv_global;
    const double rsc = sl && c.local_theta > 0 ? 1.0 : c.rope_scale;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> x = h[t];
      rmsnorm(x.data(), E, w[p + "input_layernorm.weight"], c.eps, g);
      q[t] = matvec(w[p + "self_attn.q_proj.weight"], H * D, E, x.data(), get(p + "self_attn.q_proj.bias"));
      k[t] = matvec(w[p + "self_attn.k_proj.weight"], HK * D, E, x.data(), get(p + "self_attn.k_proj.bias"));
      v[t] = matvec(w[p + "self_attn.v_proj.weight"], HK * D, E, x.data(), get(p + "self_attn.v_proj.bias"));
      if (c.qk_norm) {
        for (int64_t hh = 0; hh < H; ++hh) rmsnorm(q[t].data() + hh * D, D, w[p + "self_attn.q_norm.weight"], c.eps, g);
        for (int64_t hh = 0; hh < HK; ++hh) rmsnorm(k[t].data() + hh * D, D, w[p + "self_attn.k_norm.weight"], c.eps, g);
      }
      rope(q[t], H, pos[t], inv, rsc);
      rope(k[t], HK, pos[t], inv, rsc);
    }
    const double scale = 1.0 / std::sqrt(c.qpas > 0 ? c.qpas : static_cast<double>(D));
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> att(static_cast<size_t>(H * D), 0.0);
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t kh = hh / (H / HK);
        std::vector<double> sc(static_cast<size_t>(t + 1), 0.0);
        const int64_t first = sl ? std::max<int64_t>(0, t - c.window + 1) : 0;  // keys (t - window, t]
        double mx = -1e300;
        for (int64_t j = first; j <= t; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += q[t][hh * D + d] * k[j][kh * D + d];
          sc[j] = s * scale;
          if (c.attn_cap > 0) sc[j] = c.attn_cap * std::tanh(sc[j] / c.attn_cap);
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (int64_t j = first; j <= t; ++j) z += (sc[j] = std::exp(sc[j] - mx));
        for (int64_t j = first; j <= t; ++j)
          for (int64_t d = 0; d < D; ++d) att[hh * D + d] += sc[j] / z * v[j][kh * D + d];
      }
      auto o = matvec(w[p + "self_attn.o_proj.weight"], E, H * D, att.data(), get(p + "self_attn.o_proj.bias"));
      if (g) rmsnorm(o.data(), E, w[p + "post_attention_layernorm.weight"], c.eps, true);  // sandwich
      for (int64_t i = 0; i < E; ++i) h[t][i] += o[i];
      std::vector<double> x = h[t];
      rmsnorm(x.data(), E, w[p + (g ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight")], c.eps, g);
      if (c.is_sparse(l)) {
        const std::vector<double> y = c.moe_forward(w, p, x);
        for (int64_t i = 0; i < E; ++i) h[t][i] += y[static_cast<size_t>(i)];
        continue;
      }
      auto gt = matvec(w[p + "mlp.gate_proj.weight"], c.inter, E, x.data());
      auto u = matvec(w[p + "mlp.up_proj.weight"], c.inter, E, x.data());
      for (int64_t i = 0; i < c.inter; ++i) {
        const double a = gt[i];
        // SiLU, or Gemma's tanh-approximated GELU.
        gt[i] = (g ? 0.5 * a * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (a + 0.044715 * a * a * a)))
                   : a / (1.0 + std::exp(-a))) * u[i];
      }
      auto dn = matvec(w[p + "mlp.down_proj.weight"], E, c.inter, gt.data());
      if (g) rmsnorm(dn.data(), E, w[p + "post_feedforward_layernorm.weight"], c.eps, true);
      for (int64_t i = 0; i < E; ++i) h[t][i] += dn[i];
    }
  }
  std::vector<std::vector<double>> logits(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    rmsnorm(h[t].data(), E, w["model.norm.weight"], c.eps, g);
    logits[t] = matvec(w[c.tied ? "model.embed_tokens.weight" : "lm_head.weight"], c.vocab, E, h[t].data());
    if (c.final_cap > 0)
      for (double& x : logits[t]) x = c.final_cap * std::tanh(x / c.final_cap);
  }
  return logits;
}

}  // namespace tpu::testing::llm
