// fully_shard on the sim backend of tpu::dist: four ranks = the four chips of a 2x2 pod of tiny
// chips (TPU_SIM_POD=2x2, TPU_SIM_CHIP=tiny as the other pod tests), one thread per rank, the
// model's shards in each chip's HBM. Compared with the same model trained on the host in one
// process on the whole batch. Expert parallelism (nn::parallel::expert_parallel) of a tiny
// Qwen3-MoE-shaped models::CausalLM over 2 and 4 chips, EP x FSDP and EP x TP over the 2x2 pod,
// EP and EP x FSDP with the whole step inside tpu::compile, and EP x TP x FSDP on a 3-D mesh of 8
// chips (a 2x4 pod: its own CTest entries), against the same model trained on the host in one
// process.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <thread>

#include "sharded/model.h"
#include "ops/fallback.h"
#include "pod/pod_testing.h"
#include "tpucore/compile.h"
#include "tpucore/devices.h"
#include "tpucore/models.h"
#include "tpucore/nn/parallel/expert_parallel.h"
#include "tpucore/nn/parallel/fsdp.h"
#include "tpucore/nn/parallel/parallelize.h"

using namespace sharded_test;

namespace {

const bool g_env = [] {
  setenv("TPU_SIM_CHIP", "tiny", 0);
  setenv("TPU_SIM_POD", "2x2", 0);
  return true;
}();

}  // namespace

TEST_CASE("fsdp on a simulated 4-chip pod equals one-device training", "[pod][sharded]") {
  (void)g_env;
  // The reference trains in f32 on the host: the chips' f32 matmuls take f32-accurate products
  // here (the default, one bf16 pass, differs from it by ~2e-4 in the loss).
  pod_testing::HighestF32Precision precision;
  Config c;
  c.layers = 1;
  const int world = 4, steps = 2;
  // The reference: one model on the host, the whole batch, SGD.
  std::vector<double> ref_loss;
  auto ref = std::make_shared<TinyLM>(c);
  {
    optim::SGD opt(ref->parameters(), optim::SGDOptions{0.2, 0.9});
    for (int s = 0; s < steps; ++s) {
      Tensor tok = batch_tokens(s, kBatch, kSeq, c.vocab);
      Tensor loss = lm_loss(ref->forward(narrow(tok, 1, 0, kSeq).contiguous()), narrow(tok, 1, 1, kSeq).contiguous());
      loss.backward();
      ref_loss.push_back(loss.item<double>());
      opt.step();
      opt.zero_grad();
    }
  }
  auto pg = dist::sim_pod_groups({world});
  std::vector<std::vector<double>> losses(world);
  std::vector<nn::StateDict> finals(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        const Device chip(DeviceType::sim, r);
        auto model = std::make_shared<TinyLM>(c);
        model->to(chip);
        for (auto& b : model->blocks) b = nn::parallel::fully_shard(b, pg[static_cast<size_t>(r)]);
        auto root = nn::parallel::fully_shard(model, pg[static_cast<size_t>(r)]);
        optim::SGD opt(root->parameters(), optim::SGDOptions{0.2, 0.9});
        for (int s = 0; s < steps; ++s) {
          Tensor tok = narrow(batch_tokens(s, kBatch, kSeq, c.vocab), 0, r, 1);
          Tensor loss = lm_loss(root->forward(narrow(tok, 1, 0, kSeq).contiguous().to(chip)),
                                narrow(tok, 1, 1, kSeq).contiguous().to(chip));
          loss.backward();
          losses[static_cast<size_t>(r)].push_back(loss.to(Device()).item<double>());
          opt.step();
          opt.zero_grad();
        }
        finals[static_cast<size_t>(r)] = root->full_state_dict();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[static_cast<size_t>(r)].empty());
  }
  for (int s = 0; s < steps; ++s) {
    double avg = 0;
    for (int r = 0; r < world; ++r) avg += losses[static_cast<size_t>(r)][static_cast<size_t>(s)] / world;
    INFO("step " << s);
    CHECK(std::fabs(avg - ref_loss[static_cast<size_t>(s)]) < 1e-4);
  }
  for (auto& [n, p] : ref->named_parameters()) {
    INFO(n);
    for (int r = 0; r < world; ++r) {
      REQUIRE(finals[static_cast<size_t>(r)].count(n));
      CHECK(max_abs_diff(finals[static_cast<size_t>(r)].at(n).to(Device()), p) < 1e-4);
    }
  }
}

