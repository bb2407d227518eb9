// Text printer and JSON round trip of graphs; malformed JSON is a tpu::Error, never a crash.
#include "graph/printer.h"
#include "graph_builder.h"

namespace tpu {
namespace {
using namespace graph_testing;

Graph sample_graph() {
  Graph g;
  ValueId x = input(g, {4, 8}), w = input(g, {8}, DType::f32);
  ValueId c = scalar_const(g, 0.5);
  ValueId a = node(g, "mul", {x, w});
  ValueId b = node(g, "add", {a, c}, {{"alpha", Scalar(2.0)}});
  ValueId s = node(g, "softmax", {b}, {{"dim", int64_t{-1}}});
  ValueId m = node(g, "sum", {s}, {{"dims", std::vector<int64_t>{-1}}, {"keepdim", true}});
  ValueId h = node(g, "to_dtype", {m}, {{"dtype", DType::bf16}});
  g.outputs = {h, s};
  graph::optimize(g, graph::PassOptions{.verify = true});
  return g;
}

TEST_CASE("graph printer: one node a line with metas, attrs and regions", "[jit]") {
  Graph g = sample_graph();
  const std::string t = graph::to_text(g);
  INFO(t);
  CHECK(t.rfind("graph(%0: f32[4, 8], %1: f32[8]):", 0) == 0);
  CHECK(t.find("= mul(%0, %1)") != std::string::npos);
  CHECK(t.find("alpha=2") != std::string::npos);
  CHECK(t.find("softmax(") != std::string::npos);
  CHECK(t.find("dtype=bf16") != std::string::npos);
  CHECK(t.find("# region 0: rowwise over [4, 8]") != std::string::npos);
  CHECK(t.find("return (") != std::string::npos);
}

TEST_CASE("graph JSON: round trip keeps the graph, its regions and plan", "[jit]") {
  Graph g = sample_graph();
  const std::string j = graph::to_json(g);
  Graph h = graph::from_json(j);
  CHECK(graph::to_json(h) == j);
  CHECK(graph::to_text(h) == graph::to_text(g));
  CHECK(graph::structural_hash(h) == graph::structural_hash(g));
  CHECK(h.regions.size() == g.regions.size());
  CHECK(h.plan.valid == g.plan.valid);
}

TEST_CASE("graph JSON: malformed input is a clear tpu::Error", "[jit]") {
  const std::string good = graph::to_json(sample_graph());
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    size_t p = s.find(from);
    REQUIRE(p != std::string::npos);
    s.replace(p, from.size(), to);
    return s;
  };
  CHECK_THROWS_AS(graph::from_json("{not json"), Error);
  CHECK_THROWS_WITH(graph::from_json("{not json"), Catch::Contains("malformed"));
  CHECK_THROWS_WITH(graph::from_json("[]"), Catch::Contains("not a tpucore graph"));
  CHECK_THROWS_WITH(graph::from_json(edit("\"version\":1", "\"version\":7")), Catch::Contains("version"));
  CHECK_THROWS_WITH(graph::from_json(edit("\"op\":\"mul\"", "\"op\":\"no_such_op\"")), Catch::Contains("unknown op 'no_such_op'"));
  CHECK_THROWS_WITH(graph::from_json(edit("\"dtype\":\"f32\"", "\"dtype\":\"f99\"")), Catch::Contains("f99"));
  CHECK_THROWS_WITH(graph::from_json(edit("\"inputs\":[0,1]", "\"inputs\":[0,1000]")), Catch::Contains("1000"));
  CHECK_THROWS_WITH(graph::from_json(edit("\"shape\":[4,8]", "\"shape\":[4,9]")), Catch::Contains("graph verifier"));
  CHECK_THROWS_WITH(graph::from_json(edit("\"nodes\":", "\"nodez\":")), Catch::Contains("malformed"));
  CHECK_THROWS_WITH(graph::from_json(edit("\"kind\":\"input\"", "\"kind\":\"banana\"")), Catch::Contains("banana"));
  // Numbers where integers belong: a float (4.7e23 once reached an undefined float -> int64 conversion,
  // found by fuzz_graph_json), an integer past int64, and one past int32 where the field is an int.
  CHECK_THROWS_WITH(graph::from_json(edit("\"shape\":[4,8]", "\"shape\":[4,4.66667e+23]")), Catch::Contains("must be an integer"));
  CHECK_THROWS_WITH(graph::from_json(edit("\"shape\":[4,8]", "\"shape\":[4,8.5]")), Catch::Contains("must be an integer"));
  CHECK_THROWS_WITH(graph::from_json(edit("\"shape\":[4,8]", "\"shape\":[4,18446744073709551615]")), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(graph::from_json(edit("\"inputs\":[0,1]", "\"inputs\":[0,1e300]")), Catch::Contains("must be an integer"));
  CHECK_THROWS_WITH(graph::from_json(edit("\"version\":1", "\"version\":1e300")), Catch::Contains("version"));
  CHECK_THROWS_WITH(graph::from_json(edit("\"region\":", "\"region\":4294967296,\"x\":")), Catch::Contains("node region"));
  CHECK_THROWS_WITH(graph::from_json(edit("[\"dim\",\"int\",-1]", "[\"dim\",\"int\",-1e30]")), Catch::Contains("int attribute"));
  // Truncations at many points: always an Error, never a crash.
  for (size_t cut = 1; cut < good.size(); cut += good.size() / 37 + 1) CHECK_THROWS_AS(graph::from_json(good.substr(0, cut)), Error);
}

}  // namespace
}  // namespace tpu
