// tpu::dist collectives inside tpu::compile on a 2x2 pod of tiny chips (TPU_SIM_POD=2x2, as the
// other pod tests): compiled values against naive loops over every rank's input (and against
// the same function run eagerly), the graph around a collective (no fusion across it, the
// schedule starts it early and reads it late), the ICI overlapping the chip's compute in
// simulated time against the serial sum of the two, and the mesh as part of the compile key.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <thread>

#include "graph/passes/passes.h"
#include "graph/schedule.h"
#include "graph/tracer.h"
#include "pod/pod_testing.h"
#include "tpucore/compile.h"
#include "tpucore/dist.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

using namespace tpu;
using Catch::Matchers::Contains;
using dist::ReduceOp;

namespace {

using pod_testing::g_env;

using pod_testing::chip;

using pod_testing::expect;

using pod_testing::on_ranks;

// Rank r's input of call `salt`: small integers, exact in f32 through every step below.
std::vector<float> input(int r, int salt, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float((i * 5 + r * 3 + salt * 7) % 9) - 4.f;
  return v;
}

std::vector<float> host(const Tensor& t) { return t.to(Device()).contiguous().to_vector<float>(); }

// The step each rank runs: h = relu(2x + 1); all_reduce(h) (sum); all_gather(x); reduce_scatter(h).
struct Step {
  dist::ProcessGroupPtr* pg;
  std::tuple<Tensor, Tensor, Tensor> operator()(const Tensor& x) const {
    auto& g = **pg;
    const int n = g.size();
    Tensor h = relu(x * 2 + 1);
    Tensor sum = h.clone();
    g.all_reduce(sum, ReduceOp::sum);
    Tensor gathered = empty(Shape{x.size(0) * n}, TensorOptions(x.dtype(), x.device()));
    g.all_gather_into_tensor(gathered, x);
    Tensor scattered = empty(Shape{x.size(0) / n}, TensorOptions(x.dtype(), x.device()));
    g.reduce_scatter_tensor(scattered, h, ReduceOp::sum);
    return {sum * 3, gathered, scattered - 1};
  }
};

// The naive reference of Step over ranks `members` (rank i of the group = members[i]).
void reference(const std::vector<int>& members, int salt, int64_t len, int me, std::vector<float>& sum,
               std::vector<float>& gathered, std::vector<float>& scattered) {
  const size_t G = members.size();
  std::vector<float> hs(static_cast<size_t>(len), 0.f);
  gathered.clear();
  for (int m : members) {
    std::vector<float> x = input(m, salt, len);
    for (int64_t i = 0; i < len; ++i) hs[size_t(i)] += std::max(0.f, 2 * x[size_t(i)] + 1);
    gathered.insert(gathered.end(), x.begin(), x.end());
  }
  sum.resize(size_t(len));
  for (int64_t i = 0; i < len; ++i) sum[size_t(i)] = hs[size_t(i)] * 3;
  const int64_t blk = len / int64_t(G);
  scattered.assign(hs.begin() + me * blk, hs.begin() + (me + 1) * blk);
  for (float& v : scattered) v -= 1;
}

}  // namespace

TEST_CASE("compiled collectives on the sim pod: values equal the naive reference and eager, 2 and 4 ranks") {
  for (int n : {2, 4}) {
    auto world = dist::sim_pod_groups({n});
    const int64_t len = 12;
    std::vector<int> members;
    for (int r = 0; r < n; ++r) members.push_back(r);
    std::vector<std::string> errors(static_cast<size_t>(n));
    on_ranks(n, [&](int r) {
      dist::ProcessGroupPtr pg = world[size_t(r)];
      Step step{&pg};
      auto f = compile(step, {.name = "dist_step_" + std::to_string(n) + "_" + std::to_string(r), .fullgraph = true});
      for (int salt = 0; salt < 3; ++salt) {
        Tensor x = from_vector(input(r, salt, len), Shape{len}).to(chip(r));
        auto [s, gth, sc] = f(x);
        auto [es, eg, esc] = step(x);  // eager: the same collectives, run one by one
        std::vector<float> rs, rg, rsc;
        reference(members, salt, len, r, rs, rg, rsc);
        expect(host(s) == rs, "all_reduce, compiled");
        expect(host(gth) == rg, "all_gather, compiled");
        expect(host(sc) == rsc, "reduce_scatter, compiled");
        expect(host(es) == rs && host(eg) == rg && host(esc) == rsc, "eager");
        expect(s.device() == chip(r) && gth.device() == chip(r), "results on the rank's chip");
      }
      const jit::Stats stats = jit::stats();
      const jit::FunctionStats* st = stats.find("dist_step_" + std::to_string(n) + "_" + std::to_string(r));
      expect(st && st->compiles == 1 && st->hits == 2, "one compile, then cache hits");
    });
  }
}