namespace {

std::shared_ptr<models::CausalLM> ep_sim_moe_lm() {
  auto c = models::ModelConfig::from_json(
      R"({"model_type": "qwen3_moe", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
          "moe_intermediate_size": 8, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "router_aux_loss_coef": 0.05,
          "router_z_loss_coef": 0.01, "tie_word_embeddings": false})");
  Generator g(23);
  return std::make_shared<models::CausalLM>(c, &g);
}

// Cross-entropy plus models::router_aux_loss; with `group` (the ranks holding distinct tokens),
// its load-balancing term over the group's whole batch (nn::parallel::load_balancing_loss)
// instead, the z-loss (a mean over the tokens) as it is.
Tensor ep_sim_loss(models::CausalLM& lm, const Tensor& tok, const Device& dev,
                   const dist::ProcessGroupPtr& group = nullptr) {
  Tensor ids = narrow(tok, 1, 0, kSeq).contiguous().to(dev), tgt = narrow(tok, 1, 1, kSeq).contiguous().to(dev);
  Tensor ce = lm_loss(lm(ids), tgt);  // before router_aux_loss, which reads the forward's router logits
  if (!group) return add(ce, models::router_aux_loss(lm));
  std::vector<Tensor> logits;
  for (const auto& l : lm.model->layers) logits.push_back(l->moe->router_logits);
  Tensor aux = mul(nn::parallel::load_balancing_loss(lm, group), lm.config.router_aux_loss_coef);
  return add(ce, add(aux, mul(nn::router_z_loss(logits), lm.config.router_z_loss_coef)));
}

// The part of a one-process tensor the rank at (dp_rank, ep_rank) holds: its experts, then its
// FSDP rows.
Tensor ep_sim_part(const std::string& name, const Tensor& full, int ep_rank, int ep, int dp_rank, int dp) {
  Tensor t = full;
  if (name.find(".experts.") != std::string::npos) t = narrow(full, 0, ep_rank * (full.size(0) / ep), full.size(0) / ep);
  return dp > 1 ? my_rows(t.contiguous(), dp_rank, dp) : t;
}

// The part the rank at (ep_rank, tp_rank) holds under EP x TP: its experts with their
// intermediate dimension split over tp, or its Megatron slice (causal_lm_plan), or all of it.
Tensor ep_sim_tp_part(const std::string& name, const Tensor& full, int ep_rank, int ep, int tp_rank, int tp) {
  if (name.find(".experts.") != std::string::npos) {
    Tensor mine = narrow(full, 0, ep_rank * (full.size(0) / ep), full.size(0) / ep);
    if (name.ends_with("down_proj")) return narrow(mine, 2, tp_rank * (mine.size(2) / tp), mine.size(2) / tp).contiguous();
    const int64_t f = mine.size(1) / 2, c = f / tp;
    return cat({narrow(mine, 1, tp_rank * c, c), narrow(mine, 1, f + tp_rank * c, c)}, 1).contiguous();
  }
  int dim = -1;
  for (const char* sfx : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "lm_head.weight"})
    if (name.ends_with(sfx)) dim = 0;
  if (name.ends_with("o_proj.weight")) dim = 1;
  if (dim < 0) return full;
  return narrow(full, dim, tp_rank * (full.size(dim) / tp), full.size(dim) / tp).contiguous();
}

// The host run every expert-parallel case is checked against: `steps` SGD steps of the whole
// model on the full batch, recording each step's loss and the step-0 gradients.
std::shared_ptr<models::CausalLM> ep_sim_host_training(int steps, std::vector<double>& loss_out,
                                                       std::map<std::string, Tensor>& grads_out) {
  auto ref = ep_sim_moe_lm();
  optim::SGD opt(ref->parameters(), optim::SGDOptions{0.2, 0.9});
  for (int s = 0; s < steps; ++s) {
    Tensor loss = ep_sim_loss(*ref, batch_tokens(s, kBatch, kSeq, 32), Device());
    loss.backward();
    loss_out.push_back(loss.item<double>());
    if (s == 0)
      for (auto& [n, p] : ref->named_parameters()) grads_out[n] = p.grad().clone();
    opt.step();
    opt.zero_grad();
  }
  return ref;
}

