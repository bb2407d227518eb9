// Tensor-parallel scenarios of the sharded-training worker: the test model rebuilt from its
// full layers with heads, MLP columns and vocabulary split over the "tp" axis (and, on a 2-D
// mesh, fully sharded over "dp"), trained against the one-process reference.
#include <cstring>
#include <functional>

#include "model.h"
#include "tpucore/nn/parallel/fsdp.h"
#include "tpucore/nn/parallel/tensor_parallel.h"
#include "tpucore/nn/quantized.h"

namespace sharded_test {

using namespace tpu::nn::parallel;

namespace {

std::shared_ptr<nn::RMSNorm> copy_norm(const nn::RMSNorm& full) {
  auto n = std::make_shared<nn::RMSNorm>(full.normalized_shape, full.eps);
  NoGradGuard ng;
  n->weight.copy_(full.weight);
  return n;
}

struct TPBlock : nn::Module {
  std::shared_ptr<nn::RMSNorm> norm1, norm2;
  std::shared_ptr<ParallelAttention> attn;
  std::shared_ptr<ParallelGatedMLP> mlp;
  TPBlock(const Block& full, const dist::ProcessGroupPtr& g) {
    norm1 = register_module("norm1", copy_norm(*full.norm1));
    attn = register_module("attn", std::make_shared<ParallelAttention>(*full.attn, g));
    norm2 = register_module("norm2", copy_norm(*full.norm2));
    mlp = register_module("mlp", std::make_shared<ParallelGatedMLP>(*full.mlp, g));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = add(x, attn->forward(norm1->forward(x)));
    return add(h, mlp->forward(norm2->forward(h)));
  }
};

// TinyLM with every layer tensor-parallel; forward returns this rank's slice of the logits.
struct TPLM : nn::Module {
  std::shared_ptr<VocabParallelEmbedding> embed;
  std::vector<std::shared_ptr<nn::Module>> blocks;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<ColumnParallelLinear> head;
  TPLM(const TinyLM& full, const dist::ProcessGroupPtr& g) {
    embed = register_module("embed", std::make_shared<VocabParallelEmbedding>(*full.embed, g));
    for (size_t i = 0; i < full.blocks.size(); ++i)
      blocks.push_back(register_module("block" + std::to_string(i),
                                       std::make_shared<TPBlock>(dynamic_cast<const Block&>(*full.blocks[i]), g)));
    norm = register_module("norm", copy_norm(*full.norm));
    head = register_module("head", std::make_shared<ColumnParallelLinear>(*full.head, g, false));
  }
  Tensor forward(const Tensor& ids) override {
    Tensor h = embed->forward(ids);
    for (auto& b : blocks) h = b->forward(h);
    return head->forward(norm->forward(h));
  }
};

// The part of a reference tensor that tensor-parallel rank `r` of `n` holds, by the name's layout.
Tensor tp_part(const std::string& name, const Tensor& full, int r, int n) {
  int dim = -1;
  for (const char* s : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight",
                        "embed.weight", "head.weight", "head.bias"})
    if (name.ends_with(s)) dim = 0;
  for (const char* s : {"o_proj.weight", "down_proj.weight"})
    if (name.ends_with(s)) dim = 1;
  if (dim < 0) return full;
  const int64_t k = full.size(dim) / n;
  return narrow(full, dim, r * k, k);
}

}  // namespace