TEST_CASE("compiled collectives: in-place all_reduce of a captured tensor and broadcast write back") {
  auto world = dist::sim_pod_groups({4});
  on_ranks(4, [&](int r) {
    dist::ProcessGroupPtr pg = world[size_t(r)];
    Tensor acc = from_vector(input(r, 1, 8), Shape{2, 4}).to(chip(r));  // captured, written in place
    auto f = compile(
        [&](const Tensor& x) {
          Tensor y = x + 1;
          pg->broadcast(y, 2);  // rank 2's x + 1 everywhere
          pg->all_reduce(acc, ReduceOp::max);
          return y;
        },
        {.fullgraph = true});
    Tensor x = from_vector(input(r, 2, 8), Shape{2, 4}).to(chip(r));
    Tensor y = f(x);
    std::vector<float> want_y = input(2, 2, 8), want_acc(8, -100.f);
    for (float& v : want_y) v += 1;
    for (int m = 0; m < 4; ++m)
      for (size_t i = 0; i < 8; ++i) want_acc[i] = std::max(want_acc[i], input(m, 1, 8)[i]);
    expect(host(y) == want_y, "broadcast from rank 2");
    expect(host(acc) == want_acc, "the captured tensor holds the all_reduce (max)");
  });
}

TEST_CASE("compiled collectives: fusion stops at a collective and the schedule starts it early, reads it late") {
  auto world = dist::sim_pod_groups({4});
  dist::ProcessGroupPtr pg = world[0];
  Tensor x = empty(Shape{64, 16}, TensorOptions(DType::f32, chip(0)));
  Tensor w = empty(Shape{16, 16}, TensorOptions(DType::f32, chip(0)));
  graph::Tracer tr;
  {
    graph::TraceScope scope(&tr);
    Tensor px = tr.add_arg(x, 0), pw = tr.add_arg(w, 1);
    Tensor a = exp(px * 2 + 1);    // elementwise chain before the collective
    pg->all_reduce(a, ReduceOp::sum);
    Tensor c = tanh(a * 3 - 1);    // elementwise chain after it, on its result
    Tensor b = matmul(pw, pw);     // independent work, traced after the reader
    std::vector<Tensor> outs{c, b};
    tr.set_outputs(outs);
  }
  graph::Graph g = tr.graph();
  graph::optimize(g, graph::PassOptions{});
  int coll = -1;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].op->name == "dist_all_reduce") coll = static_cast<int>(i);
  REQUIRE(coll >= 0);
  const graph::Node& cn = g.nodes[size_t(coll)];
  CHECK(cn.region == -1);  // never fused
  // Without the collective the two chains would be one region; here no region holds a node
  // on each side of it.
  const graph::Node* before = g.producer(cn.inputs[0]);
  REQUIRE(before != nullptr);
  REQUIRE(before->region >= 0);
  int after_region = -1;
  for (const graph::Node& n : g.nodes)
    for (graph::ValueId in : n.inputs)
      if (in == cn.outputs[0] && n.region >= 0) after_region = n.region;
  REQUIRE(after_region >= 0);
  CHECK(after_region != before->region);
  // Schedule: region before, the collective at once, the independent matmul, then the reader.
  std::vector<graph::Step> order = graph::schedule(g);
  int pos_coll = -1, pos_before = -1, pos_after = -1, pos_mm = -1;
  for (size_t s = 0; s < order.size(); ++s) {
    if (order[s].node == coll) pos_coll = int(s);
    if (order[s].region == before->region) pos_before = int(s);
    if (order[s].region == after_region) pos_after = int(s);
    if (order[s].node >= 0 && g.nodes[size_t(order[s].node)].op->name == "matmul") pos_mm = int(s);
  }
  CHECK(pos_before == 0);
  CHECK(pos_coll == 1);
  REQUIRE(pos_mm >= 0);
  CHECK(pos_mm < pos_after);
}

