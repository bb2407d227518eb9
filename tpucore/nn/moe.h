/// @file
/// Sparse mixture-of-experts blocks (Mixtral, Qwen3-MoE, DeepSeek-V3): a router picks the top-k of E gated
/// (SwiGLU) expert MLPs for every token, and the token's output is the routing-weighted sum of
/// their outputs. Routing is dropless: every token reaches all of its k experts, whatever the
/// load. The experts' weights are stacked ([E, 2F, H] gate and up projections, [E, H, F] down
/// projections, each expert's matrices as its Linear layers store them) so that one
/// grouped_matmul over the tokens sorted by expert computes every expert at once; the group
/// sizes are a tensor read when the op runs, so a new routing changes no shape (no recompile
/// under tpu::compile).
#pragma once

#include <functional>
#include <string>

#include "tpucore/moe_ops.h"
#include "tpucore/nn/layers.h"
#include "tpucore/nn/transformer.h"

namespace tpu::nn {

/// The shape and routing options of a SparseMoE block.
struct MoEConfig {
  int64_t hidden = 0;          ///< model width H
  int64_t intermediate = 0;    ///< each expert's MLP width F
  int64_t num_experts = 0;     ///< E
  int64_t top_k = 2;           ///< experts per token
  bool norm_topk_prob = true;  ///< renormalize the k chosen probabilities to sum to one (Mixtral always)
  std::string act = "silu";    ///< the experts' activation (an nn::activation name)
  /// Training only: Mixtral's multiplicative jitter of the router input. Not implemented: a
  /// non-zero value is a tpu::Error when the block runs in training mode (eval ignores it, as
  /// Transformers does).
  double router_jitter_noise = 0;
  /// Training only: capacity-factor routing (Switch Transformers). 0 (the default): dropless.
  /// A positive value gives every expert room for C = ceil(capacity_factor * N * top_k / E) of
  /// the N * top_k routed slots of a forward; slots are admitted first choices first (all
  /// tokens' first choices in token order, then their second choices, ...), and a slot over its
  /// expert's capacity is dropped: its routing weight becomes 0 (weights renormalized before the
  /// drop), so the token's output lacks that expert's term (the residual carries it). Evaluation
  /// is dropless. Eagerly and inside tpu::compile (there the admission is computed on the
  /// device with static shapes, so a new routing does not recompile).
  double capacity_factor = 0;
  /// DeepSeek-V3 routing: scores sigmoid(logits) instead of the softmax; the choice adds the
  /// router's e_score_correction_bias to the scores, keeps the topk_group best of n_group expert
  /// groups (a group's score: the sum of its two best choice scores; experts of the other groups
  /// score 0), takes the top-k choices; the weights are the chosen experts' scores without the
  /// bias, renormalized (denominator + 1e-20) when norm_topk_prob, times routed_scaling_factor.
  bool sigmoid_routing = false;
  int64_t n_group = 1;                 ///< expert groups (sigmoid routing)
  int64_t topk_group = 1;              ///< groups kept per token (sigmoid routing)
  double routed_scaling_factor = 1.0;  ///< multiplies the routing weights
  /// Width of the shared experts' one gated MLP added to every token's output (0: none).
  int64_t shared_intermediate = 0;
};

/// The router of a SparseMoE block: gate.weight [E, H] and, with sigmoid routing, the
/// e_score_correction_bias [E] (a parameter without gradient: it is set by the load balancing of
/// the checkpoint's training, not learned by backpropagation).
class MoERouter : public Linear {
 public:
  /// The router H -> E; `correction_bias` adds e_score_correction_bias (zeros).
  MoERouter(int64_t hidden, int64_t experts, bool correction_bias, Generator* gen = nullptr);
  /// "MoERouter".
  std::string type_name() const override { return "MoERouter"; }
  Tensor e_score_correction_bias;  ///< [E] (undefined without it)
};

/// The experts of a SparseMoE block, stacked: gate_up_proj [E, 2F, H] (rows [0, F) of expert e
/// are its gate projection, rows [F, 2F) its up projection), down_proj [E, H, F].
class MoEExperts : public Module {
 public:
  /// Weights initialised as the experts' Linear layers would be (from `gen`).
  MoEExperts(const MoEConfig& c, Generator* gen = nullptr);
  /// xs [S, H] rows sorted by expert, group_sizes [E] (moe_sort's) -> [S, H]:
  /// down(act(gate(x)) * up(x)) with each row's expert.
  Tensor forward(const Tensor& xs, const Tensor& group_sizes);
  using Module::forward;
  /// "MoEExperts".
  std::string type_name() const override { return "MoEExperts"; }
  Tensor gate_up_proj;  ///< [E, 2F, H]
  Tensor down_proj;     ///< [E, H, F]
  std::shared_ptr<Module> act;  ///< the activation of the gate

