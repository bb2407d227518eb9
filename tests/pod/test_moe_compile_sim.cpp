// Single sparse MoE blocks on the cpu and the chips of the simulated pod (TPU_SIM_POD=2x2,
// TPU_SIM_CHIP=tiny as the other pod tests) inside and outside tpu::compile: an expert-parallel
// block's three exchanges (uneven, fixed-capacity, compiled) and its capacity drops against a
// naive host reference, with no host fallback in the fixed-capacity ones; a compiled
// expert-parallel training step's gradients against one device (no host fallback either);
// capacity-factor routing compiled against the eager host loop; the
// fused moe_ffn node of a compiled inference graph (graph pass fuse_moe) against the eager block.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>

#include "codegen/launch.h"
#include "ops/fallback.h"
#include "pod/pod_testing.h"
#include "sharded/model.h"
#include "tpucore/compile.h"
#include "tpucore/devices.h"
#include "tpucore/nn/moe.h"
#include "tpucore/nn/parallel/expert_parallel.h"

using namespace sharded_test;

using pod_testing::g_env;
namespace {

// How many nodes of `op` a printed graph holds ("= op(" in the text form).
int count_op_in(const std::string& graph, const std::string& op) {
  int n = 0;
  for (size_t p = graph.find("= " + op + "("); p != std::string::npos; p = graph.find("= " + op + "(", p + 1)) ++n;
  return n;
}

// The block every case uses: hidden 8, 4 experts of width 6, top 2.
nn::MoEConfig tiny_moe_block_config() {
  nn::MoEConfig mc;
  mc.hidden = 8;
  mc.intermediate = 6;
  mc.num_experts = 4;
  mc.top_k = 2;
  return mc;
}

// Rank r's tokens [6, 8] of call `c` (other calls route differently).
Tensor ep_block_input(int c, int r) {
  std::vector<float> v(48);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::cos(0.7 * double(i) + 1.3 * c + 2.9 * r));
  return from_vector(v, Shape{6, 8});
}

// The naive capacity reference on the host: the block's routing, each slot's expert output, and
// a slot kept when fewer than `cap` slots of the same destination rank come before it (in expert
// order, then slot order). Returns the output and the dropped count.
std::pair<Tensor, int64_t> ep_capacity_reference(nn::SparseMoE& blk, const Tensor& x, int ranks, int64_t cap) {
  const auto r = blk.route(x);
  const int64_t t = x.size(0), k = blk.cfg.top_k, e = blk.cfg.num_experts, local = e / ranks;
  std::vector<Tensor> per_expert;  // every token through expert i
  for (int64_t i = 0; i < e; ++i) {
    std::vector<int32_t> sizes(static_cast<size_t>(e), 0);
    sizes[static_cast<size_t>(i)] = static_cast<int32_t>(t);
    per_expert.push_back(blk.experts->forward(x, from_vector(sizes, Shape{e})).detach());
  }
  const auto ids = r.experts.to(DType::i64).contiguous().to_vector<int64_t>();
  const auto w = r.weights.detach().contiguous().to_vector<float>();
  std::vector<int64_t> seen(static_cast<size_t>(ranks), 0);
  std::vector<bool> kept(ids.size(), false);
  for (int64_t ex = 0; ex < e; ++ex)
    for (size_t s = 0; s < ids.size(); ++s)
      if (ids[s] == ex) kept[s] = seen[static_cast<size_t>(ex / local)]++ < cap;
  int64_t dropped = 0;
  for (int64_t n : seen) dropped += std::max<int64_t>(n - cap, 0);
  Tensor out = zeros(x.shape());
  for (int64_t tok = 0; tok < t; ++tok)
    for (int64_t j = 0; j < k; ++j) {
      const auto s = static_cast<size_t>(tok * k + j);
      if (!kept[s]) continue;
      Tensor row = mul(narrow(per_expert[static_cast<size_t>(ids[s])], 0, tok, 1), static_cast<double>(w[s]));
      narrow(out, 0, tok, 1).add_(row);
    }
  return {out, dropped};
}

}  // namespace

