// DeepSeek-V3 (deepseek_v3) on tiny random checkpoints written in Hugging Face layout: multi-head
// latent attention (low-rank or plain queries, interleaved or rotate-half rope parts, yarn with
// mscale_all_dim in the softmax scale), dense first layers, routed experts with sigmoid,
// group-limited routing and the correction bias, shared experts. Against an independent
// reference in double written here from Transformers' published DeepseekV3 math: f32 logits
// within 1e-5 relative error, decoding through the compressed latent cache equal to the full
// forward, greedy generation equal to the reference's argmax (eager and compiled, cpu and the
// simulated chip), the cache's size, the save/load round trip and the configs refused by name.
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <set>

#include "core/codegen_testing.h"
#include "core/llm_reference.h"
#include "core/testing.h"
#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/models.h"

using namespace tpu;
using namespace tpu::testing::llm;

namespace {

struct DsCfg {
  int64_t vocab = 40, hidden = 16, inter = 24, moe_inter = 8, layers = 3, heads = 3;
  int64_t q_lora = 10, kv_lora = 12, nope = 4, rope = 4, v = 6;
  int64_t experts = 8, shared = 1, top_k = 3, n_group = 4, topk_group = 2, first_dense = 1;
  double scale = 2.5, theta = 10000.0, eps = 1e-5;
  bool norm_topk = true, interleave = true, tied = false, bias = false;
  bool yarn = false;  // rope_scaling yarn: factor 4, original 16, mscale 0.9, mscale_all_dim 0.7
  int64_t max_pos = 64;

  std::string json() const {
    std::string s = "{\"model_type\": \"deepseek_v3\", \"architectures\": [\"DeepseekV3ForCausalLM\"]";
    auto add = [&](const std::string& k, const std::string& val) { s += ", \"" + k + "\": " + val; };
    auto num = [&](const std::string& k, double x) { add(k, fmt::format("{}", x)); };
    num("vocab_size", static_cast<double>(vocab));
    num("hidden_size", static_cast<double>(hidden));
    num("intermediate_size", static_cast<double>(inter));
    num("moe_intermediate_size", static_cast<double>(moe_inter));
    num("num_hidden_layers", static_cast<double>(layers));
    num("num_attention_heads", static_cast<double>(heads));
    num("num_key_value_heads", static_cast<double>(heads));
    add("q_lora_rank", q_lora > 0 ? std::to_string(q_lora) : "null");
    num("kv_lora_rank", static_cast<double>(kv_lora));
    num("qk_nope_head_dim", static_cast<double>(nope));
    num("qk_rope_head_dim", static_cast<double>(rope));
    num("v_head_dim", static_cast<double>(v));
    num("n_routed_experts", static_cast<double>(experts));
    num("n_shared_experts", static_cast<double>(shared));
    num("num_experts_per_tok", static_cast<double>(top_k));
    num("n_group", static_cast<double>(n_group));
    num("topk_group", static_cast<double>(topk_group));
    num("first_k_dense_replace", static_cast<double>(first_dense));
    num("routed_scaling_factor", scale);
    num("rope_theta", theta);
    num("rms_norm_eps", eps);
    num("max_position_embeddings", static_cast<double>(max_pos));
    add("norm_topk_prob", norm_topk ? "true" : "false");
    add("rope_interleave", interleave ? "true" : "false");
    add("tie_word_embeddings", tied ? "true" : "false");
    add("attention_bias", bias ? "true" : "false");
    add("topk_method", "\"noaux_tc\"");
    add("scoring_func", "\"sigmoid\"");
    add("num_nextn_predict_layers", "1");
    add("hidden_act", "\"silu\"");
    if (yarn)
      add("rope_scaling", R"({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32, "beta_slow": 1, "mscale": 0.9, "mscale_all_dim": 0.7})");
    return s + "}";
  }

