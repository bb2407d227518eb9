// The fsdp_compile scenario of the sharded-training worker: fully_shard inside tpu::compile over
// gloo. Each rank trains the test transformer for a few AdamW steps twice, eagerly and with the
// whole step compiled into one graph (fsdp_compile.h), and checks the compiled run against the
// one-process reference (loss of every step averaged over the ranks, the first step's gradient
// rows of every shard, the final weights) and against the eager FSDP run, and that the graph
// holds one all-gather and one reduce-scatter per unit with no graph break and one compile. A
// graph break inside a fullgraph FSDP step is a tpu::Error that leaves the model usable.
#include <functional>

#include "fsdp_compile.h"

namespace sharded_test {

int expect_error(const std::function<void()>& f, const char* must_contain, const std::string& what);  // worker_fsdp.cpp

namespace {

// A step that reads a value inside the trace (clip_grad_norm_ calls item()) is a graph break:
// with fullgraph a tpu::Error naming it; the sharded model then still trains eagerly, and its
// first eager step is the reference's.
void check_break_leaves_model_usable(const Config& c, const dist::ProcessGroupPtr& pg, const FsdpRun& ref) {
  const int rank = pg->rank(), world = pg->size();
  auto model = std::make_shared<TinyLM>(c);
  for (auto& b : model->blocks) b = nn::parallel::fully_shard(b, pg);
  auto root = nn::parallel::fully_shard(model, pg);
  optim::AdamW opt(root->parameters(), compile_test_adamw());
  const int64_t rows = kBatch / world;
  Tensor tok = narrow(batch_tokens(0, kBatch, kSeq, c.vocab), 0, rank * rows, rows);
  Tensor ids = narrow(tok, 1, 0, kSeq).contiguous(), tgt = narrow(tok, 1, 1, kSeq).contiguous();
  auto bad = compile(
      [&](const Tensor& x, const Tensor& y) {
        opt.zero_grad();
        Tensor loss = lm_loss(root->forward(x), y);
        loss.backward();
        root->clip_grad_norm_(1e9);
        opt.step();
        return loss;
      },
      {.name = "fsdp_break", .fullgraph = true});
  expect_error([&] { (void)bad(ids, tgt); }, "graph break", "clip_grad_norm_ inside a fullgraph compiled FSDP step");
  for (auto& [n, p] : root->named_parameters())
    check(!p.is_proxy() && (!p.grad().defined() || !p.grad().is_proxy()), "no traced tensor left in shard " + n);
  opt.zero_grad();
  Tensor loss = lm_loss(root->forward(ids), tgt);
  loss.backward();
  check(root->memory_stats().gathered_bytes == 0, "after the failed trace, an eager backward frees every gather");
  Tensor g = loss.detach().clone();
  dist::all_reduce(g, dist::ReduceOp::avg);
  check(std::fabs(g.item<double>() - ref.losses[0]) <= 2e-5 * std::max(1.0, ref.losses[0]),
        fmt::format("eager step after the failed trace: loss {} vs reference {}", g.item<double>(), ref.losses[0]));
  for (auto& [n, p] : root->named_parameters()) {
    const double d = p.grad().defined() ? max_abs_diff(p.grad(), my_rows(ref.grads0.at(n), rank, world)) : INFINITY;
    check(d <= 1e-5, fmt::format("eager gradient of {} after the failed trace: max diff {}", n, d));
  }
}

}  // namespace

int scenario_fsdp_compile() {
  const int rank = dist::get_rank(), world = dist::get_world_size();
  Config c;
  const int steps = 3;
  FsdpRun ref = train_plain_reference(c, steps);
  dist::DeviceMesh mesh({world}, {"dp"});
  dist::ProcessGroupPtr pg = mesh.group("dp");
  FsdpRun eager = train_fsdp_rank(c, pg, Device(), steps, false, "fsdp_eager");
  FsdpRun comp = train_fsdp_rank(c, pg, Device(), steps, true, "fsdp_compiled_step");
  for (int s = 0; s < steps; ++s) {
    Tensor l = from_vector(std::vector<float>{float(comp.losses[size_t(s)])}, Shape{1});
    dist::all_reduce(l, dist::ReduceOp::avg);  // the global batch's loss
    const double got = l.item<double>(), want = ref.losses[size_t(s)];
    check(std::fabs(got - want) <= 2e-5 * std::max(1.0, std::fabs(want)),
          fmt::format("compiled step {}: loss {} vs reference {}", s, got, want));
    check(std::fabs(comp.losses[size_t(s)] - eager.losses[size_t(s)]) <= 1e-5,
          fmt::format("compiled step {}: this rank's loss {} vs eager FSDP {}", s, comp.losses[size_t(s)],
                      eager.losses[size_t(s)]));
  }
  check(comp.grads0.size() == ref.grads0.size(), "every shard has a gradient after the first compiled step");
  for (auto& [n, g] : comp.grads0) {
    const double d = max_abs_diff(g, my_rows(ref.grads0.at(n), rank, world));
    check(d <= 1e-5, fmt::format("compiled first-step gradient of {}: max diff {} to the reference rows", n, d));
  }
  for (auto& [n, want] : ref.final_params) {
    auto it = comp.final_params.find(n);
    check(it != comp.final_params.end(), "compiled run has final " + n);
    if (it == comp.final_params.end()) continue;
    const double d = max_abs_diff(it->second, want), de = max_abs_diff(it->second, eager.final_params.at(n));
    check(d <= 1e-4, fmt::format("compiled final {}: max diff {} to the reference", n, d));
    check(de <= 1e-5, fmt::format("compiled final {}: max diff {} to eager FSDP", n, de));
  }
  const int units = static_cast<int>(c.layers) + 1;
  check(count_op(comp.graph, "dist_all_gather") == units,
        fmt::format("{} all-gathers in the graph, want one per unit ({})", count_op(comp.graph, "dist_all_gather"), units));
  check(count_op(comp.graph, "dist_reduce_scatter") == units,
        fmt::format("{} reduce-scatters in the graph, want {}", count_op(comp.graph, "dist_reduce_scatter"), units));
  check(comp.compiles == 1 && comp.hits == steps - 1 && comp.breaks == 0,
        fmt::format("compiles {} hits {} breaks {}: want 1, {}, 0", comp.compiles, comp.hits, comp.breaks, steps - 1));
  check_break_leaves_model_usable(c, pg, ref);
  // One model, the first step eager and the next ones compiled: the same training.
  {
    FsdpRun mixed = train_fsdp_rank(c, pg, Device(), steps, true, "fsdp_after_eager", {}, 1);
    for (int s = 0; s < steps; ++s)
      check(std::fabs(mixed.losses[size_t(s)] - eager.losses[size_t(s)]) <= 1e-5,
            fmt::format("eager then compiled, step {}: loss {} vs eager {}", s, mixed.losses[size_t(s)], eager.losses[size_t(s)]));
    for (auto& [n, want] : eager.final_params)
      check(max_abs_diff(mixed.final_params.at(n), want) <= 1e-5, "eager then compiled: final " + n);
    check(mixed.compiles == 1 && mixed.hits == steps - 2, "eager then compiled: one compile");
  }
  // bf16 mixed precision (bf16 gathers and compute, f32 shards and reduce-scatters): compiled
  // against eager FSDP in the same precision (eager mixed precision is held to its own
  // one-process reference by the fsdp_train scenario).
  {
    nn::parallel::FSDPOptions o;
    o.mixed_precision = nn::parallel::MixedPrecision{};
    FsdpRun me = train_fsdp_rank(c, pg, Device(), steps, false, "fsdp_eager_bf16", o);
    FsdpRun mc = train_fsdp_rank(c, pg, Device(), steps, true, "fsdp_compiled_bf16", o);
    for (int s = 0; s < steps; ++s) {
      const double d = std::fabs(mc.losses[size_t(s)] - me.losses[size_t(s)]);
      check(d <= 5e-3, fmt::format("bf16 compiled step {}: loss {} vs eager {}", s, mc.losses[size_t(s)], me.losses[size_t(s)]));
    }
    for (auto& [n, want] : me.final_params) {
      const double d = max_abs_diff(mc.final_params.at(n), want);
      check(d <= 3e-3, fmt::format("bf16 compiled final {}: max diff {} to eager", n, d));
    }
    check(mc.compiles == 1 && mc.breaks == 0, "bf16: one compile, no break");
  }
  if (rank == 0) std::printf("compiled FSDP graph:\n%s\n", comp.graph.c_str());
  return 0;
}

}  // namespace sharded_test