// Trains the MoE model with its experts over `ep` chips (world = dp x ep chips of the pod, rank
// r = dp_rank * ep + ep_rank, fully sharded over dp when dp > 1; with `tp`, the outer axis is
// tensor-parallel instead: causal_lm_plan and expert_tensor_parallel over it, its ranks sharing
// their ep line's rows) and checks it against host training: the mean loss of every step (1e-5),
// step-0 gradients (1e-5), final weights (1e-4).
// With `compiled`, every rank's whole step (zero_grad, forward, the group's losses, backward, the
// gradient sync, SGD) is one tpu::compile graph, compiled once for all steps (new routings).
void ep_sim_train(int dp, int ep, bool tp = false, bool compiled = false) {
  pod_testing::HighestF32Precision precision;
  const int world = dp * ep, steps = 2;
  const int64_t rows = tp ? kBatch / ep : kBatch / world;
  auto part = [&](const std::string& n, const Tensor& full, int r, bool sharded) {
    if (tp) return ep_sim_tp_part(n, full, r % ep, ep, r / ep, dp);
    return ep_sim_part(n, full, r % ep, ep, r / ep, sharded ? dp : 1);
  };
  std::vector<double> ref_loss;
  std::map<std::string, Tensor> ref_grads;
  auto ref = ep_sim_host_training(steps, ref_loss, ref_grads);
  auto pods = dist::sim_pod_groups({world});
  std::vector<dist::ProcessGroupPtr> ep_g(static_cast<size_t>(world)), dp_g(static_cast<size_t>(world));
  for (int d = 0; d < dp; ++d) {
    std::vector<int> ranks;
    for (int e = 0; e < ep; ++e) ranks.push_back(d * ep + e);
    auto gs = dist::sim_new_group(pods, ranks);
    for (int e = 0; e < ep; ++e) ep_g[static_cast<size_t>(d * ep + e)] = gs[static_cast<size_t>(e)];
  }
  for (int e = 0; dp > 1 && e < ep; ++e) {
    std::vector<int> ranks;
    for (int d = 0; d < dp; ++d) ranks.push_back(d * ep + e);
    auto gs = dist::sim_new_group(pods, ranks);
    for (int d = 0; d < dp; ++d) dp_g[static_cast<size_t>(d * ep + e)] = gs[static_cast<size_t>(d)];
  }
  std::vector<std::vector<double>> losses(static_cast<size_t>(world));
  std::vector<nn::StateDict> finals(static_cast<size_t>(world));
  std::vector<std::string> bad(static_cast<size_t>(world));
  reset_sim_stats();
  pod_testing::on_ranks(world, [&](int r) {
    const int ep_rank = r % ep;
    const Device chip = pod_testing::chip(r);
    auto lm = ep_sim_moe_lm();
    lm->to(chip);
    pod_testing::expect(nn::parallel::expert_parallel(*lm, ep_g[static_cast<size_t>(r)]) == 2, "two sparse blocks");
    std::shared_ptr<nn::parallel::FSDPModule> root;
    if (tp) {
      nn::parallel::parallelize_module(*lm, dp_g[static_cast<size_t>(r)], nn::parallel::causal_lm_plan(*lm));
      for (auto& l : lm->model->layers) nn::parallel::expert_tensor_parallel(*l->moe, dp_g[static_cast<size_t>(r)]);
    } else if (dp > 1) {
      for (auto& l : lm->model->layers) nn::parallel::fully_shard(l, dp_g[static_cast<size_t>(r)]);
      root = nn::parallel::fully_shard(lm, dp_g[static_cast<size_t>(r)]);
    }
    optim::SGD opt(lm->parameters(), optim::SGDOptions{0.2, 0.9});
    const dist::ProcessGroupPtr& batch_group = tp ? ep_g[static_cast<size_t>(r)] : pods[static_cast<size_t>(r)];
    auto train_step = [&](const Tensor& tok) {
      opt.zero_grad();
      Tensor loss = ep_sim_loss(*lm, tok, chip, batch_group);
      loss.backward();
      nn::parallel::sync_replicated_gradients(*lm, ep_g[static_cast<size_t>(r)]);
      opt.step();
      return loss;
    };
    const std::string fn = "ep_sim_step_" + std::to_string(world) + "_" + std::to_string(r);
    auto step_fn = compile(train_step, {.name = fn, .fullgraph = true});
    auto host_runs = [&] {  // host fallbacks of ops on this rank's chip, by op
      std::map<std::string, uint64_t> n;
      for (const auto& fc : ops::fallback_counts())
        if (fc.device == chip) n[fc.op] += fc.calls;
      return n;
    };
    const std::map<std::string, uint64_t> runs_before = host_runs();
    for (int s = 0; s < steps; ++s) {
      Tensor tok = narrow(batch_tokens(s, kBatch, kSeq, 32), 0, (tp ? ep_rank : r) * rows, rows).contiguous().to(chip);
      Tensor loss;
      if (compiled) {
        loss = step_fn(tok);
      } else {
        loss = ep_sim_loss(*lm, tok, chip, batch_group);
        loss.backward();
        nn::parallel::sync_replicated_gradients(*lm, ep_g[static_cast<size_t>(r)]);
      }
      losses[static_cast<size_t>(r)].push_back(loss.to(Device()).item<double>());
      if (s == 0)
        for (auto& [n, p] : lm->named_parameters()) {
          const double d = p.grad().defined()
                               ? max_abs_diff(p.grad().to(Device()), part(n, ref_grads.at(n), r, true))
                               : INFINITY;
          if (d > 1e-5) bad[static_cast<size_t>(r)] += fmt::format("step-0 gradient of {}: {}; ", n, d);
        }
      if (!compiled) {
        opt.step();
        opt.zero_grad();
      }
    }
    if (compiled) {
      // The compiled step runs on the chip, FSDP's flat-buffer writes and the expert-parallel
      // exchange included; only the cross-entropy loss (its gather/ne/where/sum forward and its
      // one scatter_add along the vocabulary per step) takes the host fallback.
      std::map<std::string, uint64_t> runs = host_runs();
      for (auto& [op, n] : runs_before) runs[op] -= n;
      for (auto& [op, n] : runs) {
        const bool loss_op = op == "gather" || op == "ne" || op == "where" || op == "sum";
        if (n > (op == "scatter_add" ? uint64_t(steps) : loss_op ? uint64_t(4 * steps) : 0))
          bad[static_cast<size_t>(r)] += fmt::format("{} host fallbacks of {}; ", n, op);
      }
      const jit::Stats st = jit::stats();
      const jit::FunctionStats* fs = st.find(fn);
      if (!fs || fs->compiles != 1 || fs->hits != steps - 1 || fs->breaks != 0)
        bad[static_cast<size_t>(r)] += "not one compile for all steps; ";
      std::string graph;
      for (const std::string& gr : step_fn.graphs()) graph += gr;
      if (graph.find("dist_all_to_all(") == std::string::npos) bad[static_cast<size_t>(r)] += "no all-to-all node; ";
    }
    if (root) finals[static_cast<size_t>(r)] = root->full_state_dict();
    else
      for (auto& [n, p] : lm->named_parameters()) finals[static_cast<size_t>(r)][n] = p.detach();
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(bad[static_cast<size_t>(r)] == "");
  }
  // The local experts ran as chip programs (not through the host fallback).
  std::string kernels;
  uint64_t expert_runs = 0;
  for (auto& [k, n] : sim_stats().runs_by_kernel) {
    kernels += k + " ";
    if (k.find("grouped_matmul") != std::string::npos) expert_runs += n;
  }
  INFO("chip kernels: " << kernels);
  CHECK(expert_runs > 0);
  for (int s = 0; s < steps; ++s) {
    double avg = 0;
    for (int r = 0; r < world; ++r) avg += losses[static_cast<size_t>(r)][static_cast<size_t>(s)] / world;
    INFO("step " << s);
    CHECK(std::fabs(avg - ref_loss[static_cast<size_t>(s)]) < 1e-5);
  }
  for (auto& [n, p] : ref->named_parameters()) {
    INFO(n);
    for (int r = 0; r < world; ++r) {
      REQUIRE(finals[static_cast<size_t>(r)].count(n));
      CHECK(max_abs_diff(finals[static_cast<size_t>(r)].at(n).to(Device()), part(n, p, r, false)) < 1e-4);
    }
  }
}

}  // namespace