namespace {

// Simulated milliseconds of fn on rank r's chip, its streams first brought in step with the
// other ranks' (an eager all_reduce ends at the same simulated time on every chip).
double sim_ms(dist::ProcessGroup& pg, int r, const std::function<void()>& fn) {
  Tensor s = zeros(Shape{4}, TensorOptions(DType::f32, chip(r)));
  pg.all_reduce(s);
  synchronize(chip(r));
  Event a, b;
  a.record(chip(r));
  fn();
  b.record(chip(r));
  b.synchronize();
  return a.elapsed_ms(b);
}

}  // namespace

TEST_CASE("compiled collectives: the ICI works while the chip computes (simulated time vs the serial sum)") {
  auto world = dist::sim_pod_groups({4});
  std::vector<double> t_comp(4), t_comm(4), t_both(4), t_eager(4);
  on_ranks(4, [&](int r) {
    dist::ProcessGroup& pg = *world[size_t(r)];
    auto comm = [&](const Tensor& x) {  // out of place: no copy on the chip's compute
      Tensor g = empty(Shape{4 * x.size(0)}, TensorOptions(x.dtype(), x.device()));
      pg.all_gather_into_tensor(g, x);
      return g;
    };
    auto comp = [](const Tensor& w) { return matmul(w, w); };
    auto both = [&](const Tensor& x, const Tensor& w) { return std::make_tuple(comm(x), comp(w)); };
    auto f_comm = compile(comm);
    auto f_comp = compile(comp);
    auto f_both = compile(both);
    Tensor x = full(Shape{8192}, r, TensorOptions(DType::f32, chip(r)));
    Tensor w = ones(Shape{256, 256}, TensorOptions(DType::bf16, chip(r)));
    for (int warm = 0; warm < 2; ++warm) {  // compile, build the chip programs
      (void)f_comm(x);
      (void)f_comp(w);
      (void)f_both(x, w);
      (void)both(x, w);
    }
    t_comm[size_t(r)] = sim_ms(pg, r, [&] { (void)f_comm(x); });
    t_comp[size_t(r)] = sim_ms(pg, r, [&] { (void)f_comp(w); });
    Tensor g;
    t_both[size_t(r)] = sim_ms(pg, r, [&] { g = std::get<0>(f_both(x, w)); });
    t_eager[size_t(r)] = sim_ms(pg, r, [&] { (void)both(x, w); });
    std::vector<float> want;
    for (int m = 0; m < 4; ++m) want.insert(want.end(), 8192, float(m));
    expect(host(g) == want, "the overlapped all_gather's values");
  });
  for (int r = 0; r < 4; ++r) {
    const double serial = t_comp[size_t(r)] + t_comm[size_t(r)];
    const double lo = std::min(t_comp[size_t(r)], t_comm[size_t(r)]), hi = std::max(t_comp[size_t(r)], t_comm[size_t(r)]);
    INFO("rank " << r << ": compute " << t_comp[size_t(r)] << " ms, all_gather " << t_comm[size_t(r)]
                 << " ms, compiled together " << t_both[size_t(r)] << " ms, eager " << t_eager[size_t(r)] << " ms");
    CHECK(lo > 0.2 * hi);                          // both matter: hiding one is visible
    CHECK(t_both[size_t(r)] <= hi + 0.1 * lo);     // the shorter one hidden behind the longer
    CHECK(t_both[size_t(r)] >= 0.98 * hi);         // and nothing is faster than the longer one
    CHECK(t_eager[size_t(r)] >= 0.95 * serial);    // eager: one stream, one after the other
  }
}

