// Expert parallelism (nn::parallel::expert_parallel) on a tiny Qwen3-MoE-shaped models::CausalLM:
// the experts of every sparse block split over the "ep" axis of a mesh, the whole model fully
// sharded over its "dp" axis (EP x FSDP), every rank training on its own rows of the global
// batch with AdamW and a router z-loss; against the same model trained in one process on the
// whole batch (no parallel code there): losses, first-step gradients and final weights.
#include "model.h"
#include "tpucore/models.h"
#include "tpucore/nn/parallel/expert_parallel.h"
#include "tpucore/nn/parallel/fsdp.h"
#include "tpucore/nn/parallel/parallelize.h"

namespace sharded_test {

using namespace tpu::nn::parallel;

namespace {

constexpr int64_t kEpExperts = 4, kEpVocab = 32;

std::shared_ptr<models::CausalLM> make_moe_lm() {
  auto c = models::ModelConfig::from_json(
      R"({"model_type": "qwen3_moe", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
          "moe_intermediate_size": 8, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "router_aux_loss_coef": 0.0,
          "router_z_loss_coef": 0.01, "tie_word_embeddings": false})");
  Generator g(23);
  return std::make_shared<models::CausalLM>(c, &g);
}

// The part of a one-process tensor rank (ep, dp) holds: its experts' rows, then its FSDP rows.
Tensor ep_part(const std::string& name, const Tensor& full, int ep_rank, int ep, int dp_rank, int dp) {
  Tensor t = full;
  if (name.find(".experts.") != std::string::npos) {
    const int64_t k = full.size(0) / ep;
    t = narrow(full, 0, ep_rank * k, k).contiguous();
  }
  return dp > 1 ? my_rows(t, dp_rank, dp).contiguous() : t;
}

// Cross-entropy plus the z-loss term of models::router_aux_loss (a mean over the tokens, so the
// mean of the ranks' losses is the loss of the whole batch).
Tensor ep_loss(models::CausalLM& lm, const Tensor& ids, const Tensor& tgt) {
  Tensor logits = lm(ids);
  return add(lm_loss(logits, tgt), models::router_aux_loss(lm));
}

}  // namespace

// world = dp x ep ranks; rank (dp_rank, ep_rank) trains on batch rows [r b, (r + 1) b) with r
// its world rank and b = kBatch / world. With `plan`, the blocks are made expert-parallel by
// parallelize_module's ExpertParallel style instead of expert_parallel on the whole model.
int scenario_ep_train(int ep, bool plan) {
  const int world = dist::get_world_size(), dp = world / ep;
  const int steps = 3;
  const int64_t rows = kBatch / world;
  // The one-process reference.
  std::vector<double> ref_losses;
  std::map<std::string, Tensor> ref_grads;
  nn::StateDict ref_final;
  {
    auto lm = make_moe_lm();
    auto opt = make_opt("adamw", lm->parameters());
    for (int s = 0; s < steps; ++s) {
      Tensor tok = batch_tokens(s, kBatch, kSeq, kEpVocab);
      Tensor loss = ep_loss(*lm, narrow(tok, 1, 0, kSeq).contiguous(), narrow(tok, 1, 1, kSeq).contiguous());
      loss.backward();
      ref_losses.push_back(loss.item<double>());
      if (s == 0)
        for (auto& [n, p] : lm->named_parameters()) ref_grads[n] = p.grad().clone();
      opt->step();
      opt->zero_grad();
    }
    ref_final = lm->state_dict();
  }
  dist::DeviceMesh mesh({dp, ep}, {"dp", "ep"});
  const int dp_rank = mesh.coordinate()[0], ep_rank = mesh.coordinate()[1];
  auto lm = make_moe_lm();
  if (plan) parallelize_module(*lm, mesh.group("ep"), {{"model.layers.*.mlp", ExpertParallel()}});
  else check(expert_parallel(*lm, mesh.group("ep")) == 2, "both sparse blocks are expert-parallel");
  check(lm->model->layers[0]->moe->experts->gate_up_proj.size(0) == kEpExperts / ep, "experts split over ep");
  std::shared_ptr<FSDPModule> root;
  if (dp > 1) {
    FSDPOptions o;
    o.mesh_axis = "dp";
    for (auto& l : lm->model->layers) fully_shard(l, mesh, o);
    root = fully_shard(lm, mesh, o);
  }
  auto opt = make_opt("adamw", lm->parameters());
  for (int step = 0; step < steps; ++step) {
    Tensor tok = narrow(batch_tokens(step, kBatch, kSeq, kEpVocab), 0, dist::get_rank() * rows, rows);
    Tensor loss = ep_loss(*lm, narrow(tok, 1, 0, kSeq).contiguous(), narrow(tok, 1, 1, kSeq).contiguous());
    loss.backward();
    sync_replicated_gradients(*lm, mesh.group("ep"));
    Tensor l = loss.detach().clone();
    dist::all_reduce(l, dist::ReduceOp::avg);
    const double want = ref_losses[static_cast<size_t>(step)];
    check(std::fabs(l.item<double>() - want) <= 1e-5 * std::max(1.0, std::fabs(want)),
          fmt::format("step {} loss {} vs reference {}", step, l.item<double>(), want));
    if (step == 0)
      check_step0_grads(*lm, [&](const std::string& n) { return ep_part(n, ref_grads.at(n), ep_rank, ep, dp_rank, dp); });
    opt->step();
    opt->zero_grad();
  }
  check_final_params(final_params(root, *lm), ref_final,
                     [&](const std::string& n, const Tensor& w) { return ep_part(n, w, ep_rank, ep, 0, 1); });
  // Bad input: experts that do not split over the group.
  if (ep > 1) {
    nn::MoEConfig mc;
    mc.hidden = 8;
    mc.intermediate = 4;
    mc.num_experts = 3;
    nn::SparseMoE odd(mc);
    check_error([&] { expert_parallel(odd, mesh.group("ep")); }, "do not split evenly", "3 experts over 2 ranks");
    check_error([&] { expert_parallel(*lm->model->layers[0]->moe, mesh.group("ep")); }, "already distributed",
                "a block made expert-parallel twice");
    check_error([&] { parallelize_module(*lm, mesh.group("ep"), {{"model.layers.*.self_attn", ExpertParallel()}}); },
                "needs a SparseMoE", "the ExpertParallel style on an attention");
  }
  return 0;
}

}  // namespace sharded_test
