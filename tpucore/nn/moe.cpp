#include "tpucore/nn/moe.h"

#include <cmath>
#include <vector>

#include "ops/hot_rows.h"
#include "ops/registry.h"
#include "tpucore/autograd.h"
#include "tpucore/fused_ops.h"
#include "tpucore/nn/fused_path.h"
#include "tpucore/nn/param_init.h"

namespace tpu::nn {
using detail::uniform_init;

MoEExperts::MoEExperts(const MoEConfig& c, Generator* gen) : intermediate_(c.intermediate) {
  TPU_CHECK(c.hidden > 0 && c.intermediate > 0 && c.num_experts > 0,
            "MoEExperts: hidden ({}), intermediate ({}) and num_experts ({}) must be positive", c.hidden,
            c.intermediate, c.num_experts);
  gate_up_proj = uniform_init({c.num_experts, 2 * c.intermediate, c.hidden}, 1.0 / std::sqrt(static_cast<double>(c.hidden)), gen);
  down_proj = uniform_init({c.num_experts, c.hidden, c.intermediate}, 1.0 / std::sqrt(static_cast<double>(c.intermediate)), gen);
  register_parameter("gate_up_proj", gate_up_proj);
  register_parameter("down_proj", down_proj);
  act = register_module("act", activation(c.act));
}

Tensor MoEExperts::forward(const Tensor& xs, const Tensor& group_sizes) {
  // F, or this rank's part of it under expert tensor parallelism (nn::parallel::expert_tensor_parallel).
  const int64_t f = gate_up_proj.size(1) / 2;
  TPU_CHECK(f > 0 && intermediate_ % f == 0 && down_proj.size(-1) == f,
            "MoEExperts: gate_up_proj [.., {}, ..] and down_proj [.., {}] do not fit the intermediate size {}",
            gate_up_proj.size(1), down_proj.size(-1), intermediate_);
  Tensor h = grouped_matmul(xs, gate_up_proj, group_sizes, true);  // [S, 2F]
  const Tensor g = narrow(h, 1, 0, f), u = narrow(h, 1, f, f);
  // silu(g) * u in one pass on the cpu (the chain's values: tpucore/fused_ops.h).
  const bool fused = act->type_name() == "SiLU" && !act->has_forward_hooks() && detail::fused_path_ok({&g, &u}) &&
                     is_floating(g.dtype());
  Tensor a = fused ? silu_mul(g, u) : mul(act->forward(g), u);
  return grouped_matmul(a, down_proj, group_sizes, true);
}

SparseMoE::SparseMoE(MoEConfig c, Generator* gen) : cfg(std::move(c)) {
  TPU_CHECK(cfg.num_experts > 0 && cfg.top_k >= 1 && cfg.top_k <= cfg.num_experts,
            "SparseMoE: top_k ({}) must be in [1, num_experts ({})]", cfg.top_k, cfg.num_experts);
  TPU_CHECK(cfg.capacity_factor >= 0, "SparseMoE: capacity_factor must not be negative, got {}", cfg.capacity_factor);
  TPU_CHECK(cfg.router_jitter_noise >= 0, "SparseMoE: router_jitter_noise must not be negative, got {}",
            cfg.router_jitter_noise);
  if (cfg.sigmoid_routing)
    TPU_CHECK(cfg.n_group >= 1 && cfg.num_experts % cfg.n_group == 0 && cfg.topk_group >= 1 &&
                  cfg.topk_group <= cfg.n_group && (cfg.n_group == 1 || cfg.num_experts / cfg.n_group >= 2) &&
                  cfg.top_k <= cfg.topk_group * (cfg.num_experts / cfg.n_group),
              "SparseMoE: n_group ({}) must divide num_experts ({}) into groups of at least 2, topk_group ({}) be "
              "in [1, n_group] and top_k ({}) fit in the kept groups", cfg.n_group, cfg.num_experts, cfg.topk_group,
              cfg.top_k);
  else
    TPU_CHECK(cfg.n_group == 1 && cfg.routed_scaling_factor == 1.0,
              "SparseMoE: n_group and routed_scaling_factor need sigmoid routing");
  gate = register_module("gate", std::make_shared<MoERouter>(cfg.hidden, cfg.num_experts, cfg.sigmoid_routing, gen));
  experts = register_module("experts", std::make_shared<MoEExperts>(cfg, gen));
  if (cfg.shared_intermediate > 0)
    shared_experts = register_module(
        "shared_experts", std::make_shared<GatedMLP>(cfg.hidden, cfg.shared_intermediate, cfg.act, false, gen));
}

MoERouter::MoERouter(int64_t hidden, int64_t experts, bool correction_bias, Generator* gen)
    : Linear(hidden, experts, false, gen) {
  if (!correction_bias) return;
  e_score_correction_bias = zeros(Shape{experts});
  register_parameter("e_score_correction_bias", e_score_correction_bias, false);
}

namespace {

// capacity_keep's mask from device ops with static shapes (the path of tpu::compile): the slots in
// admission order (choice-major) one-hot by expert [kN, E], their running count per expert (a
// cumsum down the slots), and a slot kept when fewer than C slots of its expert come before it.
Tensor capacity_keep_traced(const Tensor& ids, int64_t num_experts, int64_t cap, const Tensor& like) {
  const int64_t n = ids.size(0), k = ids.size(1), s = n * k;
  const Tensor hot = tpu::to(one_hot(reshape(transpose(ids, 0, 1).contiguous(), Shape{s}), num_experts), DType::i32);
  const Tensor upto = cumsum(hot, 0);  // slots of each expert up to and including this one
  const Tensor before = sum(mul(sub(upto, hot), hot), {-1}, false, DType::i32);  // [kN]
  const Tensor keep = reshape(transpose(reshape(lt(before, cap), Shape{k, n}), 0, 1).contiguous(), Shape{n, k});
  return tpu::to(keep, like.dtype());
}

// Capacity-factor routing's mask [N, k] (1 kept, 0 dropped) of the expert ids [N, k]: each
// expert admits its first C slots, first choices of every token (in token order) before second
// choices, and so on.
Tensor capacity_keep(const Tensor& ids, int64_t num_experts, double factor, const Tensor& like) {
  const int64_t n = ids.size(0), k = ids.size(1);
  const auto cap = static_cast<int64_t>(std::ceil(factor * static_cast<double>(n * k) / static_cast<double>(num_experts)));
  if (ids.is_proxy() || ops::interceptor() != nullptr) return capacity_keep_traced(ids, num_experts, cap, like);
  const std::vector<int64_t> e = ids.to(Device{}).to(DType::i64).contiguous().to_vector<int64_t>();
  std::vector<int64_t> used(static_cast<size_t>(num_experts), 0);
  std::vector<float> keep(e.size(), 0.0f);
  for (int64_t j = 0; j < k; ++j)
    for (int64_t t = 0; t < n; ++t) {
      const auto s = static_cast<size_t>(t * k + j);
      if (used[static_cast<size_t>(e[s])]++ < cap) keep[s] = 1.0f;
    }
  return from_vector(keep, Shape{n, k}).to(like.dtype()).to(like.device());
}

// The one-hot rows of integer ids [.., k] over n classes as f32 [.., k, n] (ops the chip runs,
// where one_hot and its integer sums are host ops).
Tensor moe_hot_rows(const Tensor& ids, int64_t n) { return tpu::to(ops::hot_rows(ids, n), DType::f32); }

}  // namespace

std::pair<Tensor, Tensor> SparseMoE::sigmoid_topk(const Tensor& logits) const {
  const int64_t e = cfg.num_experts, n = logits.size(0);
  const Tensor scores = sigmoid(logits);  // f32
  Tensor choice = scores;
  const auto* router = dynamic_cast<const MoERouter*>(gate.get());
  if (router && router->e_score_correction_bias.defined())
    choice = add(choice, unsqueeze(tpu::to(router->e_score_correction_bias, DType::f32), 0));
  Tensor ids;
  {
    NoGradGuard ng;  // the choice is not differentiated (as in Transformers)
    Tensor c = choice.detach();
    if (cfg.n_group > 1) {
      const int64_t g = cfg.n_group, per = e / g;
      const Tensor best2 = std::get<0>(topk(reshape(c, Shape{n, g, per}), 2));     // [N, G, 2]
      const Tensor group_idx = std::get<1>(topk(sum(best2, {-1}), cfg.topk_group));  // [N, kg]
      const Tensor kept = sum(moe_hot_rows(group_idx, g), {1});                      // [N, G], 0 or 1
      c = mul(c, reshape(expand(unsqueeze(kept, -1), Shape{n, g, per}), Shape{n, e}));  // others score 0
    }
    ids = std::get<1>(topk(c, cfg.top_k));
  }
  // The chosen scores (a gather along dim 1) as a sum against the one-hot rows (exact: one term).
  Tensor w = sum(mul(unsqueeze(scores, 1), moe_hot_rows(ids, e)), {-1});  // [N, k]
  if (cfg.norm_topk_prob) w = div(w, add(sum(w, {-1}, true), 1e-20));
  if (cfg.routed_scaling_factor != 1.0) w = mul(w, cfg.routed_scaling_factor);
  return {w, ids};
}

SparseMoE::Routing SparseMoE::route(const Tensor& x) {
  TPU_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == cfg.hidden,
            "SparseMoE: expected an input with {} features in the last dim, got shape {}", cfg.hidden,
            x.defined() ? x.shape().str() : std::string("undefined"));
  TPU_CHECK(!(is_training() && cfg.router_jitter_noise > 0),
            "SparseMoE: router_jitter_noise = {} (training-time jitter of the router input) is not supported; "
            "set it to 0 to train (evaluation ignores it)", cfg.router_jitter_noise);
  Routing r;
  // The router in f32 whatever the model's dtype (its decisions are sensitive to rounding).
  r.logits = (*gate)(tpu::to(reshape(x, Shape{-1, cfg.hidden}), DType::f32));
  Tensor w, ids;
  if (cfg.sigmoid_routing) {
    std::tie(w, ids) = sigmoid_topk(r.logits);
  } else {
    std::tie(w, ids) = topk(softmax(r.logits, -1), cfg.top_k);
    if (cfg.norm_topk_prob) w = div(w, sum(w, {-1}, true));
  }
  if (is_training() && cfg.capacity_factor > 0) w = mul(w, capacity_keep(ids, cfg.num_experts, cfg.capacity_factor, w));
  r.weights = tpu::to(w, x.dtype());
  r.experts = ids;
  return r;
}