TEST_CASE("expert parallelism over 2 and 4 chips of the simulated pod equals one-device training", "[pod][sharded]") {
  (void)g_env;
  SECTION("2 chips") { ep_sim_train(1, 2); }
  SECTION("4 chips, one expert each") { ep_sim_train(1, 4); }
}

TEST_CASE("expert parallelism (and EP x FSDP) inside tpu::compile on the simulated pod equals one-device training",
          "[pod][sharded]") {
  (void)g_env;
  SECTION("EP over 2 chips") { ep_sim_train(1, 2, false, true); }
  SECTION("EP x FSDP over the 2x2 pod") { ep_sim_train(2, 2, false, true); }
}

TEST_CASE("expert parallelism x fsdp on the simulated 2x2 pod equals one-device training", "[pod][sharded]") {
  (void)g_env;
  ep_sim_train(2, 2);
}

TEST_CASE("expert x tensor parallelism on the simulated 2x2 pod equals one-device training", "[pod][sharded]") {
  (void)g_env;
  ep_sim_train(2, 2, true);  // experts over ep lines of 2 chips, attention, head and expert MLPs over tp
}

namespace {

// The groups of a dp x tp x ep mesh of world = dp tp ep chips, rank (d, t, e) = (d tp + t) ep + e:
// the ranks varying one coordinate (axis 0: d, 1: t, 2: e) with the other two fixed, and the
// ranks varying d and e with t fixed (axis 3: the ranks holding distinct tokens).
std::vector<dist::ProcessGroupPtr> ep_mesh_groups(const std::vector<dist::ProcessGroupPtr>& pods, int dp, int tp,
                                                  int ep, int axis) {
  std::vector<dist::ProcessGroupPtr> mine(pods.size());
  const int world = dp * tp * ep;
  std::vector<bool> done(static_cast<size_t>(world), false);
  for (int r0 = 0; r0 < world; ++r0) {
    if (done[size_t(r0)]) continue;
    const int d0 = r0 / (tp * ep), t0 = (r0 / ep) % tp, e0 = r0 % ep;
    std::vector<int> ranks;
    for (int r = 0; r < world; ++r) {
      const int d = r / (tp * ep), t = (r / ep) % tp, e = r % ep;
      const bool same = axis == 0 ? (t == t0 && e == e0) : axis == 1 ? (d == d0 && e == e0)
                        : axis == 2 ? (d == d0 && t == t0) : t == t0;
      if (same) ranks.push_back(r);
    }
    auto gs = dist::sim_new_group(pods, ranks);
    for (size_t i = 0; i < ranks.size(); ++i) {
      mine[size_t(ranks[i])] = gs[i];
      done[size_t(ranks[i])] = true;
    }
  }
  return mine;
}

}  // namespace

