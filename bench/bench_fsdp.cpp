// One training step (forward, backward, AdamW) of a small transformer sharded with
// nn::parallel::fully_shard over gloo processes on loopback, with and without prefetching the
// next unit's all-gather, in f32 and with bf16 mixed precision, against the same step of the
// unsharded model in one process (same per-rank batch). Counters: the parameter bytes a rank
// keeps between steps (shards) against the full model's, and the bytes still gathered after
// a forward (the root's own parameters).
//
//   tpu-run -n 2 ./bench_fsdp        (also -n 4; only rank 0 reports)
//
// Every rank runs the same benchmarks with fixed iteration counts (the ranks must issue the
// same collectives).
#include <benchmark/benchmark.h>

#include "tpucore/dist.h"
#include "tpucore/nn.h"
#include "tpucore/nn/parallel/fsdp.h"

namespace {

using namespace tpu;

constexpr int64_t kVocab = 1024, kHidden = 256, kHeads = 8, kKv = 4, kInter = 704, kLayers = 4, kBatch = 4, kSeq = 64;

struct Block : nn::Module {
  std::shared_ptr<nn::RMSNorm> n1, n2;
  std::shared_ptr<nn::Attention> attn;
  std::shared_ptr<nn::GatedMLP> mlp;
  explicit Block(Generator* g) {
    n1 = register_module("n1", std::make_shared<nn::RMSNorm>(Shape{kHidden}, 1e-6));
    nn::AttentionConfig c;
    c.hidden = kHidden;
    c.num_heads = kHeads;
    c.num_kv_heads = kKv;
    attn = register_module("attn", std::make_shared<nn::Attention>(c, g));
    n2 = register_module("n2", std::make_shared<nn::RMSNorm>(Shape{kHidden}, 1e-6));
    mlp = register_module("mlp", std::make_shared<nn::GatedMLP>(kHidden, kInter, "silu", false, g));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = add(x, attn->forward(n1->forward(x)));
    return add(h, mlp->forward(n2->forward(h)));
  }
};

struct LM : nn::Module {
  std::shared_ptr<nn::Embedding> embed;
  std::vector<std::shared_ptr<nn::Module>> blocks;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> head;
  LM() {
    Generator g(3);
    embed = register_module("embed", std::make_shared<nn::Embedding>(kVocab, kHidden, &g));
    for (int i = 0; i < kLayers; ++i) blocks.push_back(register_module(fmt::format("b{}", i), std::make_shared<Block>(&g)));
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(Shape{kHidden}, 1e-6));
    head = register_module("head", std::make_shared<nn::Linear>(kHidden, kVocab, false, &g));
  }
  Tensor forward(const Tensor& ids) override {
    Tensor h = embed->forward(ids);
    for (auto& b : blocks) h = b->forward(h);
    return head->forward(norm->forward(h));
  }
};

Tensor tokens() {
  std::vector<int64_t> v(static_cast<size_t>(kBatch * (kSeq + 1)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 7919 + 13) % kVocab);
  return from_vector(v, Shape{kBatch, kSeq + 1});
}

double step(nn::Module& m, optim::Optimizer& opt, const Tensor& tok) {
  Tensor logits = m.forward(narrow(tok, 1, 0, kSeq).contiguous());
  Tensor loss = nn::cross_entropy(logits.to(DType::f32).reshape(Shape{-1, kVocab}), narrow(tok, 1, 1, kSeq).contiguous().reshape(Shape{-1}));
  loss.backward();
  opt.step();
  opt.zero_grad();
  return loss.item<double>();
}

void BM_LocalStep(benchmark::State& state) {  // the unsharded model, this rank's batch, no communication
  auto m = std::make_shared<LM>();
  optim::AdamW opt(m->parameters(), {});
  Tensor tok = tokens();
  for (auto _ : state) benchmark::DoNotOptimize(step(*m, opt, tok));
  int64_t bytes = 0;
  for (Tensor& p : m->parameters()) bytes += static_cast<int64_t>(p.nbytes());
  state.counters["param_MB_per_rank"] = static_cast<double>(bytes) / 1e6;
}

void BM_FsdpStep(benchmark::State& state) {
  const bool prefetch = state.range(0) != 0, mixed = state.range(1) != 0;
  auto m = std::make_shared<LM>();
  dist::DeviceMesh mesh({dist::get_world_size()}, {"dp"});
  nn::parallel::FSDPOptions o;
  o.prefetch = prefetch;
  if (mixed) o.mixed_precision = nn::parallel::MixedPrecision{};
  for (auto& b : m->blocks) b = nn::parallel::fully_shard(b, mesh, o);
  auto root = nn::parallel::fully_shard(m, mesh, o);
  optim::AdamW opt(root->parameters(), {});
  Tensor tok = tokens();
  for (auto _ : state) benchmark::DoNotOptimize(step(*root, opt, tok));
  {
    Tensor logits = root->forward(narrow(tok, 1, 0, kSeq).contiguous());
    state.counters["gathered_MB_after_fwd"] = static_cast<double>(root->memory_stats().gathered_bytes) / 1e6;
    logits.sum().backward();
    opt.zero_grad();
  }
  state.counters["param_MB_per_rank"] = static_cast<double>(root->memory_stats().shard_bytes) / 1e6;
}

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  dist::init_process_group();
  const int iters = 20;
  benchmark::RegisterBenchmark("BM_LocalStep", BM_LocalStep)->Iterations(iters)->UseRealTime()->Unit(benchmark::kMillisecond);
  for (int mixed : {0, 1})
    for (int prefetch : {0, 1})
      benchmark::RegisterBenchmark("BM_FsdpStep", BM_FsdpStep)
          ->ArgNames({"prefetch", "bf16"})
          ->Args({prefetch, mixed})
          ->Iterations(iters)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("world_size", std::to_string(dist::get_world_size()));
  if (dist::get_rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  dist::barrier();
  dist::destroy_process_group();
  return 0;
}