  Shapes shapes() const {
    Shapes s;
    const int64_t dq = nope + rope;
    s["model.embed_tokens.weight"] = {vocab, hidden};
    s["model.norm.weight"] = {hidden};
    if (!tied) s["lm_head.weight"] = {vocab, hidden};
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      s[p + "input_layernorm.weight"] = {hidden};
      s[p + "post_attention_layernorm.weight"] = {hidden};
      const std::string a = p + "self_attn.";
      if (q_lora > 0) {
        s[a + "q_a_proj.weight"] = {q_lora, hidden};
        if (bias) s[a + "q_a_proj.bias"] = {q_lora};
        s[a + "q_a_layernorm.weight"] = {q_lora};
        s[a + "q_b_proj.weight"] = {heads * dq, q_lora};
      } else {
        s[a + "q_proj.weight"] = {heads * dq, hidden};
      }
      s[a + "kv_a_proj_with_mqa.weight"] = {kv_lora + rope, hidden};
      if (bias) s[a + "kv_a_proj_with_mqa.bias"] = {kv_lora + rope};
      s[a + "kv_a_layernorm.weight"] = {kv_lora};
      s[a + "kv_b_proj.weight"] = {heads * (nope + v), kv_lora};
      s[a + "o_proj.weight"] = {hidden, heads * v};
      if (bias) s[a + "o_proj.bias"] = {hidden};
      auto mlp = [&](const std::string& q, int64_t f) {
        s[q + "gate_proj.weight"] = {f, hidden};
        s[q + "up_proj.weight"] = {f, hidden};
        s[q + "down_proj.weight"] = {hidden, f};
      };
      if (l < first_dense) {
        mlp(p + "mlp.", inter);
        continue;
      }
      s[p + "mlp.gate.weight"] = {experts, hidden};
      s[p + "mlp.gate.e_score_correction_bias"] = {experts};
      for (int64_t e = 0; e < experts; ++e) mlp(p + "mlp.experts." + std::to_string(e) + ".", moe_inter);
      if (shared > 0) mlp(p + "mlp.shared_experts.", moe_inter * shared);
    }
    return s;
  }
};

Weights write_ds(const std::filesystem::path& dir, const DsCfg& c, uint32_t seed, DType dt = DType::f32) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  Weights w;
  TensorList list;
  for (const auto& [name, shape] : c.shapes()) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> vals(static_cast<size_t>(n));
    const bool is_norm = name.find("norm") != std::string::npos;
    for (float& x : vals) x = is_norm ? 1.0f + u(rng) : u(rng);
    const Tensor t = to(from_vector(vals, Shape(shape)), dt);
    for (float x : to(t, DType::f32).to_vector<float>()) w[name].push_back(x);  // the values the file holds
    list.emplace_back(name, t);
  }
  std::ofstream(dir / "config.json") << c.json();
  save_safetensors((dir / "model.safetensors").string(), list);
  return w;
}

double ds_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// Inverse frequencies of the rope part and the scale of cos / sin (Transformers' default and
// yarn rope initialisation).
std::pair<std::vector<double>, double> ds_rope(const DsCfg& c) {
  const int64_t d = c.rope, half = d / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) f[static_cast<size_t>(i)] = std::pow(c.theta, -static_cast<double>(2 * i) / static_cast<double>(d));
  if (!c.yarn) return {f, 1.0};
  const double factor = 4.0, orig = 16.0;
  auto corr = [&](double rot) {
    return static_cast<double>(d) * std::log(orig / (rot * 2 * M_PI)) / (2 * std::log(c.theta));
  };
  double lo = std::max(0.0, std::floor(corr(32.0))), hi = std::min(static_cast<double>(d - 1), std::ceil(corr(1.0)));
  if (lo == hi) hi += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
    const double extra = 1.0 - ramp;  // weight of the unscaled frequency
    const double base = f[static_cast<size_t>(i)];
    f[static_cast<size_t>(i)] = base / factor * (1 - extra) + base * extra;
  }
  return {f, ds_mscale(factor, 0.9) / ds_mscale(factor, 0.7)};
}

// Rotates the rope part v (length d) at position p: de-interleaved first when asked, then
// rotate-half with cos / sin scaled by `att`.
void ds_rotate(double* x, int64_t d, double p, const std::vector<double>& f, double att, bool interleave) {
  std::vector<double> z(x, x + d);
  const int64_t half = d / 2;
  if (interleave)
    for (int64_t i = 0; i < half; ++i) {
      z[static_cast<size_t>(i)] = x[2 * i];
      z[static_cast<size_t>(i + half)] = x[2 * i + 1];
    }
  for (int64_t i = 0; i < half; ++i) {
    const double a = p * f[static_cast<size_t>(i)], cs = std::cos(a) * att, sn = std::sin(a) * att;
    const double lo = z[static_cast<size_t>(i)], hi = z[static_cast<size_t>(i + half)];
    x[i] = lo * cs - hi * sn;
    x[i + half] = hi * cs + lo * sn;
  }
}