 private:
  int64_t intermediate_;
};

/// The sparse MoE block: router (in f32), softmax over the experts, top-k, optional
/// renormalization, dropless dispatch through moe_sort / moe_permute, the stacked experts, and
/// the weighted combine (moe_unpermute). Parameter names as Transformers' fused layout:
/// gate.weight [E, H], experts.gate_up_proj, experts.down_proj.
class SparseMoE : public Module {
 public:
  /// The block of `c`, initialised from `gen`.
  explicit SparseMoE(MoEConfig c, Generator* gen = nullptr);
  /// x [..., H] -> [..., H].
  Tensor forward(const Tensor& x) override;
  /// The routing of the N tokens of an input.
  struct Routing {
    Tensor logits;   ///< router logits [N, E], f32
    Tensor weights;  ///< the k routing weights of each token [N, k], in the input's dtype
    Tensor experts;  ///< the k expert ids of each token [N, k], i64
  };
  /// The routing of x [..., H] (softmax over the router logits, top-k, renormalized when
  /// norm_topk_prob; in training with a capacity_factor, the weights of dropped slots zeroed).
  Routing route(const Tensor& x);
  /// Sigmoid routing (MoEConfig::sigmoid_routing) of router logits [N, E] f32: the weights
  /// [N, k] f32 and the expert ids [N, k].
  std::pair<Tensor, Tensor> sigmoid_topk(const Tensor& logits) const;
  /// "SparseMoE".
  std::string type_name() const override { return "SparseMoE"; }
  MoEConfig cfg;                     ///< the configuration
  std::shared_ptr<Linear> gate;      ///< the router: H -> E, no bias
  /// The router logits [N, E] (f32) of the last forward, for the load-balancing loss (inside a
  /// compiled function: of the traced forward, to be used in the same function).
  Tensor router_logits;
  std::shared_ptr<MoEExperts> experts;  ///< the stacked experts
  std::shared_ptr<GatedMLP> shared_experts;  ///< DeepSeek's shared experts (null without them)
  /// Runs the experts on the routed slots sorted by expert: xs [S, H] and group_sizes [E] ->
  /// [S, H] in the same order. Unset (the default): this block's `experts`. Expert parallelism
  /// (nn::parallel::expert_parallel) sets it to send each slot to the rank owning its expert.
  std::function<Tensor(const Tensor& xs, const Tensor& group_sizes)> run_experts;
};

/// The load-balancing loss of Switch Transformers as Transformers computes it for Mixtral and
/// Qwen3-MoE (load_balancing_loss_func without an attention mask): with the router logits of
/// every sparse layer concatenated [N, E], p = softmax(logits) and m [N, k, E] the one-hot top-k
/// choices, E * sum_{j, e} mean_n m[n, j, e] * mean_n p[n, e]. Differentiable in the logits
/// (through the mean probabilities; the choices are constants). Empty list: an error.
Tensor load_balancing_loss(const std::vector<Tensor>& router_logits, int64_t num_experts, int64_t top_k);

/// The router z-loss of ST-MoE (Zoph et al. 2022), which keeps the router logits small: with
/// the router logits of every sparse layer concatenated [N, E], the mean over the N tokens of
/// logsumexp_e(logits[n, e])^2, in f32. Differentiable in the logits. Empty list: an error.
Tensor router_z_loss(const std::vector<Tensor>& router_logits);

}  // namespace tpu::nn
