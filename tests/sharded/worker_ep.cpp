// Expert parallelism (nn::parallel::expert_parallel) on a tiny Qwen3-MoE-shaped models::CausalLM:
// the experts of every sparse block split over the "ep" axis of a mesh, the whole model fully
// sharded over its "dp" axis (EP x FSDP), every rank training on its own rows of the global
// batch with AdamW, the load-balancing loss over the whole batch and a router z-loss; against
// the same model trained in one process on the whole batch (no parallel code there): losses,
// first-step gradients and final weights.
// EP x TP: the experts split over the "ep" axis of a 2-D mesh, attention and the dense MLP of a
// qwen3_moe model with a dense layer (mlp_only_layers) tensor-parallel over its "tp" axis.
#include <algorithm>

#include "model.h"
#include "tpucore/compile.h"
#include "tpucore/models.h"
#include "tpucore/nn/parallel/expert_parallel.h"
#include "tpucore/nn/parallel/fsdp.h"
#include "tpucore/nn/parallel/parallelize.h"

namespace sharded_test {

using namespace tpu::nn::parallel;

namespace {

constexpr int64_t kEpExperts = 4, kEpVocab = 32;

// With `dense_layer`, layer 1 keeps a dense MLP (mlp_only_layers) for the tensor-parallel plan.
std::shared_ptr<models::CausalLM> make_moe_lm(bool dense_layer = false) {
  auto c = models::ModelConfig::from_json(fmt::format(
      R"({{"model_type": "qwen3_moe", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
          "moe_intermediate_size": 8, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "router_aux_loss_coef": 0.05,
          "router_z_loss_coef": 0.01, "tie_word_embeddings": false, "mlp_only_layers": [{}]}})",
      dense_layer ? "1" : ""));
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

// Cross-entropy plus models::router_aux_loss (load balancing and z-loss). With `group` (the
// ranks holding distinct tokens), the load-balancing term over the group's whole batch
// (nn::parallel::load_balancing_loss) and the z-loss as it is (a mean over the tokens, so the
// mean of the ranks' losses is the loss of the whole batch).
Tensor ep_loss(models::CausalLM& lm, const Tensor& ids, const Tensor& tgt, const dist::ProcessGroupPtr& group = nullptr) {
  Tensor ce = lm_loss(lm(ids), tgt);
  if (!group) return add(ce, models::router_aux_loss(lm));
  std::vector<Tensor> logits;
  for (const auto& l : lm.model->layers)
    if (l->moe) logits.push_back(l->moe->router_logits);
  Tensor aux = mul(load_balancing_loss(lm, group), lm.config.router_aux_loss_coef);
  return add(ce, add(aux, mul(nn::router_z_loss(logits), lm.config.router_z_loss_coef)));
}

// The one-process reference of the MoE model: AdamW on the whole batch.
struct EpReference {
  std::vector<double> losses;
  std::map<std::string, Tensor> grads0;
  nn::StateDict final_params;
};

EpReference ep_reference(int steps, bool dense_layer) {
  EpReference ref;
  auto lm = make_moe_lm(dense_layer);
  auto opt = make_opt("adamw", lm->parameters());
  for (int s = 0; s < steps; ++s) {
    Tensor tok = batch_tokens(s, kBatch, kSeq, kEpVocab);
    Tensor loss = ep_loss(*lm, narrow(tok, 1, 0, kSeq).contiguous(), narrow(tok, 1, 1, kSeq).contiguous());
    loss.backward();
    ref.losses.push_back(loss.item<double>());
    if (s == 0)
      for (auto& [n, p] : lm->named_parameters()) ref.grads0[n] = p.grad().clone();
    opt->step();
    opt->zero_grad();
  }
  ref.final_params = lm->state_dict();
  return ref;
}

// The part of a one-process tensor the rank at (ep_rank, tp_rank) holds: its experts, or its
// Megatron slice of an attention / dense MLP projection, or the whole tensor.
// With `expert_tp`, an expert's intermediate dimension F is split over tp too.
Tensor ep_tp_part(const std::string& name, const Tensor& full, int ep_rank, int ep, int tp_rank, int tp,
                  bool expert_tp) {
  if (name.find(".experts.") != std::string::npos) {
    const int64_t k = full.size(0) / ep;
    Tensor mine = narrow(full, 0, ep_rank * k, k);
    if (!expert_tp) return mine.contiguous();
    if (name.ends_with("down_proj")) {  // [E, H, F]: columns
      const int64_t c = mine.size(2) / tp;
      return narrow(mine, 2, tp_rank * c, c).contiguous();
    }
    const int64_t f = mine.size(1) / 2, c = f / tp;  // [E, 2F, H]: gate rows, then up rows
    return cat({narrow(mine, 1, tp_rank * c, c), narrow(mine, 1, f + tp_rank * c, c)}, 1).contiguous();
  }
  int dim = -1;
  for (const char* s : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight",
                        "lm_head.weight"})
    if (name.ends_with(s)) dim = 0;
  for (const char* s : {"o_proj.weight", "down_proj.weight"})
    if (name.ends_with(s)) dim = 1;
  if (dim < 0) return full;
  const int64_t k = full.size(dim) / tp;
  return narrow(full, dim, tp_rank * k, k).contiguous();
}

}  // namespace