TEST_CASE("expert-parallel block on 2 chips: uneven, fixed-capacity and compiled exchanges equal one device, "
          "capacity drops", "[pod][sharded]") {
  (void)g_env;
  pod_testing::HighestF32Precision precision;
  nn::MoEConfig mc = tiny_moe_block_config();
  Generator g0(5);
  nn::SparseMoE ref(mc, &g0);
  const int world = 2, calls = 3;
  const int64_t cap = 3;  // ceil(0.5 * 12 slots / 2 ranks)
  // The host references, computed before the rank threads start.
  std::map<std::pair<int, int>, Tensor> want, capped_want;
  std::map<std::pair<int, int>, int64_t> capped_drops;
  for (int c = 0; c < calls; ++c)
    for (int r = 0; r < world; ++r) {
      const Tensor x = ep_block_input(c, r);
      want[{c, r}] = ref.forward(x).detach();
      auto [cw, cd] = ep_capacity_reference(ref, x, world, cap);
      capped_want[{c, r}] = cw;
      capped_drops[{c, r}] = cd;
    }
  auto pg = dist::sim_pod_groups({world});
  // Bad input: a negative capacity factor, the dropped count of a block that is not expert-parallel.
  {
    Generator g(5);
    nn::SparseMoE odd(mc, &g);
    CHECK_THROWS_WITH(nn::parallel::expert_parallel(odd, pg[0], {.capacity_factor = -1}),
                      Catch::Contains("capacity_factor must be a finite value >= 0"));
    CHECK_THROWS_WITH(nn::parallel::expert_parallel_dropped(odd), Catch::Contains("not expert-parallel"));
  }
  std::vector<std::string> bad(static_cast<size_t>(world));
  pod_testing::on_ranks(world, [&](int r) {
    const Device chip = pod_testing::chip(r);
    auto make = [&](const nn::parallel::ExpertParallelOptions& o) {
      Generator g(5);
      auto b = std::make_shared<nn::SparseMoE>(mc, &g);
      b->to(chip);
      nn::parallel::expert_parallel(*b, pg[size_t(r)], o);
      return b;
    };
    auto uneven = make({}), fixed = make({.fixed_capacity = true}), comp = make({}),
         capped = make({.capacity_factor = 0.5});
    const std::string name = "ep_block_" + std::to_string(r);
    auto f = compile([&](const Tensor& x) { return comp->forward(x); }, {.name = name, .fullgraph = true});
    std::string& b = bad[size_t(r)];
    auto host_runs = [&] {  // host fallbacks of ops on this rank's chip, and of chip kernels (any chip)
      uint64_t n = codegen::stats().host_fallbacks;
      for (const auto& fc : ops::fallback_counts())
        if (fc.device == chip) n += fc.calls;
      return n;
    };
    for (int c = 0; c < calls; ++c) {
      const Tensor& w = want.at({c, r});
      const Tensor& cw = capped_want.at({c, r});
      const int64_t cd = capped_drops.at({c, r});
      const Tensor xc = ep_block_input(c, r).to(chip);
      const double du = max_abs_diff(uneven->forward(xc).to(Device()), w);
      // The fixed-capacity exchange (eager and compiled): its index arithmetic, row gathers and
      // casts run as chip programs, no op takes the host fallback.
      const uint64_t fallbacks = host_runs();
      const Tensor yf = fixed->forward(xc), yc = f(xc);
      if (host_runs() != fallbacks) b += fmt::format("call {}: {} host fallbacks; ", c, host_runs() - fallbacks);
      const double df = max_abs_diff(yf.to(Device()), w);
      const double dc = max_abs_diff(yc.to(Device()), w);
      if (du > 1e-5 || df > 1e-5 || dc > 1e-5) b += fmt::format("call {}: {} {} {}; ", c, du, df, dc);
      auto drops = [](const nn::SparseMoE& m) {
        return nn::parallel::expert_parallel_dropped(m).to(Device()).to(DType::i64).item<int64_t>();
      };
      if (drops(*fixed) != 0) b += "fixed dropped; ";
      const double dk = max_abs_diff(capped->forward(xc).to(Device()), cw);
      const int64_t got = drops(*capped);
      if (dk > 1e-5 || got != cd) b += fmt::format("capacity call {}: {} dropped {} of {}; ", c, dk, got, cd);
      if (c == 0 && cd == 0) b += "the capacity case drops nothing; ";
    }
    const jit::Stats st = jit::stats();
    const jit::FunctionStats* fs = st.find(name);
    if (!fs || fs->compiles != 1 || fs->hits != calls - 1) b += "not one compile for three routings; ";
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(bad[size_t(r)] == "");
  }
}

TEST_CASE("a compiled expert-parallel training step on 2 chips: gradients equal one device, no host fallback",
          "[pod][sharded]") {
  (void)g_env;
  pod_testing::HighestF32Precision precision;
  nn::MoEConfig mc = tiny_moe_block_config();
  const int world = 2;
  // Rank r's loss sum(block(x_r) * t_r): on the host, each rank's gradients separately.
  auto target = [](int r) {
    std::vector<float> v(48);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::sin(0.3 * double(i) + 1.1 * r));
    return from_vector(v, Shape{6, 8});
  };
  std::vector<std::map<std::string, Tensor>> ref_grads(world);
  std::vector<Tensor> ref_dx(world);
  for (int r = 0; r < world; ++r) {
    Generator g(5);
    nn::SparseMoE ref(mc, &g);
    Tensor x = ep_block_input(0, r);
    x.requires_grad_(true);
    sum(mul(ref.forward(x), target(r))).backward();
    ref_dx[size_t(r)] = x.grad().clone();
    for (auto& [n, p] : ref.named_parameters()) ref_grads[size_t(r)][n] = p.grad().clone();
  }
  auto pg = dist::sim_pod_groups({world});
  std::vector<std::string> bad(static_cast<size_t>(world));
  pod_testing::on_ranks(world, [&](int r) {
    const Device chip = pod_testing::chip(r);
    Generator g(5);
    auto blk = std::make_shared<nn::SparseMoE>(mc, &g);
    blk->to(chip);
    nn::parallel::expert_parallel(*blk, pg[size_t(r)], {});
    const Tensor t = target(r).to(chip);
    auto step = compile([&](const Tensor& x) {
      const Tensor loss = sum(mul(blk->forward(x), t));
      loss.backward();
      return loss;
    }, {.name = "ep_train_step_" + std::to_string(r), .fullgraph = true});
    Tensor x = ep_block_input(0, r).to(chip);
    x.requires_grad_(true);
    auto host_runs = [&] {
      uint64_t n = codegen::stats().host_fallbacks;
      for (const auto& fc : ops::fallback_counts())
        if (fc.device == chip) n += fc.calls;
      return n;
    };
    std::string& b = bad[size_t(r)];
    const uint64_t fallbacks = host_runs();
    step(x);
    if (host_runs() != fallbacks) b += fmt::format("{} host fallbacks; ", host_runs() - fallbacks);
    if (!x.grad().defined() || max_abs_diff(x.grad().to(Device()), ref_dx[size_t(r)]) > 1e-5) b += "input gradient; ";
    // The local experts' gradients are those of the ranks' mean loss; the router's its own.
    for (auto& [n, p] : blk->named_parameters()) {
      Tensor want;
      if (n.find("experts") != std::string::npos) {
        const int64_t k = p.size(0);
        want = mul(add(narrow(ref_grads[0].at(n), 0, r * k, k), narrow(ref_grads[1].at(n), 0, r * k, k)), 0.5);
      } else {
        want = ref_grads[size_t(r)].at(n);
      }
      const double d = p.grad().defined() ? max_abs_diff(p.grad().to(Device()), want) : INFINITY;
      if (d > 1e-5) b += fmt::format("gradient of {}: {}; ", n, d);
    }
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(bad[size_t(r)] == "");
  }
}

TEST_CASE("capacity-factor routing inside tpu::compile (cpu and a sim chip) equals the eager naive admission",
          "[pod][sharded]") {
  (void)g_env;
  pod_testing::HighestF32Precision precision;
  nn::MoEConfig mc = tiny_moe_block_config();
  mc.capacity_factor = 0.5;  // C = ceil(0.5 * 12 / 4) = 2 slots per expert
  for (const Device dev : {Device(), pod_testing::chip(0)}) {
    INFO(dev.str());
    Generator g(7);
    nn::SparseMoE blk(mc, &g);
    blk.to(dev);
    blk.train();
    const std::string name = "moe_capacity_" + dev.str();
    auto f = compile([&](const Tensor& x) { return blk.forward(x); }, {.name = name, .fullgraph = true});
    for (int c = 0; c < 3; ++c) {
      const Tensor x = ep_block_input(c, 0).to(dev);
      const Tensor eager = blk.forward(x).to(Device());  // the host loop's admission
      CHECK(max_abs_diff(f(x).to(Device()), eager) < 1e-6);
      blk.eval();
      CHECK(max_abs_diff(blk.forward(x).to(Device()), eager) > 1e-3);  // slots were dropped
      blk.train();
    }
    const jit::Stats st = jit::stats();
    const jit::FunctionStats* fs = st.find(name);
    REQUIRE(fs != nullptr);
    CHECK(fs->compiles == 1);
  }
}

TEST_CASE("a compiled MoE block for inference is one fused moe_ffn node equal to the eager block (cpu and sim)",
          "[pod][sharded]") {
  (void)g_env;
  pod_testing::HighestF32Precision precision;
  nn::MoEConfig mc = tiny_moe_block_config();
  for (const Device dev : {Device(), pod_testing::chip(0)}) {
    INFO(dev.str());
    Generator g(7);
    nn::SparseMoE blk(mc, &g);
    blk.to(dev);
    blk.eval();
    NoGradGuard ng;
    const std::string name = "moe_fused_" + dev.str();
    auto f = compile([&](const Tensor& x) { return blk.forward(x); }, {.name = name, .fullgraph = true});
    auto host_runs = [&] {  // host fallbacks of ops on this device
      uint64_t n = 0;
      for (const auto& fc : ops::fallback_counts())
        if (fc.device == dev) n += fc.calls;
      return n;
    };
    const uint64_t fallbacks = host_runs();
    for (int c = 0; c < 3; ++c) {
      const Tensor x = ep_block_input(c, 1).to(dev);
      CHECK(max_abs_diff(f(x).to(Device()), blk.forward(x).to(Device())) < 1e-6);
    }
    if (dev.type == DeviceType::sim) CHECK(host_runs() == fallbacks);  // the fused node's ops ran as chip programs
    std::string graph;
    for (const std::string& s : f.graphs()) graph += s;
    INFO(graph);
    CHECK(count_op_in(graph, "moe_ffn") == 1);
    CHECK(count_op_in(graph, "grouped_matmul") == 0);
    CHECK(count_op_in(graph, "moe_permute") == 0);
    const jit::Stats st = jit::stats();
    const jit::FunctionStats* fs = st.find(name);
    REQUIRE(fs != nullptr);
    CHECK(fs->compiles == 1);
  }
}

TEST_CASE("a compiled MoE training step keeps the chain its backward reads (no fused node)", "[pod][sharded]") {
  nn::MoEConfig mc = tiny_moe_block_config();
  Generator g(7);
  nn::SparseMoE blk(mc, &g);
  auto f = compile(
      [&](const Tensor& x) {
        Tensor loss = sum(mul(blk.forward(x), blk.forward(x)));
        loss.backward();
        return loss;
      },
      {.name = "moe_unfused_train", .fullgraph = true});
  f(ep_block_input(0, 0));
  std::string graph;
  for (const std::string& s : f.graphs()) graph += s;
  INFO(graph);
  CHECK(count_op_in(graph, "moe_ffn") == 0);
  CHECK(count_op_in(graph, "grouped_matmul") >= 2);
}
