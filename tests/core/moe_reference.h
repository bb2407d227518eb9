// Tiny mixture-of-experts checkpoints in Hugging Face layout (Mixtral's block_sparse_moe with
// experts.I.w1/w2/w3, Qwen3-MoE's mlp with experts.I.gate_proj/up_proj/down_proj) for the
// reference of llm_reference.h, and the sparse block's reference forward in double with naive
// loops: router logits, softmax, top-k (ties to the lower expert), optional renormalization, and
// the weighted sum of the chosen SwiGLU experts.
#pragma once

#include <algorithm>
#include <numeric>

#include "llm_reference.h"

namespace tpu::testing::llm {

struct MoeSpec {
  bool mixtral = true;
  int64_t experts = 4, top_k = 2, inter = 12;  // inter: each expert's width (Mixtral: intermediate_size)
  bool norm_topk = true;                         // Qwen3-MoE's norm_topk_prob (Mixtral always)
  int64_t sparse_step = 1;                       // Qwen3-MoE's decoder_sparse_step
  std::vector<int64_t> mlp_only{};               // Qwen3-MoE's mlp_only_layers
};

// The sparse block of one token: x [hidden] (normalized) -> [hidden].
inline std::vector<double> moe_block_ref(const MoeSpec& m, int64_t hidden, Weights& w, const std::string& p,
                                         const std::vector<double>& x) {
  const std::string b = p + (m.mixtral ? "block_sparse_moe." : "mlp.");
  const std::vector<double> logits = matvec(w[b + "gate.weight"], m.experts, hidden, x.data());
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> prob(logits.size());
  double z = 0;
  for (size_t e = 0; e < prob.size(); ++e) z += (prob[e] = std::exp(logits[e] - mx));
  for (double& q : prob) q /= z;
  std::vector<int64_t> order(static_cast<size_t>(m.experts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return prob[a] > prob[c]; });
  double chosen = 0;
  for (int64_t j = 0; j < m.top_k; ++j) chosen += prob[static_cast<size_t>(order[j])];
  std::vector<double> out(static_cast<size_t>(hidden), 0.0);
  for (int64_t j = 0; j < m.top_k; ++j) {
    const int64_t e = order[static_cast<size_t>(j)];
    const double weight = prob[static_cast<size_t>(e)] / (m.norm_topk ? chosen : 1.0);
    const std::string q = b + "experts." + std::to_string(e) + ".";
    auto gt = matvec(w[q + (m.mixtral ? "w1" : "gate_proj") + ".weight"], m.inter, hidden, x.data());
    auto up = matvec(w[q + (m.mixtral ? "w3" : "up_proj") + ".weight"], m.inter, hidden, x.data());
    for (int64_t i = 0; i < m.inter; ++i) gt[i] = gt[i] / (1.0 + std::exp(-gt[i])) * up[i];
    const auto dn = matvec(w[q + (m.mixtral ? "w2" : "down_proj") + ".weight"], hidden, m.inter, gt.data());
    for (int64_t i = 0; i < hidden; ++i) out[i] += weight * dn[i];
  }
  return out;
}

// Turns a dense TinyCfg into the MoE family of `m` (model_type, config fields, weights, forward).
inline void make_moe(TinyCfg& c, const MoeSpec& m) {
  c.model_type = m.mixtral ? "mixtral" : "qwen3_moe";
  if (m.mixtral) {
    c.inter = m.inter;
    c.extra_json += ", \"num_local_experts\": " + std::to_string(m.experts) +
                    ", \"num_experts_per_tok\": " + std::to_string(m.top_k) +
                    ", \"router_aux_loss_coef\": 0.02, \"output_router_logits\": false, \"router_jitter_noise\": 0.0";
  } else {
    c.qk_norm = true;
    std::string only = "[";
    for (size_t i = 0; i < m.mlp_only.size(); ++i) only += (i ? ", " : "") + std::to_string(m.mlp_only[i]);
    c.extra_json += ", \"num_experts\": " + std::to_string(m.experts) +
                    ", \"num_experts_per_tok\": " + std::to_string(m.top_k) +
                    ", \"moe_intermediate_size\": " + std::to_string(m.inter) +
                    ", \"norm_topk_prob\": " + (m.norm_topk ? "true" : "false") +
                    ", \"decoder_sparse_step\": " + std::to_string(m.sparse_step) + ", \"mlp_only_layers\": " + only +
                    "], \"router_aux_loss_coef\": 0.001, \"output_router_logits\": false";
  }
  c.sparse = [m](int64_t l) {
    if (m.mixtral) return true;
    return std::find(m.mlp_only.begin(), m.mlp_only.end(), l) == m.mlp_only.end() && (l + 1) % m.sparse_step == 0;
  };
  const int64_t hidden = c.hidden;
  c.moe_shapes = [m, hidden](Shapes& s, const std::string& p) {
    const std::string b = p + (m.mixtral ? "block_sparse_moe." : "mlp.");
    s[b + "gate.weight"] = {m.experts, hidden};
    for (int64_t e = 0; e < m.experts; ++e) {
      const std::string q = b + "experts." + std::to_string(e) + ".";
      s[q + (m.mixtral ? "w1" : "gate_proj") + ".weight"] = {m.inter, hidden};
      s[q + (m.mixtral ? "w3" : "up_proj") + ".weight"] = {m.inter, hidden};
      s[q + (m.mixtral ? "w2" : "down_proj") + ".weight"] = {hidden, m.inter};
    }
  };
  c.moe_forward = [m, hidden](Weights& w, const std::string& p, const std::vector<double>& x) {
    return moe_block_ref(m, hidden, w, p, x);
  };
}

}  // namespace tpu::testing::llm