std::vector<double> ds_mlp(Weights& w, const std::string& p, int64_t hidden, int64_t f, const double* x) {
  const std::vector<double> g = matvec(w[p + "gate_proj.weight"], f, hidden, x);
  const std::vector<double> u = matvec(w[p + "up_proj.weight"], f, hidden, x);
  std::vector<double> a(static_cast<size_t>(f));
  for (size_t i = 0; i < a.size(); ++i) a[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
  return matvec(w[p + "down_proj.weight"], hidden, f, a.data());
}

// The routed-plus-shared MoE of one token (Transformers' DeepseekV3TopkRouter and DeepseekV3MoE).
std::vector<double> ds_moe(const DsCfg& c, Weights& w, const std::string& p, const double* x) {
  const int64_t e = c.experts, per = e / c.n_group;
  const std::vector<double> logits = matvec(w[p + "gate.weight"], e, c.hidden, x);
  const std::vector<double>& bias = w[p + "gate.e_score_correction_bias"];
  std::vector<double> score(static_cast<size_t>(e)), choice(static_cast<size_t>(e));
  for (int64_t i = 0; i < e; ++i) {
    score[static_cast<size_t>(i)] = 1 / (1 + std::exp(-logits[static_cast<size_t>(i)]));
    choice[static_cast<size_t>(i)] = score[static_cast<size_t>(i)] + bias[static_cast<size_t>(i)];
  }
  // Group scores: the sum of each group's two best choice scores; the best topk_group groups stay.
  std::vector<double> gscore(static_cast<size_t>(c.n_group));
  for (int64_t g = 0; g < c.n_group; ++g) {
    std::vector<double> m(choice.begin() + g * per, choice.begin() + (g + 1) * per);
    std::sort(m.rbegin(), m.rend());
    gscore[static_cast<size_t>(g)] = m[0] + m[1];
  }
  std::vector<int64_t> gorder(static_cast<size_t>(c.n_group));
  std::iota(gorder.begin(), gorder.end(), 0);
  std::sort(gorder.begin(), gorder.end(), [&](int64_t a, int64_t b) { return gscore[static_cast<size_t>(a)] > gscore[static_cast<size_t>(b)]; });
  std::vector<double> masked(static_cast<size_t>(e), 0.0);
  for (int64_t k = 0; k < c.topk_group; ++k)
    for (int64_t i = 0; i < per; ++i) {
      const auto j = static_cast<size_t>(gorder[static_cast<size_t>(k)] * per + i);
      masked[j] = choice[j];
    }
  std::vector<int64_t> order(static_cast<size_t>(e));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return masked[static_cast<size_t>(a)] > masked[static_cast<size_t>(b)]; });
  double denom = 0;
  for (int64_t k = 0; k < c.top_k; ++k) denom += score[static_cast<size_t>(order[static_cast<size_t>(k)])];
  std::vector<double> out(static_cast<size_t>(c.hidden), 0.0);
  for (int64_t k = 0; k < c.top_k; ++k) {
    const int64_t ex = order[static_cast<size_t>(k)];
    double wt = score[static_cast<size_t>(ex)];
    if (c.norm_topk) wt /= denom + 1e-20;
    wt *= c.scale;
    const std::vector<double> y = ds_mlp(w, p + "experts." + std::to_string(ex) + ".", c.hidden, c.moe_inter, x);
    for (size_t i = 0; i < out.size(); ++i) out[i] += wt * y[i];
  }
  if (c.shared > 0) {
    const std::vector<double> y = ds_mlp(w, p + "shared_experts.", c.hidden, c.moe_inter * c.shared, x);
    for (size_t i = 0; i < out.size(); ++i) out[i] += y[i];
  }
  return out;
}