// EP x TP on an ep x tp mesh: rank (ep_rank, tp_rank) trains on batch rows [ep_rank b,
// (ep_rank + 1) b), b = kBatch / ep (the tp group shares its rows); the experts of the sparse
// layer split over "ep" (each tp rank of an ep line holds the same experts), attention, the
// dense MLP and the head tensor-parallel over "tp" (causal_lm_plan); with `expert_tp`, each
// expert's intermediate dimension is split over "tp" as well (expert_tensor_parallel).
int ep_tp_train_once(int ep, bool expert_tp, const EpReference& ref);

int scenario_ep_tp_train(int ep) {
  const EpReference ref = ep_reference(3, true);
  ep_tp_train_once(ep, false, ref);
  return ep_tp_train_once(ep, true, ref);
}

int ep_tp_train_once(int ep, bool expert_tp, const EpReference& ref) {
  const int world = dist::get_world_size(), tp = world / ep;
  const int steps = 3;
  const int64_t rows = kBatch / ep;
  dist::DeviceMesh mesh({ep, tp}, {"ep", "tp"});
  const int ep_rank = mesh.coordinate()[0], tp_rank = mesh.coordinate()[1];
  auto lm = make_moe_lm(true);
  check(lm->model->layers[0]->moe != nullptr && lm->model->layers[1]->mlp != nullptr, "a sparse and a dense layer");
  parallelize_module(*lm, mesh.group("tp"), causal_lm_plan(*lm));
  check(expert_parallel(*lm, mesh.group("ep")) == 1, "the sparse block is expert-parallel");
  if (expert_tp) {
    expert_tensor_parallel(*lm->model->layers[0]->moe, mesh.group("tp"));
    check(lm->model->layers[0]->moe->experts->down_proj.size(2) == 8 / tp, "expert intermediate split over tp");
    check_error([&] { expert_tensor_parallel(*lm->model->layers[0]->moe, mesh.group("tp")); }, "already split",
                "expert tensor parallelism applied twice");
    nn::MoEConfig mc;
    mc.hidden = 8;
    mc.intermediate = 3;
    mc.num_experts = 2;
    nn::SparseMoE odd(mc);
    check_error([&] { expert_tensor_parallel(odd, mesh.group("tp")); }, "intermediate size 3 does not split",
                "an expert intermediate size of 3 over 2 tp ranks");
  }
  check(lm->model->layers[0]->self_attn->q_proj->weight.size(0) == 32 / tp, "q_proj rows split over tp");
  check(lm->model->layers[0]->moe->experts->gate_up_proj.size(0) == kEpExperts / ep, "experts split over ep");
  {
    // An all-sparse model: the plan holds no dense MLP patterns; sequence parallelism is refused.
    auto sparse = make_moe_lm(false);
    const ParallelPlan p = causal_lm_plan(*sparse);
    check(std::none_of(p.begin(), p.end(), [](const auto& e) { return e.first.find("gate_proj") != std::string::npos; }),
          "no dense MLP in the plan of an all-sparse model");
    parallelize_module(*sparse, mesh.group("tp"), p);
    check_error([&] { causal_lm_plan(*sparse, true); }, "sequence parallelism of a model with mixture-of-experts",
                "sequence parallelism with sparse blocks");
  }
  auto opt = make_opt("adamw", lm->parameters());
  for (int step = 0; step < steps; ++step) {
    Tensor tok = narrow(batch_tokens(step, kBatch, kSeq, kEpVocab), 0, ep_rank * rows, rows);
    Tensor loss = ep_loss(*lm, narrow(tok, 1, 0, kSeq).contiguous(), narrow(tok, 1, 1, kSeq).contiguous(),
                          mesh.group("ep"));
    loss.backward();
    // Everything but the experts is replicated over "ep" (the tp slices alike): average it.
    sync_replicated_gradients(*lm, mesh.group("ep"));
    Tensor l = loss.detach().clone();
    dist::all_reduce(l, dist::ReduceOp::avg);
    const double want = ref.losses[static_cast<size_t>(step)];
    check(std::fabs(l.item<double>() - want) <= 1e-5 * std::max(1.0, std::fabs(want)),
          fmt::format("expert tp {}: step {} loss {} vs reference {}", expert_tp, step, l.item<double>(), want));
    if (step == 0)
      check_step0_grads(*lm, [&](const std::string& n) { return ep_tp_part(n, ref.grads0.at(n), ep_rank, ep, tp_rank, tp, expert_tp); });
    opt->step();
    opt->zero_grad();
  }
  check_final_params(final_params(nullptr, *lm), ref.final_params,
                     [&](const std::string& n, const Tensor& w) { return ep_tp_part(n, w, ep_rank, ep, tp_rank, tp, expert_tp); });
  return 0;
}