// argv: tensor-parallel size; world / tp ranks along "dp" fully shard the TP model.
int scenario_tp_train(int tp) {
  const int world = dist::get_world_size();
  const int dp = world / tp;
  Config c;
  c.vocab = 32;
  const int steps = 3;
  Reference ref = train_reference(c, "adamw", false, steps);
  dist::DeviceMesh mesh({dp, tp}, {"dp", "tp"});
  const int dp_rank = mesh.coordinate()[0], tp_rank = mesh.coordinate()[1];
  auto g = mesh.group("tp");
  TinyLM full(c);
  auto model = std::make_shared<TPLM>(full, g);
  std::shared_ptr<nn::Module> top = model;
  std::shared_ptr<FSDPModule> root;
  if (dp > 1) {
    FSDPOptions o;
    o.mesh_axis = "dp";
    for (auto& b : model->blocks) b = fully_shard(b, mesh, o);
    root = fully_shard(model, mesh, o);
    top = root;
  }
  check(model->embed->weight.size(0) == (dp > 1 ? (c.vocab / tp + dp - 1) / dp : c.vocab / tp), "embedding rows split");
  auto opt = make_opt("adamw", top->parameters());
  for (int step = 0; step < steps; ++step) {
    Tensor tok = batch_tokens(step, kBatch, kSeq, c.vocab);
    Tensor mine = narrow(tok, 0, dp_rank * (kBatch / dp), kBatch / dp);
    Tensor ids = narrow(mine, 1, 0, kSeq).contiguous(), tgt = narrow(mine, 1, 1, kSeq).contiguous();
    Tensor logits = top->forward(ids);
    check(logits.size(-1) == c.vocab / tp, "logits stay split over the vocabulary");
    Tensor loss = vocab_parallel_cross_entropy(logits, tgt, g);
    loss.backward();
    Tensor l = loss.detach().clone();
    dist::all_reduce(l, dist::ReduceOp::avg);
    const double want = ref.losses[static_cast<size_t>(step)];
    check(std::fabs(l.item<double>() - want) <= 2e-5 * std::max(1.0, std::fabs(want)),
          fmt::format("step {} loss {} vs reference {}", step, l.item<double>(), want));
    if (step == 0)
      check_step0_grads(*top, [&](const std::string& n) {
        const Tensor want_g = tp_part(n, ref.grads0.at(n), tp_rank, tp);
        return dp > 1 ? my_rows(want_g.contiguous(), dp_rank, dp) : want_g;
      });
    opt->step();
    opt->zero_grad();
  }
  check_final_params(final_params(root, *model), ref.final_params,
                     [&](const std::string& n, const Tensor& w) { return tp_part(n, w, tp_rank, tp).contiguous(); });
  return 0;
}

int scenario_tp_bad() {
  auto g = dist::world();
  nn::Linear odd(16, 5);
  check_error([&] { ColumnParallelLinear(odd, g); }, "not a multiple of the tensor-parallel size 2", "5 outputs on 2 ranks");
  {
    // A quantized projection would lose its scales in a float layer: refused, naming the dtype.
    nn::GatedMLP mlp(16, 32, "silu", false);
    nn::quantize_linear(mlp, "up_proj", mlp.up_proj, nn::WeightQuant::int8);
    check_error([&] { ParallelGatedMLP(mlp, g); }, "up_proj.weight has dtype i8 (a quantized layer's weight)",
                "ParallelGatedMLP over an int8 up_proj");
    nn::Linear lin(16, 8);
    nn::QuantizedLinear q(lin, nn::WeightQuant::fp8);
    check_error([&] { RowParallelLinear(q, g); }, "has dtype u8 (a quantized layer's weight)",
                "RowParallelLinear over an fp8 layer");
  }
  nn::AttentionConfig ac;
  ac.hidden = 16;
  ac.num_heads = 4;
  ac.num_kv_heads = 1;
  nn::Attention attn(ac);
  check_error([&] { ParallelAttention(attn, g); }, "do not split over 2 ranks", "1 kv head on 2 ranks");
  Tensor logits = randn(Shape{3, 4});
  check_error([&] { vocab_parallel_cross_entropy(logits, from_vector(std::vector<int64_t>{0, 1, 9}), g); },
               "targets must be in [0, 8)", "target beyond the vocabulary");
  check_error([&] { vocab_parallel_cross_entropy(logits, from_vector(std::vector<int64_t>{0, 1}), g); },
               "disagree", "logits and targets of different lengths");
  nn::Linear ok(16, 8);
  ColumnParallelLinear col(ok, g);
  check_error([&] { col.forward(randn(Shape{2, 5})); }, "expected an input with 16 features", "wrong input width");
  // Still usable: a column-parallel layer with a gathered output equals the full layer.
  ColumnParallelLinear colg(ok, g, true);
  Tensor x = randn(Shape{2, 16}, {}, nullptr);
  dist::broadcast(x, 0);
  Tensor y = colg.forward(x);
  check(max_abs_diff(y, ok.forward(x)) < 1e-5, "gathered column-parallel output equals the full linear");
  return 0;
}

}  // namespace sharded_test