// The reference forward of one sequence at positions 0..T-1: logits [T][vocab].
Logits ds_forward(const DsCfg& c, Weights& w, const std::vector<int64_t>& ids) {
  const auto t = static_cast<int64_t>(ids.size());
  const int64_t hd = c.hidden, nh = c.heads, dq = c.nope + c.rope, r = c.kv_lora;
  const auto [freq, att] = ds_rope(c);
  double softmax_scale = 1.0 / std::sqrt(static_cast<double>(dq));
  if (c.yarn) softmax_scale *= ds_mscale(4.0, 0.7) * ds_mscale(4.0, 0.7);
  std::vector<std::vector<double>> h(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    const std::vector<double>& e = w["model.embed_tokens.weight"];
    h[static_cast<size_t>(i)].assign(e.begin() + ids[static_cast<size_t>(i)] * hd, e.begin() + (ids[static_cast<size_t>(i)] + 1) * hd);
  }
  const std::vector<double> ones(static_cast<size_t>(std::max(r, c.q_lora)), 1.0);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", a = p + "self_attn.";
    std::vector<std::vector<double>> q(static_cast<size_t>(t)), kn(static_cast<size_t>(t)), vv(static_cast<size_t>(t)),
        kpe(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> x = h[static_cast<size_t>(i)];
      rmsnorm(x.data(), hd, w[p + "input_layernorm.weight"], c.eps);
      std::vector<double>& qi = q[static_cast<size_t>(i)];
      if (c.q_lora > 0) {
        std::vector<double> qa = matvec(w[a + "q_a_proj.weight"], c.q_lora, hd, x.data(),
                                        c.bias ? &w[a + "q_a_proj.bias"] : nullptr);
        rmsnorm(qa.data(), c.q_lora, w[a + "q_a_layernorm.weight"], 1e-6);
        qi = matvec(w[a + "q_b_proj.weight"], nh * dq, c.q_lora, qa.data());
      } else {
        qi = matvec(w[a + "q_proj.weight"], nh * dq, hd, x.data());
      }
      std::vector<double> ckv = matvec(w[a + "kv_a_proj_with_mqa.weight"], r + c.rope, hd, x.data(),
                                       c.bias ? &w[a + "kv_a_proj_with_mqa.bias"] : nullptr);
      rmsnorm(ckv.data(), r, w[a + "kv_a_layernorm.weight"], 1e-6);
      kpe[static_cast<size_t>(i)].assign(ckv.begin() + r, ckv.end());
      ds_rotate(kpe[static_cast<size_t>(i)].data(), c.rope, static_cast<double>(i), freq, att, c.interleave);
      for (int64_t hh = 0; hh < nh; ++hh) ds_rotate(qi.data() + hh * dq + c.nope, c.rope, static_cast<double>(i), freq, att, c.interleave);
      const std::vector<double> kv = matvec(w[a + "kv_b_proj.weight"], nh * (c.nope + c.v), r, ckv.data());
      kn[static_cast<size_t>(i)] = kv;
    }
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> o(static_cast<size_t>(nh * c.v), 0.0);
      for (int64_t hh = 0; hh < nh; ++hh) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          const double* qh = q[static_cast<size_t>(i)].data() + hh * dq;
          const double* kh = kn[static_cast<size_t>(j)].data() + hh * (c.nope + c.v);
          for (int64_t d = 0; d < c.nope; ++d) dot += qh[d] * kh[d];
          for (int64_t d = 0; d < c.rope; ++d) dot += qh[c.nope + d] * kpe[static_cast<size_t>(j)][static_cast<size_t>(d)];
          s[static_cast<size_t>(j)] = dot * softmax_scale;
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        double z = 0;
        for (double& x : s) z += (x = std::exp(x - mx));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t d = 0; d < c.v; ++d)
            o[static_cast<size_t>(hh * c.v + d)] +=
                s[static_cast<size_t>(j)] / z * kn[static_cast<size_t>(j)][static_cast<size_t>(hh * (c.nope + c.v) + c.nope + d)];
      }
      const std::vector<double> y = matvec(w[a + "o_proj.weight"], hd, nh * c.v, o.data(), c.bias ? &w[a + "o_proj.bias"] : nullptr);
      for (int64_t d = 0; d < hd; ++d) h[static_cast<size_t>(i)][static_cast<size_t>(d)] += y[static_cast<size_t>(d)];
    }
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> x = h[static_cast<size_t>(i)];
      rmsnorm(x.data(), hd, w[p + "post_attention_layernorm.weight"], c.eps);
      const std::vector<double> y = l < c.first_dense ? ds_mlp(w, p + "mlp.", hd, c.inter, x.data())
                                                      : ds_moe(c, w, p + "mlp.", x.data());
      for (int64_t d = 0; d < hd; ++d) h[static_cast<size_t>(i)][static_cast<size_t>(d)] += y[static_cast<size_t>(d)];
    }
  }
  Logits out(static_cast<size_t>(t));
  const std::vector<double>& head = c.tied ? w["model.embed_tokens.weight"] : w["lm_head.weight"];
  for (int64_t i = 0; i < t; ++i) {
    rmsnorm(h[static_cast<size_t>(i)].data(), hd, w["model.norm.weight"], c.eps);
    out[static_cast<size_t>(i)] = matvec(head, c.vocab, hd, h[static_cast<size_t>(i)].data());
  }
  return out;
}

