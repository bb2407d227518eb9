// fully_shard inside tpu::compile, shared by the gloo worker (worker_fsdp_compile.cpp) and the
// sim pod test (tests/pod/test_fsdp_compile_sim.cpp): one rank's FSDP training of the test
// transformer, the whole step (zero_grad, forward, loss, backward, AdamW step) compiled into one
// graph or run eagerly, and the plain one-process reference (no sharding code) it is held to.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model.h"
#include "tpucore/compile.h"
#include "tpucore/nn/parallel/fsdp.h"

namespace sharded_test {

struct FsdpRun {
  std::vector<double> losses;            // this rank's (mean over its rows)
  std::map<std::string, Tensor> grads0;  // the shards' gradients of the first step (host)
  nn::StateDict final_params;            // full tensors (host)
  std::string graph;                     // compiled: the optimized graph, printed
  int64_t compiles = 0, hits = 0, breaks = 0;
};

inline optim::AdamWOptions compile_test_adamw() {
  optim::AdamWOptions o;
  o.lr = 1e-2;
  return o;
}

// Rank `rank` of `world` trains on rows [rank B/world, (rank+1) B/world) of each global batch.
// Compiled: steps from `first_compiled` on go through the compiled step (the earlier ones eager).
inline FsdpRun train_fsdp_rank(const Config& c, const dist::ProcessGroupPtr& pg, Device dev, int steps, bool compiled,
                               const std::string& name, const nn::parallel::FSDPOptions& o = {},
                               int first_compiled = 0) {
  const int rank = pg->rank(), world = pg->size();
  auto model = std::make_shared<TinyLM>(c);
  model->to(dev);
  for (auto& b : model->blocks) b = nn::parallel::fully_shard(b, pg, o);
  auto root = nn::parallel::fully_shard(model, pg, o);
  optim::AdamW opt(root->parameters(), compile_test_adamw());
  auto step = [&](const Tensor& ids, const Tensor& tgt) {
    opt.zero_grad();
    Tensor loss = lm_loss(root->forward(ids), tgt);
    loss.backward();
    opt.step();
    return loss;
  };
  auto f = compile(step, {.name = name, .fullgraph = true});
  FsdpRun run;
  const int64_t rows = kBatch / world;
  for (int s = 0; s < steps; ++s) {
    Tensor tok = narrow(batch_tokens(s, kBatch, kSeq, c.vocab), 0, rank * rows, rows);
    Tensor ids = narrow(tok, 1, 0, kSeq).contiguous().to(dev), tgt = narrow(tok, 1, 1, kSeq).contiguous().to(dev);
    Tensor loss = compiled && s >= first_compiled ? f(ids, tgt) : step(ids, tgt);
    run.losses.push_back(loss.to(Device()).item<double>());
    if (s == 0)
      for (auto& [n, p] : root->named_parameters())
        if (p.grad().defined()) run.grads0[n] = p.grad().to(Device()).clone();
  }
  for (auto& [n, t] : root->full_state_dict()) run.final_params[n] = t.to(Device());
  if (compiled) {
    for (const std::string& g : f.graphs()) run.graph += g;
    const jit::Stats st = jit::stats();
    if (const jit::FunctionStats* fs = st.find(name)) {
      run.compiles = fs->compiles;
      run.hits = fs->hits;
      run.breaks = fs->breaks;
    }
  }
  return run;
}

// One process on the host, the whole global batch, the same optimizer, no sharding code.
inline FsdpRun train_plain_reference(const Config& c, int steps) {
  FsdpRun run;
  auto model = std::make_shared<TinyLM>(c);
  optim::AdamW opt(model->parameters(), compile_test_adamw());
  for (int s = 0; s < steps; ++s) {
    Tensor tok = batch_tokens(s, kBatch, kSeq, c.vocab);
    opt.zero_grad();
    Tensor loss = lm_loss(model->forward(narrow(tok, 1, 0, kSeq).contiguous()), narrow(tok, 1, 1, kSeq).contiguous());
    loss.backward();
    opt.step();
    run.losses.push_back(loss.item<double>());
    if (s == 0)
      for (auto& [n, p] : model->named_parameters()) run.grads0[n] = p.grad().clone();
  }
  run.final_params = model->state_dict();
  return run;
}

// How many times `op` appears as a node of a printed graph ("= op(" in the text form).
inline int count_op(const std::string& graph, const std::string& op) {
  int n = 0;
  for (size_t p = graph.find(op + "("); p != std::string::npos; p = graph.find(op + "(", p + 1)) ++n;
  return n;
}

}  // namespace sharded_test
