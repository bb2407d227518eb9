// Each pass on hand-built graphs: what it must change and what it must leave alone.
#include <algorithm>

#include "graph_builder.h"

namespace tpu {
namespace {
using namespace graph_testing;
using graph::ValueKind;

TEST_CASE("graph pass dce: removes unused chains, keeps outputs and their producers", "[jit]") {
  Graph g;
  ValueId x = input(g, {4});
  ValueId a = node(g, "exp", {x});
  ValueId dead1 = node(g, "neg", {x});
  node(g, "abs", {dead1});  // dead chain of two
  ValueId b = node(g, "add", {a, x});
  g.outputs = {b, x};
  graph::verify(g, "built");
  CHECK(graph::dce(g) == 2);
  graph::verify(g, "after dce");
  CHECK(g.num_live_nodes() == 2);
  CHECK(count_op(g, "neg") == 0);
  CHECK(count_op(g, "abs") == 0);
  CHECK(graph::dce(g) == 0);  // nothing more to do
}

TEST_CASE("graph pass cse: merges identical nodes and constants, not random ones", "[jit]") {
  Graph g;
  ValueId x = input(g, {3, 4});
  ValueId a1 = node(g, "exp", {x});
  ValueId a2 = node(g, "exp", {x});
  ValueId c1 = scalar_const(g, 2.0), c2 = scalar_const(g, 2.0), c3 = scalar_const(g, 3.0);
  ValueId m1 = node(g, "mul", {a1, c1});
  ValueId m2 = node(g, "mul", {a2, c2});
  ValueId m3 = node(g, "mul", {a2, c3});  // different constant: stays
  ValueId s1 = node(g, "sum", {m1}, {{"dims", std::vector<int64_t>{0}}, {"keepdim", false}});
  ValueId s2 = node(g, "sum", {m2}, {{"dims", std::vector<int64_t>{1}}, {"keepdim", false}});  // other attrs: stays
  ops::Attrs ra{{"shape", std::vector<int64_t>{3, 4}}, {"dtype", DType::f32}, {"device", Device()}, {"kind", std::string("uniform")},
                {"low", 0.0}, {"high", 1.0}, {"generator", int64_t{0}}};
  ValueId r1 = node(g, "random", {}, ra);
  ValueId r2 = node(g, "random", {}, ra);
  g.outputs = {m1, m2, m3, s1, s2, r1, r2};
  const int merged = graph::cse(g);
  graph::verify(g, "after cse");
  CHECK(merged == 3);  // constant 2.0, exp, mul
  CHECK(count_op(g, "exp") == 1);
  CHECK(count_op(g, "mul") == 2);
  CHECK(count_op(g, "sum") == 2);
  CHECK(count_op(g, "random") == 2);
  CHECK(g.outputs[0] == g.outputs[1]);
}

TEST_CASE("graph pass fold: evaluates constant subgraphs with the eager kernels", "[jit]") {
  Graph g;
  ValueId x = input(g, {3});
  ValueId two = scalar_const(g, 2.0), three = scalar_const(g, 3.0);
  ValueId five = node(g, "add", {two, three});
  ValueId ar = node(g, "arange", {}, {{"shape", std::vector<int64_t>{3}}, {"dtype", DType::f32}, {"device", Device()},
                                      {"start", 0.0}, {"end", 3.0}, {"step", 1.0}});
  ValueId k = node(g, "mul", {ar, five});
  ValueId y = node(g, "add", {x, k});  // reads an input: stays
  ops::Attrs big{{"shape", std::vector<int64_t>{1 << 17}}, {"dtype", DType::f32}, {"device", Device()}, {"value", Scalar(1.0)}};
  ValueId huge = node(g, "full", {}, big);  // too big to bake in: stays
  ops::Attrs ra{{"shape", std::vector<int64_t>{3}}, {"dtype", DType::f32}, {"device", Device()}, {"kind", std::string("uniform")},
                {"low", 0.0}, {"high", 1.0}, {"generator", int64_t{0}}};
  ValueId r = node(g, "random", {}, ra);  // random: stays
  g.outputs = {y, huge, r};
  CHECK(graph::fold_constants(g) == 3);
  graph::verify(g, "after fold");
  CHECK(count_op(g, "add") == 1);
  CHECK(count_op(g, "full") == 1);
  CHECK(count_op(g, "random") == 1);
  const graph::Node* p = g.producer(g.outputs[0]);
  REQUIRE(p != nullptr);
  const graph::Value& kc = g.value(p->inputs[1]);
  REQUIRE(kc.kind == ValueKind::constant);
  CHECK(kc.constant.to_vector<float>() == std::vector<float>{0.f, 5.f, 10.f});
}

TEST_CASE("graph pass simplify: identities go, everything else stays", "[jit]") {
  Graph g;
  ValueId x = input(g, {2, 3});
  ValueId one = scalar_const(g, 1.0), zero = scalar_const(g, 0.0), two = scalar_const(g, 2.0);
  ValueId a = node(g, "mul", {x, one});                 // -> x
  ValueId b = node(g, "add", {a, zero});                // -> x
  ValueId c = node(g, "sub", {b, zero}, {{"alpha", Scalar(1)}});  // -> x
  ValueId d = node(g, "div", {c, one});                 // -> x
  ValueId e = node(g, "mul", {d, two});                 // stays
  ValueId f = node(g, "to_dtype", {e}, {{"dtype", DType::f32}});  // same dtype -> e
  ValueId p1 = node(g, "permute", {f}, {{"dims", std::vector<int64_t>{1, 0}}});
  ValueId p2 = node(g, "permute", {p1}, {{"dims", std::vector<int64_t>{1, 0}}});  // identity pair -> f
  ValueId v1 = node(g, "view", {p2}, {{"shape", std::vector<int64_t>{3, 2}}});
  ValueId v2 = node(g, "view", {v1}, {{"shape", std::vector<int64_t>{6}}});     // -> view(f, [6])
  ValueId bf = node(g, "to_dtype", {v2}, {{"dtype", DType::bf16}});
  ValueId back = node(g, "to_dtype", {bf}, {{"dtype", DType::f32}});            // lossy round trip: stays
  ValueId wide = node(g, "add", {x, node(g, "full", {}, {{"shape", std::vector<int64_t>{4, 2, 3}}, {"dtype", DType::f32},
                                                          {"device", Device()}, {"value", Scalar(0.0)}})});  // broadcasts: stays
  g.outputs = {back, wide};
  CHECK(graph::simplify(g) > 0);
  graph::verify(g, "after simplify");
  graph::dce(g);
  CHECK(count_op(g, "mul") == 1);
  CHECK(count_op(g, "div") == 0);
  CHECK(count_op(g, "sub") == 0);
  CHECK(count_op(g, "permute") == 0);
  CHECK(count_op(g, "view") == 1);
  CHECK(count_op(g, "to_dtype") == 2);
  CHECK(count_op(g, "add") == 1);
  const graph::Node* mul = nullptr;
  for (const auto& n : g.nodes)
    if (n.op->name == "mul") mul = &n;
  REQUIRE(mul);
  CHECK(mul->inputs[0] == g.inputs[0]);
}

TEST_CASE("graph pass simplify: composes two permutes into one", "[jit]") {
  Graph g;
  ValueId x = input(g, {2, 3, 4});
  ValueId p1 = node(g, "permute", {x}, {{"dims", std::vector<int64_t>{1, 2, 0}}});
  ValueId p2 = node(g, "permute", {p1}, {{"dims", std::vector<int64_t>{1, 0, 2}}});
  g.outputs = {p2};
  graph::simplify(g);
  graph::dce(g);
  graph::verify(g, "after simplify");
  REQUIRE(count_op(g, "permute") == 1);
  CHECK(g.producer(g.outputs[0])->attrs.get_ints("dims") == std::vector<int64_t>{2, 1, 0});
  CHECK(g.meta(g.outputs[0]).shape == Shape{4, 3, 2});
}

TEST_CASE("graph pass fuse: elementwise chains, matmul epilogues, rowwise regions", "[jit]") {
  SECTION("an elementwise chain is one region; a view splits it") {
    Graph g;
    ValueId x = input(g, {8, 16}), w = input(g, {16});
    ValueId a = node(g, "mul", {x, w});
    ValueId b = node(g, "exp", {a});
    ValueId v = node(g, "permute", {b}, {{"dims", std::vector<int64_t>{1, 0}}});
    ValueId c = node(g, "neg", {v});
    ValueId d = node(g, "abs", {c});
    g.outputs = {d};
    CHECK(graph::fuse(g) == 4);
    graph::verify(g, "after fuse");
    REQUIRE(g.regions.size() == 2);
    CHECK(g.regions[0].nodes.size() == 2);
    CHECK(g.regions[0].outputs == std::vector<ValueId>{b});
    CHECK(g.producer(v)->region == -1);
  }
  SECTION("matmul + bias + gelu + residual") {
    Graph g;
    ValueId x = input(g, {8, 16}), w = input(g, {16, 32}), b = input(g, {32}), r = input(g, {8, 32});
    ValueId m = node(g, "matmul", {x, w});
    ValueId y = node(g, "gelu", {node(g, "add", {m, b})}, {{"tanh_approx", false}});
    ValueId z = node(g, "add", {y, r});
    g.outputs = {z};
    graph::fuse(g);
    graph::verify(g, "after fuse");
    REQUIRE(g.regions.size() == 1);
    CHECK(g.regions[0].kind == graph::RegionKind::matmul_epilogue);
    CHECK(g.regions[0].nodes.size() == 4);
  }
  SECTION("a reduction over a leading dim is not fused; its consumer does not join across it") {
    Graph g;
    ValueId x = input(g, {8, 16});
    ValueId a = node(g, "exp", {x});
    ValueId s = node(g, "sum", {a}, {{"dims", std::vector<int64_t>{0}}, {"keepdim", true}});
    ValueId c = node(g, "add", {a, s});  // joining exp's region would make a cycle through sum
    ValueId d = node(g, "neg", {c});
    g.outputs = {d};
    graph::fuse(g);
    graph::verify(g, "after fuse");
    CHECK(g.producer(s)->region == -1);
    CHECK(g.producer(a)->region == -1);  // alone: dissolved
    REQUIRE(g.regions.size() == 1);
    CHECK(g.producer(c)->region == 0);
    CHECK(g.producer(d)->region == 0);
  }
}

TEST_CASE("graph pass fuse: chains that meet merge into one region unless that makes a cycle", "[jit]") {
  SECTION("an SGD-with-momentum update: two chains and their combination are one region") {
    Graph g;
    ValueId p = input(g, {64}), grad = input(g, {64}), buf = input(g, {64});
    ValueId lr = scalar_const(g, 0.1), mom = scalar_const(g, 0.9), wd = scalar_const(g, 1e-4);
    ValueId d = node(g, "add", {grad, node(g, "mul", {p, wd})});      // chain 1: weight decay
    ValueId nb = node(g, "add", {node(g, "mul", {buf, mom}), d});     // chain 2 starts at buf * mom
    ValueId np = node(g, "sub", {p, node(g, "mul", {nb, lr})});
    g.outputs = {np, nb};
    CHECK(graph::fuse(g) == 6);
    graph::verify(g, "after fuse");
    REQUIRE(g.regions.size() == 1);
    CHECK(g.regions[0].nodes.size() == 6);
    CHECK(std::is_sorted(g.regions[0].nodes.begin(), g.regions[0].nodes.end()));
    CHECK(g.regions[0].outputs.size() == 2);
  }
  SECTION("chains joined through a node outside both stay apart") {
    Graph g;
    ValueId x = input(g, {8, 16}), y = input(g, {8, 16});
    ValueId a = node(g, "neg", {node(g, "exp", {x})});
    ValueId s = node(g, "sum", {a}, {{"dims", std::vector<int64_t>{0}}, {"keepdim", true}});  // not fused
    ValueId b = node(g, "abs", {node(g, "mul", {y, s})});  // reads region 1 through the sum
    ValueId c = node(g, "add", {b, a});  // its producers' regions: merging them would cycle through sum
    g.outputs = {c};
    graph::fuse(g);
    graph::verify(g, "after fuse");
    CHECK(g.regions.size() == 2);
    CHECK(g.producer(a)->region != g.producer(b)->region);
    CHECK(g.producer(s)->region == -1);
  }
}

TEST_CASE("graph pass plan_buffers: reuses dead buffers, never two live values in one slot", "[jit]") {
  Graph g;
  ValueId x = input(g, {1024});
  ValueId v = x;
  std::vector<ValueId> chain;
  for (int i = 0; i < 6; ++i) {
    v = node(g, i % 2 ? "exp" : "neg", {v});
    chain.push_back(v);
  }
  ValueId side = node(g, "abs", {chain[1]});
  ValueId out = node(g, "add", {v, side});
  g.outputs = {out};
  CHECK(graph::plan_buffers(g) >= 2);
  graph::verify(g, "after plan");
  const auto& p = g.plan;
  CHECK(p.planned_peak_bytes < p.unplanned_bytes);
  CHECK(p.slot_of[static_cast<size_t>(out)] == -1);  // graph outputs get their own buffers
  // chain[1] lives until `side` is computed (step 7): nothing computed in between may share its slot.
  for (int i = 2; i < 6; ++i) CHECK(p.slot_of[static_cast<size_t>(chain[static_cast<size_t>(i)])] != p.slot_of[static_cast<size_t>(chain[1])]);
  CHECK(p.slot_of[static_cast<size_t>(side)] != p.slot_of[static_cast<size_t>(v)]);
  CHECK(p.slot_of[static_cast<size_t>(chain[2])] != p.slot_of[static_cast<size_t>(chain[3])]);
}

TEST_CASE("graph verifier: catches bad shapes, dangling values and bad regions", "[jit]") {
  Graph g;
  ValueId x = input(g, {2, 3});
  ValueId a = node(g, "exp", {x});
  g.outputs = {a};
  graph::verify(g, "ok");
  Graph bad_shape = g;
  bad_shape.values[static_cast<size_t>(a)].meta.shape = Shape{3, 2};
  CHECK_THROWS_WITH(graph::verify(bad_shape, "t"), Catch::Contains("exp") && Catch::Contains("f32[3, 2]"));
  Graph dangling = g;
  dangling.nodes[0].inputs[0] = a;  // reads its own output
  CHECK_THROWS_WITH(graph::verify(dangling, "t"), Catch::Contains("before it is defined"));
  Graph region = g;
  region.regions.push_back({});
  region.regions[0].nodes = {0};
  CHECK_THROWS_WITH(graph::verify(region, "t"), Catch::Contains("region 0"));
}

}  // namespace
}  // namespace tpu