Logits ds_rows(const Tensor& t) {
  const std::vector<float> v = to(t, DType::f32).to_vector<float>();
  const int64_t n = t.size(1), vocab = t.size(2);
  Logits r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)].assign(v.begin() + i * vocab, v.begin() + (i + 1) * vocab);
  return r;
}

const std::vector<int64_t> kDsIds{3, 1, 4, 1, 5, 9, 2, 6, 5, 3};

std::vector<int64_t> ds_greedy(const DsCfg& c, Weights& w, std::vector<int64_t> seq, int steps) {
  std::vector<int64_t> out;
  for (int s = 0; s < steps; ++s) {
    const std::vector<double> last = ds_forward(c, w, seq).back();
    const auto t = static_cast<int64_t>(std::max_element(last.begin(), last.end()) - last.begin());
    out.push_back(t);
    seq.push_back(t);
  }
  return out;
}

void check_deepseek(const DsCfg& c, uint32_t seed, const std::string& tag) {
  auto dir = temp_dir("deepseek_" + tag);
  Weights w = write_ds(dir, c, seed);
  auto m = models::load_causal_lm(dir.string());
  NoGradGuard ng;
  const Tensor full = m->forward(row(kDsIds));
  const Logits want = ds_forward(c, w, kDsIds);
  const double e = rel_error(full, want);
  INFO(tag << ": relative error of the full forward " << e);
  CHECK(e <= 1e-5);
  // Prefill 4 tokens, then one token per step through the compressed latent cache.
  nn::KVCache cache = m->make_cache(1, static_cast<int64_t>(kDsIds.size()));
  const int64_t latent = c.kv_lora + c.rope + (c.kv_lora + c.rope) % 2;  // padded to even
  CHECK(cache.nbytes() == c.layers * static_cast<int64_t>(kDsIds.size()) * latent * 4);
  std::vector<Tensor> parts{m->forward(row({kDsIds.begin(), kDsIds.begin() + 4}), &cache)};
  for (size_t i = 4; i < kDsIds.size(); ++i) parts.push_back(m->forward(row({kDsIds[i]}), &cache));
  const double d = rel_error(cat(parts, 1), ds_rows(full));
  INFO("relative error of cached decoding " << d);
  CHECK(d <= 1e-5);
  const std::vector<int64_t> ref_tokens = ds_greedy(c, w, {3, 1, 4}, 5);
  models::GenerationConfig g;
  g.max_new_tokens = 5;
  CHECK(models::generate(*m, {{3, 1, 4}}, g)[0] == ref_tokens);
  g.compile = true;
  g.compile_name = "test_llm_deepseek_" + tag;
  CHECK(models::generate(*m, {{3, 1, 4}}, g)[0] == ref_tokens);
  auto f = compile([&](const Tensor& ids) { return m->forward(ids); },
                   CompileOptions{.name = "test_llm_deepseek_forward_" + tag, .fullgraph = true});
  CHECK(rel_error(f(row(kDsIds)), want) <= 1e-5);
  // Written back in Hub layout and read again.
  auto dir2 = temp_dir("deepseek_" + tag + "_saved");
  models::save_causal_lm(*m, dir2.string());
  std::set<std::string> names, hub;
  for (const auto& [n, t] : load_safetensors((dir2 / "model.safetensors").string())) names.insert(n);
  for (const auto& [n, s] : c.shapes()) hub.insert(n);
  CHECK(names == hub);
  CHECK(rel_error(models::load_causal_lm(dir2.string())->forward(row(kDsIds)), want) <= 1e-5);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir2);
}

}  // namespace

TEST_CASE("llm deepseek: low-rank queries, interleaved rope, group-limited routing match the reference",
          "[llm][moe][deepseek]") {
  check_deepseek(DsCfg{}, 61, "qlora");
}

