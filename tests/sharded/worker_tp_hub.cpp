// Tensor parallelism applied from outside to the Hub model family: a Qwen3-shaped
// models::CausalLM (from a config.json text) parallelized by nn::parallel::causal_lm_plan, with
// or without sequence parallelism, and on a 2-D mesh also fully sharded over "dp"; trained
// against the same model trained in one process on the whole batch (no parallel code there).
// With `mla`, a DeepSeek-V3-shaped model (multi-head latent attention with low-rank queries, a
// dense first layer, then routed and shared experts left whole) split over its heads.
#include "model.h"
#include "tpucore/models.h"
#include "tpucore/nn/parallel/fsdp.h"
#include "tpucore/nn/parallel/parallelize.h"

namespace sharded_test {

using namespace tpu::nn::parallel;

namespace {

models::ModelConfig hub_config(bool tied, bool mla) {
  if (mla)
    return models::ModelConfig::from_json(fmt::format(
        R"({{"model_type": "deepseek_v3", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
            "moe_intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
            "q_lora_rank": 10, "kv_lora_rank": 12, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 6,
            "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
            "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
            "rope_interleave": true, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": {}}})",
        tied ? "true" : "false"));
  return models::ModelConfig::from_json(fmt::format(
      R"({{"model_type": "qwen3", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": {}}})",
      tied ? "true" : "false"));
}

std::shared_ptr<models::CausalLM> make_lm(bool tied, bool mla) {
  Generator g(11);
  return std::make_shared<models::CausalLM>(hub_config(tied, mla), &g);
}

// The part of a reference tensor that tensor-parallel rank r of n holds (Megatron layout by
// name: column-parallel rows, row-parallel columns, the rest whole).
Tensor hub_part(const std::string& name, const Tensor& full, int r, int n) {
  int dim = -1;
  if (name.find("experts") != std::string::npos) return full;  // sparse blocks stay whole
  for (const char* s : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight",
                        "lm_head.weight", "q_b_proj.weight", "kv_b_proj.weight"})
    if (name.ends_with(s)) dim = 0;
  for (const char* s : {"o_proj.weight", "down_proj.weight"})
    if (name.ends_with(s)) dim = 1;
  if (dim < 0) return full;
  const int64_t k = full.size(dim) / n;
  return narrow(full, dim, r * k, k).contiguous();
}

struct HubReference {
  std::vector<double> losses;
  std::map<std::string, Tensor> grads0;
  nn::StateDict final_params;
};

// The trained parameters (DeepSeek-V3's routing correction bias is a parameter without gradient).
std::vector<Tensor> hub_trained(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

HubReference train_hub_reference(bool tied, bool mla, int steps, int64_t vocab) {
  HubReference ref;
  auto lm = make_lm(tied, mla);
  auto opt = make_opt("adamw", hub_trained(*lm));
  for (int s = 0; s < steps; ++s) {
    Tensor tok = batch_tokens(s, kBatch, kSeq, vocab);
    Tensor ids = narrow(tok, 1, 0, kSeq).contiguous(), tgt = narrow(tok, 1, 1, kSeq).contiguous();
    Tensor loss = lm_loss(lm->forward(ids), tgt);
    loss.backward();
    ref.losses.push_back(loss.item<double>());
    if (s == 0)
      for (auto& [n, p] : lm->named_parameters())
        if (p.requires_grad()) ref.grads0[n] = p.grad().clone();
    opt->step();
    opt->zero_grad();
  }
  ref.final_params = lm->state_dict();
  return ref;
}

}  // namespace

// argv: tensor-parallel size, sequence parallelism, tied embeddings; world / tp ranks along
// "dp" fully shard the tensor-parallel model (each decoder layer a unit, the rest the root).
int scenario_tp_hub(int tp, bool sequence, bool tied, bool mla) {
  const int world = dist::get_world_size();
  const int dp = world / tp;
  const int steps = 3;
  const int64_t vocab = 32;
  HubReference ref = train_hub_reference(tied, mla, steps, vocab);
  dist::DeviceMesh mesh({dp, tp}, {"dp", "tp"});
  const int dp_rank = mesh.coordinate()[0], tp_rank = mesh.coordinate()[1];
  auto lm = make_lm(tied, mla);
  parallelize_module(*lm, mesh.group("tp"), causal_lm_plan(*lm, sequence));
  if (mla)
    check(lm->model->layers[0]->mla->q_b_proj->weight.size(0) == 32 / tp &&
              lm->model->layers[0]->mla->kv_b_proj->weight.size(0) == 40 / tp &&
              lm->model->layers[0]->mla->kv_a_proj_with_mqa->weight.size(0) == 16,
          "MLA: q_b_proj and kv_b_proj rows split over tp, the latent projection whole");
  else
    check(lm->model->layers[0]->self_attn->q_proj->weight.size(0) == 32 / tp, "q_proj rows split over tp");
  std::shared_ptr<FSDPModule> root;
  if (dp > 1) {
    FSDPOptions o;
    o.mesh_axis = "dp";
    for (auto& l : lm->model->layers) fully_shard(l, mesh, o);
    root = fully_shard(lm, mesh, o);
  }
  auto opt = make_opt("adamw", hub_trained(*lm));
  for (int step = 0; step < steps; ++step) {
    Tensor tok = batch_tokens(step, kBatch, kSeq, vocab);
    Tensor mine = narrow(tok, 0, dp_rank * (kBatch / dp), kBatch / dp);
    Tensor ids = narrow(mine, 1, 0, kSeq).contiguous(), tgt = narrow(mine, 1, 1, kSeq).contiguous();
    Tensor logits = (*lm)(ids);  // the model as it is: the plan's and fully_shard's hooks do the rest
    check(logits.size(-1) == vocab && logits.size(1) == kSeq, "logits whole on every rank");
    Tensor loss = lm_loss(logits, tgt);
    loss.backward();
    Tensor l = loss.detach().clone();
    dist::all_reduce(l, dist::ReduceOp::avg);
    const double want = ref.losses[static_cast<size_t>(step)];
    check(std::fabs(l.item<double>() - want) <= 2e-5 * std::max(1.0, std::fabs(want)),
          fmt::format("step {} loss {} vs reference {}", step, l.item<double>(), want));
    auto want_grad = [&](const std::string& n) {
      const Tensor want_g = hub_part(n, ref.grads0.at(n), tp_rank, tp);
      return dp > 1 ? my_rows(want_g, dp_rank, dp) : want_g;
    };
    if (step == 0 && !mla) check_step0_grads(*lm, want_grad);
    if (step == 0 && mla)  // every trained parameter; the routing correction bias has no gradient
      for (auto& [n, p] : lm->named_parameters()) {
        if (!p.requires_grad()) continue;
        const double d = p.grad().defined() ? max_abs_diff(p.grad(), want_grad(n)) : INFINITY;
        check(d <= 1e-5, fmt::format("step 0 gradient of {}: max diff {}", n, d));
      }
    opt->step();
    opt->zero_grad();
  }
  check_final_params(final_params(root, *lm), ref.final_params, [&](const std::string& n, const Tensor& w) { return hub_part(n, w, tp_rank, tp); });
  return 0;
}

}  // namespace sharded_test