TEST_CASE("compiled collectives: the mesh is part of the compile key and a recompile names it") {
  auto world = dist::sim_pod_groups({4});
  std::vector<dist::ProcessGroupPtr> mesh = world;  // what each rank's function uses
  const std::string name = "mesh_step";
  std::vector<std::function<Tensor(const Tensor&)>> fs;
  for (int r = 0; r < 4; ++r) {
    dist::ProcessGroupPtr* g = &mesh[size_t(r)];
    auto f = compile(
        [g](const Tensor& x) {
          Tensor y = x * 1;
          (*g)->all_reduce(y, ReduceOp::sum);
          return y;
        },
        {.name = name + std::to_string(r)});
    fs.push_back([f](const Tensor& x) { return f(x); });
  }
  auto run = [&](std::vector<std::vector<float>>& out) {
    out.assign(4, {});
    on_ranks(4, [&](int r) { out[size_t(r)] = host(fs[size_t(r)](full(Shape{3}, r + 1, TensorOptions(DType::f32, chip(r))))); });
  };
  std::vector<std::vector<float>> out;
  run(out);
  for (int r = 0; r < 4; ++r) CHECK(out[size_t(r)] == std::vector<float>(3, 10.f));  // 1 + 2 + 3 + 4
  // A 2-D mesh: the function now reduces over pairs {0, 1} and {2, 3}; the old world's groups go.
  auto a = dist::sim_new_group(world, {0, 1}), b = dist::sim_new_group(world, {2, 3});
  mesh = {a[0], a[1], b[0], b[1]};
  world.clear();
  run(out);
  CHECK(out[0] == std::vector<float>(3, 3.f));
  CHECK(out[1] == std::vector<float>(3, 3.f));
  CHECK(out[2] == std::vector<float>(3, 7.f));
  CHECK(out[3] == std::vector<float>(3, 7.f));
  run(out);  // the new mesh's graph is cached
  const jit::Stats stats = jit::stats();
  for (int r = 0; r < 4; ++r) {
    const jit::FunctionStats* st = stats.find(name + std::to_string(r));
    REQUIRE(st != nullptr);
    CHECK(st->compiles == 2);
    CHECK(st->hits == 1);
    REQUIRE(st->reasons.size() == 2);
    CHECK_THAT(st->reasons[1], Contains("mesh changed") && Contains("group of world ranks [0, 1, 2, 3]"));
  }
}

TEST_CASE("compiled collectives: bad arguments are tpu::Errors and the group stays usable") {
  auto world = dist::sim_pod_groups({2});
  on_ranks(2, [&](int r) {
    dist::ProcessGroup& pg = *world[size_t(r)];
    Tensor x = ones(Shape{6}, TensorOptions(DType::f32, chip(r)));
    auto wrong_out = compile([&](const Tensor& t) {
      Tensor o = empty(Shape{5}, TensorOptions(DType::f32, t.device()));
      pg.all_gather_into_tensor(o, t);
      return o;
    });
    auto odd_split = compile([&](const Tensor& t) {
      Tensor o = empty(Shape{2}, TensorOptions(DType::f32, t.device()));
      pg.reduce_scatter_tensor(o, t.narrow(0, 0, 5));
      return o;
    });
    Tensor elsewhere = ones(Shape{6}, TensorOptions(DType::f32, chip(1 - r)));  // captured, on the other chip
    auto other_chip = compile([&](const Tensor& t) {
      Tensor y = elsewhere * t.size(0);
      pg.all_reduce(y);
      return y;
    });
    auto error_of = [](const std::function<void()>& fn) -> std::string {
      try {
        fn();
      } catch (const Error& e) {
        return e.what();
      }
      return "no error";
    };
    const std::string e1 = error_of([&] { (void)wrong_out(x); });
    const std::string e2 = error_of([&] { (void)odd_split(x); });
    const std::string e3 = error_of([&] { (void)other_chip(x); });
    expect(e1.find("the output is [5]") != std::string::npos, e1);
    expect(e2.find("split evenly") != std::string::npos, e2);
    expect(e3.find("is on sim:") != std::string::npos, e3);
    auto a2a = compile([&](const Tensor& t) {
      std::vector<Tensor> os = {empty_like(t), empty_like(t)};
      pg.all_to_all(os, {t, t});
      return os[0];
    });
    const std::string e4 = error_of([&] { (void)a2a(x); });
    expect(e4.find("all_to_all inside tpu::compile") != std::string::npos, e4);
    Tensor y = x.clone();
    pg.all_reduce(y);
    expect(host(y) == std::vector<float>(6, 2.f), "the group still works");
  });
}