TEST_CASE("llm deepseek: plain q_proj, yarn with mscale_all_dim, biases, raw weights, odd latent",
          "[llm][moe][deepseek]") {
  DsCfg c;
  c.q_lora = 0;
  c.yarn = true;
  c.bias = true;
  c.norm_topk = false;
  c.interleave = false;
  c.tied = true;
  c.kv_lora = 11;  // latent 15: the cache pads it to 16
  c.shared = 2;
  c.first_dense = 2;
  c.layers = 3;
  c.n_group = 2;
  c.topk_group = 1;
  c.top_k = 2;
  check_deepseek(c, 62, "yarn");
}

TEST_CASE("llm deepseek: on the simulated chip, eager and compiled decoding equal the reference", "[llm][moe][deepseek][codegen]") {
  testing::TinySim tiny;
  DsCfg c;
  auto dir = temp_dir("deepseek_chip");
  Weights w = write_ds(dir, c, 63);
  auto chip_model = models::load_causal_lm(dir.string(), tiny.dev());
  std::filesystem::remove_all(dir);
  models::GenerationConfig g;
  g.max_new_tokens = 4;
  const std::vector<int64_t> want = ds_greedy(c, w, {3, 1, 4, 1, 5}, 4);
  CHECK(models::generate(*chip_model, {{3, 1, 4, 1, 5}}, g)[0] == want);
  g.compile = true;
  g.compile_name = "test_llm_deepseek_sim";
  CHECK(models::generate(*chip_model, {{3, 1, 4, 1, 5}}, g)[0] == want);
}

TEST_CASE("llm deepseek: bad configs and unsupported uses are refused by name", "[llm][moe][deepseek][errors]") {
  using tpu::testing::expect_error;
  DsCfg c;
  auto parse = [&](const std::string& extra) {
    std::string j = c.json();
    j.pop_back();
    return models::ModelConfig::from_json(j + extra + "}");
  };
  const models::ModelConfig ok = parse("");
  CHECK(ok.mla());
  CHECK(ok.head_dim == c.rope);
  CHECK(!ok.is_sparse(0));
  CHECK(ok.is_sparse(1));
  CHECK(models::ModelConfig::from_json(ok.to_json()).to_json() == ok.to_json());
  expect_error([&] { parse(R"(, "n_group": 3)"); }, {"n_group (3)", "n_routed_experts (8)"});
  expect_error([&] { parse(R"(, "topk_group": 5)"); }, {"topk_group (5)"});
  expect_error([&] { parse(R"(, "topk_method": "greedy")"); }, {"topk_method", "noaux_tc"});
  expect_error([&] { parse(R"(, "scoring_func": "softmax")"); }, {"scoring_func", "sigmoid"});
  expect_error([&] { parse(R"(, "moe_layer_freq": 2)"); }, {"moe_layer_freq"});
  expect_error([&] { parse(R"(, "qk_rope_head_dim": 3)"); }, {"qk_rope_head_dim (3)", "even"});
  expect_error([&] { parse(R"(, "output_router_logits": true)"); }, {"output_router_logits"});
  expect_error([&] {
    std::string j = c.json();
    const std::string key = "\"num_key_value_heads\": 3";
    j.replace(j.find(key), key.size(), "\"num_key_value_heads\": 1");
    models::ModelConfig::from_json(j);
  }, {"num_key_value_heads (1)", "num_attention_heads (3)"});
  // The published DeepSeek-V3 config.json's fields (fp8 quantization_config aside) parse as such.
  const std::string hub = R"({"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
    "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "use_cache": true, "v_head_dim": 128, "vocab_size": 129280)";
  const models::ModelConfig v3 = models::ModelConfig::from_json(hub + "}");
  CHECK(v3.num_experts == 256);
  CHECK(v3.q_lora_rank == 1536);
  CHECK(v3.head_dim == 64);
  CHECK(v3.rope_scaling.type == "yarn");
  CHECK(v3.rope_scaling.mscale_all_dim == 1.0);
  CHECK(!v3.is_sparse(2));
  CHECK(v3.is_sparse(3));
  expect_error([&] { models::ModelConfig::from_json(hub + R"(, "quantization_config": {"quant_method": "fp8"}})"); },
               {"quantization_config"});
  auto m = std::make_shared<models::CausalLM>(ok);
  expect_error([&] { models::quantize_causal_lm(*m, nn::WeightQuant::int8); }, {"MLA"});
  expect_error([&] { models::router_aux_loss(*m); }, {"deepseek_v3", "auxiliary loss"});
  m->int8_kv_cache = true;
  expect_error([&] { m->make_cache(1, 4); }, {"int8 KV cache", "MLA"});
}