Tensor SparseMoE::forward(const Tensor& x) {
  const Routing r = route(x);
  router_logits = r.logits;
  const Tensor flat = reshape(x, Shape{-1, cfg.hidden});
  auto [order, counts] = moe_sort(r.experts, cfg.num_experts);
  const Tensor xs = moe_permute(flat, order, cfg.top_k);
  const Tensor ys = run_experts ? run_experts(xs, counts)
                                : experts->call({xs, counts}, [&](std::span<const Tensor> in) {
                                    return experts->forward(in[0], in[1]);
                                  });
  Tensor out = reshape(moe_unpermute(ys, order, r.weights, cfg.top_k), x.shape());
  if (shared_experts) out = add(out, (*shared_experts)(x));
  return out;
}

}  // namespace tpu::nn

namespace tpu::nn {

Tensor load_balancing_loss(const std::vector<Tensor>& router_logits, int64_t num_experts, int64_t top_k) {
  TPU_CHECK(!router_logits.empty(), "load_balancing_loss: no router logits (run a forward of a model with "
            "mixture-of-experts layers first)");
  for (const Tensor& l : router_logits)
    TPU_CHECK(l.defined() && l.dim() == 2 && l.size(1) == num_experts,
              "load_balancing_loss: router logits must be [tokens, {}], got {}", num_experts,
              l.defined() ? l.shape().str() : std::string("undefined"));
  const Tensor logits = tpu::to(router_logits.size() == 1 ? router_logits[0] : cat(router_logits, 0), DType::f32);
  const Tensor p = softmax(logits, -1);
  Tensor chosen;
  {
    NoGradGuard ng;
    chosen = moe_hot_rows(std::get<1>(topk(p, top_k)), num_experts);  // [N, k, E]
  }
  const Tensor tokens_per_expert = mean(chosen, {0});   // [k, E]
  const Tensor prob_per_expert = mean(p, {0}, true);     // [1, E]
  return mul(sum(mul(tokens_per_expert, prob_per_expert)), static_cast<double>(num_experts));
}

Tensor router_z_loss(const std::vector<Tensor>& router_logits) {
  TPU_CHECK(!router_logits.empty(), "router_z_loss: no router logits (run a forward of a model with "
            "mixture-of-experts layers first)");
  for (const Tensor& l : router_logits)
    TPU_CHECK(l.defined() && l.dim() == 2, "router_z_loss: router logits must be [tokens, experts], got {}",
              l.defined() ? l.shape().str() : std::string("undefined"));
  const Tensor logits = tpu::to(router_logits.size() == 1 ? router_logits[0] : cat(router_logits, 0), DType::f32);
  const Tensor z = logsumexp(logits, {-1});  // [N]
  return mean(mul(z, z));
}

}  // namespace tpu::nn