// EP x TP x FSDP on 8 chips (TPU_SIM_POD=2x4; its own CTest entry, the other pod tests run on
// 2x2): experts over ep, attention, the head and each expert's intermediate dimension over tp,
// everything fully sharded over dp; rank (d, t, e) trains on the batch rows of (d, e), alike over
// tp. Against host training: the mean loss of every step (1e-5), step-0 gradient shards (1e-5),
// final weights (1e-4).
// With `compiled`, each rank's whole step (zero_grad, forward, losses, backward, the gradient
// sync, SGD) is one tpu::compile graph, compiled once.
static void ep_sim_train_3d(bool compiled) {
  pod_testing::HighestF32Precision precision;
  const int dp = 2, tp = 2, ep = 2, world = 8, steps = 2;
  const int64_t rows = kBatch / (dp * ep);
  std::vector<double> ref_loss;
  std::map<std::string, Tensor> ref_grads;
  auto ref = ep_sim_host_training(steps, ref_loss, ref_grads);
  auto pods = dist::sim_pod_groups({world});
  REQUIRE(pods.size() == size_t(world));
  const auto dp_g = ep_mesh_groups(pods, dp, tp, ep, 0), tp_g = ep_mesh_groups(pods, dp, tp, ep, 1),
             ep_g = ep_mesh_groups(pods, dp, tp, ep, 2), tok_g = ep_mesh_groups(pods, dp, tp, ep, 3);
  std::vector<std::vector<double>> losses(static_cast<size_t>(world));
  std::vector<nn::StateDict> finals(static_cast<size_t>(world));
  std::vector<std::string> bad(static_cast<size_t>(world));
  pod_testing::on_ranks(world, [&](int r) {
    const size_t i = size_t(r);
    const int d = r / (tp * ep), t = (r / ep) % tp, e = r % ep;
    const Device chip = pod_testing::chip(r);
    auto lm = ep_sim_moe_lm();
    lm->to(chip);
    nn::parallel::expert_parallel(*lm, ep_g[i]);
    nn::parallel::parallelize_module(*lm, tp_g[i], nn::parallel::causal_lm_plan(*lm));
    for (auto& l : lm->model->layers) nn::parallel::expert_tensor_parallel(*l->moe, tp_g[i]);
    for (auto& l : lm->model->layers) nn::parallel::fully_shard(l, dp_g[i]);
    auto root = nn::parallel::fully_shard(lm, dp_g[i]);
    optim::SGD opt(lm->parameters(), optim::SGDOptions{0.2, 0.9});
    auto train_step = [&](const Tensor& tok) {
      opt.zero_grad();
      Tensor loss = ep_sim_loss(*lm, tok, chip, tok_g[i]);
      loss.backward();
      nn::parallel::sync_replicated_gradients(*lm, ep_g[i]);
      opt.step();
      return loss;
    };
    const std::string fn = "ep_sim_3d_step_" + std::to_string(r);
    auto step_fn = compile(train_step, {.name = fn, .fullgraph = true});
    for (int s = 0; s < steps; ++s) {
      const Tensor tok =
          narrow(batch_tokens(s, kBatch, kSeq, 32), 0, (d * ep + e) * rows, rows).contiguous().to(chip);
      Tensor loss;
      if (compiled) {
        loss = step_fn(tok);
      } else {
        loss = ep_sim_loss(*lm, tok, chip, tok_g[i]);
        loss.backward();
        nn::parallel::sync_replicated_gradients(*lm, ep_g[i]);
      }
      losses[i].push_back(loss.to(Device()).item<double>());
      if (s == 0)
        for (auto& [n, p] : lm->named_parameters()) {
          const Tensor want = my_rows(ep_sim_tp_part(n, ref_grads.at(n), e, ep, t, tp).contiguous(), d, dp);
          const double diff = p.grad().defined() ? max_abs_diff(p.grad().to(Device()), want) : INFINITY;
          if (diff > 1e-5) bad[i] += fmt::format("step-0 gradient of {}: {}; ", n, diff);
        }
      if (!compiled) {
        opt.step();
        opt.zero_grad();
      }
    }
    if (compiled) {
      const jit::Stats st = jit::stats();
      const jit::FunctionStats* fs = st.find(fn);
      if (!fs || fs->compiles != 1 || fs->hits != steps - 1 || fs->breaks != 0) bad[i] += "not one compile; ";
    }
    finals[i] = root->full_state_dict();
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(bad[size_t(r)] == "");
  }
  for (int s = 0; s < steps; ++s) {
    double avg = 0;
    for (int r = 0; r < world; ++r) avg += losses[size_t(r)][size_t(s)] / world;
    INFO("step " << s);
    CHECK(std::fabs(avg - ref_loss[size_t(s)]) < 1e-5);
  }
  for (auto& [n, p] : ref->named_parameters()) {
    INFO(n);
    for (int r = 0; r < world; ++r) {
      REQUIRE(finals[size_t(r)].count(n));
      const Tensor want = ep_sim_tp_part(n, p, r % ep, ep, (r / ep) % tp, tp);
      CHECK(max_abs_diff(finals[size_t(r)].at(n).to(Device()), want) < 1e-4);
    }
  }
}

TEST_CASE("EP x TP x FSDP on a 3-D mesh of 8 simulated chips equals one-device training", "[.pod8]") {
  (void)g_env;
  SECTION("eager") { ep_sim_train_3d(false); }
  SECTION("the whole step inside tpu::compile") { ep_sim_train_3d(true); }
}
