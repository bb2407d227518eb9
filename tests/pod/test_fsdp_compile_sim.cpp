// fully_shard inside tpu::compile on the sim backend: the four chips of a 2x2 pod of tiny chips
// (TPU_SIM_POD=2x2, TPU_SIM_CHIP=tiny as the other pod tests), one thread per rank, each rank's
// shards in its chip's HBM. The whole AdamW step (zero_grad, forward, loss, backward, step) is
// one compiled graph per rank; it is compared with the same FSDP training run eagerly and with
// the model trained on the host in one process on the whole batch (no sharding code).
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "ops/fallback.h"

#include "pod/pod_testing.h"
#include "sharded/fsdp_compile.h"
#include "tpucore/devices.h"

using namespace sharded_test;

namespace {
// Host fallbacks of ops on `chip` so far, by op.
std::map<std::string, uint64_t> host_runs(Device chip) {
  std::map<std::string, uint64_t> n;
  for (const auto& fc : ops::fallback_counts())
    if (fc.device == chip) n[fc.op] += fc.calls;
  return n;
}
}  // namespace

TEST_CASE("fsdp inside tpu::compile on a simulated 4-chip pod equals eager FSDP and one-device training",
          "[pod][sharded]") {
  (void)pod_testing::g_env;
  // The reference trains in f32 on the host: the chips' f32 matmuls take f32-accurate products.
  pod_testing::HighestF32Precision precision;
  Config c;
  c.layers = 1;
  const int world = 4, steps = 2;
  const FsdpRun ref = train_plain_reference(c, steps);
  auto pg = dist::sim_pod_groups({world});
  std::vector<FsdpRun> eager(world), comp(world);
  std::vector<std::string> comp_fallbacks(world);
  pod_testing::on_ranks(world, [&](int r) {
    eager[size_t(r)] = train_fsdp_rank(c, pg[size_t(r)], pod_testing::chip(r), steps, false, "");
    const std::map<std::string, uint64_t> before = host_runs(pod_testing::chip(r));
    comp[size_t(r)] = train_fsdp_rank(c, pg[size_t(r)], pod_testing::chip(r), steps, true,
                                      "fsdp_sim_step_" + std::to_string(r));
    std::map<std::string, uint64_t> after = host_runs(pod_testing::chip(r));
    for (auto& [op, n] : before) after[op] -= n;
    // FSDP's flat-buffer writes and AdamW's update (its expm1 included) run on the chip; only the
    // cross-entropy loss (gather, ne, where, sum and its gradient's scatter_add along the
    // vocabulary) takes the host fallback, at most twice per step each.
    for (auto& [op, n] : after) {
      const bool allowed = op == "gather" || op == "ne" || op == "where" || op == "sum" || op == "scatter_add";
      if (n > (allowed ? uint64_t(2 * steps) : 0)) comp_fallbacks[size_t(r)] += fmt::format("{} x{}; ", op, n);
    }
  });
  for (int s = 0; s < steps; ++s) {
    double avg = 0;
    for (int r = 0; r < world; ++r) {
      avg += comp[size_t(r)].losses[size_t(s)] / world;
      INFO("rank " << r << " step " << s);
      CHECK(std::fabs(comp[size_t(r)].losses[size_t(s)] - eager[size_t(r)].losses[size_t(s)]) < 1e-5);
    }
    INFO("step " << s);
    CHECK(std::fabs(avg - ref.losses[size_t(s)]) < 1e-4);
  }
  for (int r = 0; r < world; ++r) {
    const FsdpRun& cr = comp[size_t(r)];
    INFO("rank " << r);
    CHECK(comp_fallbacks[size_t(r)] == "");
    CHECK(cr.compiles == 1);
    CHECK(cr.hits == steps - 1);
    CHECK(cr.breaks == 0);
    CHECK(count_op(cr.graph, "dist_all_gather") == c.layers + 1);
    CHECK(count_op(cr.graph, "dist_reduce_scatter") == c.layers + 1);
    REQUIRE(cr.grads0.size() == ref.grads0.size());
    for (auto& [n, g] : cr.grads0) {
      INFO(n);
      CHECK(max_abs_diff(g, my_rows(ref.grads0.at(n), r, world)) < 1e-5);
    }
    for (auto& [n, p] : ref.final_params) {
      INFO(n);
      REQUIRE(cr.final_params.count(n));
      CHECK(max_abs_diff(cr.final_params.at(n), p) < 1e-4);
      CHECK(max_abs_diff(cr.final_params.at(n), eager[size_t(r)].final_params.at(n)) < 1e-5);
    }
  }
}