// world = dp x ep ranks; rank (dp_rank, ep_rank) trains on batch rows [r b, (r + 1) b) with r
// its world rank and b = kBatch / world. With `plan`, the blocks are made expert-parallel by
// parallelize_module's ExpertParallel style instead of expert_parallel on the whole model. With
// `compiled`, the whole step (zero_grad, forward, the group's losses, backward, the gradient
// sync, AdamW) is one tpu::compile graph (the fixed-capacity exchange), compiled once: every
// step routes other tokens without a recompile.
int scenario_ep_train(int ep, bool plan, bool compiled) {
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
  auto train_step = [&](const Tensor& ids, const Tensor& tgt) {
    opt->zero_grad();
    Tensor loss = ep_loss(*lm, ids, tgt, dist::world());
    loss.backward();
    sync_replicated_gradients(*lm, mesh.group("ep"));
    opt->step();
    return loss;
  };
  const std::string fn_name = "ep_train_step_" + std::to_string(dist::get_rank());
  auto compiled_step = compile(train_step, {.name = fn_name, .fullgraph = true});
  for (int step = 0; step < steps; ++step) {
    Tensor tok = narrow(batch_tokens(step, kBatch, kSeq, kEpVocab), 0, dist::get_rank() * rows, rows);
    const Tensor ids = narrow(tok, 1, 0, kSeq).contiguous(), tgt = narrow(tok, 1, 1, kSeq).contiguous();
    Tensor loss;
    if (compiled) {
      loss = compiled_step(ids, tgt);
    } else {
      loss = ep_loss(*lm, ids, tgt, dist::world());
      loss.backward();
      sync_replicated_gradients(*lm, mesh.group("ep"));
    }
    Tensor l = loss.detach().clone();
    dist::all_reduce(l, dist::ReduceOp::avg);
    const double want = ref_losses[static_cast<size_t>(step)];
    check(std::fabs(l.item<double>() - want) <= 1e-5 * std::max(1.0, std::fabs(want)),
          fmt::format("step {} loss {} vs reference {}", step, l.item<double>(), want));
    if (step == 0)
      check_step0_grads(*lm, [&](const std::string& n) { return ep_part(n, ref_grads.at(n), ep_rank, ep, dp_rank, dp); });
    if (!compiled) {
      opt->step();
      opt->zero_grad();
    }
  }
  check_final_params(final_params(root, *lm), ref_final,
                     [&](const std::string& n, const Tensor& w) { return ep_part(n, w, ep_rank, ep, 0, 1); });
  if (compiled) {
    const jit::Stats st = jit::stats();
    const jit::FunctionStats* fs = st.find(fn_name);
    check(fs != nullptr && fs->compiles == 1 && fs->hits == steps - 1 && fs->breaks == 0,
          fmt::format("one compile for {} steps of new routings: {} compiles, {} hits, {} breaks", steps,
                      fs ? fs->compiles : -1, fs ? fs->hits : -1, fs ? fs->breaks : -1));
    std::string graph;
    for (const std::string& g : compiled_step.graphs()) graph += g;
    check(graph.find("dist_all_to_all(") != std::string::npos, "the compiled step holds the all-to-alls");
    return 0;
  }
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
    check_error([&] { load_balancing_loss(std::vector<Tensor>{}, 4, 2, mesh.group("ep")); }, "no router logits",
                "the group load-balancing loss without router logits");
    check_error([&] { load_balancing_loss(*lm->model->layers[0]->self_attn, mesh.group("ep")); },
                "no mixture-of-experts", "the group load-balancing loss of a module without sparse blocks");
  }
  return 0;
}

}  // namespace sharded_test
