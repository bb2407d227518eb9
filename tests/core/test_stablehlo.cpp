// StableHLO export (graph/stablehlo.h): module structure, the ops each tpucore op becomes, every
// unmapped op named in the error, the two attribute syntaxes, and (hidden case, run by its own
// CTest when mlir-opt is installed) Debian's mlir-opt parsing every exported module.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>

#include "tpucore/export.h"
#include "testing.h"
#include "tpucore/ops.h"

namespace tpu::testing {
namespace {

using Catch::Matchers::Contains;
using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct Example {
  const char* name;
  std::vector<Tensor> inputs;
  Fn fn;
  std::vector<const char*> expect;  // ops the module must contain
};

std::vector<Example> examples() {
  const Tensor w1 = rn({32, 16}, 1), b1 = rn({32}, 2), w2 = rn({8, 32}, 3);
  return {
      {"mlp with captured weights", {rn({4, 16}, 4)},
       [=](const std::vector<Tensor>& a) { return std::vector<Tensor>{linear(gelu(linear(a[0], w1, b1)), w2)}; },
       {"stablehlo.dot_general", "stablehlo.constant", "stablehlo.exponential", "stablehlo.sign"}},
      {"elementwise, compare, select, clamp, convert", {rn({5, 7}, 5), rn({7}, 6)},
       [](const std::vector<Tensor>& a) {
         Tensor y = where(a[0] > a[1], exp(a[0]) * 2.0, tanh(a[1]) - a[0]);
         return std::vector<Tensor>{clamp(sigmoid(y), 0.1, 0.9).to(DType::bf16), logical_not(le(a[0], 0.0))};
       },
       {"stablehlo.compare", "stablehlo.select", "stablehlo.convert", "stablehlo.logistic", "stablehlo.broadcast_in_dim",
        "stablehlo.not"}},
      {"batched matmul and reductions", {rn({2, 3, 4, 5}, 7), rn({3, 5, 6}, 8)},
       [](const std::vector<Tensor>& a) {
         Tensor m = matmul(a[0], a[1]);
         return std::vector<Tensor>{sum(m, {-1}), mean(m, {0, 2}, true), amax(m), amin(m, {1})};
       },
       {"stablehlo.dot_general", "stablehlo.reduce", "stablehlo.maximum", "stablehlo.minimum", "stablehlo.divide"}},
      {"softmax, norms", {rn({3, 10}, 9), rn({10}, 10), rn({10}, 11)},
       [](const std::vector<Tensor>& a) {
         return std::vector<Tensor>{softmax(a[0], -1), log_softmax(a[0], 0), layer_norm(a[0], {10}, a[1], a[2]),
                                    rms_norm(a[0].to(DType::bf16), {10}, a[1].to(DType::bf16))};
       },
       {"stablehlo.rsqrt", "stablehlo.log", "stablehlo.reduce"}},
      {"views and joins", {rn({4, 6}, 12), rn({4, 6}, 13)},
       [](const std::vector<Tensor>& a) {
         Tensor t = a[0].transpose(0, 1).contiguous().reshape({3, 8});
         Tensor s = a[1].slice(1, 1, 6, 2);
         return std::vector<Tensor>{t, cat({s, a[0]}, 1), stack({a[0], a[1]}, 0), a[1].select(0, 2),
                                    a[0].unsqueeze(0).expand({2, 4, 6})};
       },
       {"stablehlo.transpose", "stablehlo.reshape", "stablehlo.slice", "stablehlo.concatenate"}},
      {"attention and rotary", {rn({1, 4, 6, 8}, 14), rn({1, 2, 6, 8}, 15), rn({1, 2, 6, 8}, 16), rn({6, 8}, 17)},
       [](const std::vector<Tensor>& a) {
         Tensor q = rotary_embedding(a[0], cos(a[3]), sin(a[3]));
         return std::vector<Tensor>{scaled_dot_product_attention(q, a[1], a[2], {}, true)};
       },
       {"stablehlo.iota", "stablehlo.dot_general", "stablehlo.sine", "stablehlo.cosine", "stablehlo.concatenate"}},
      {"index_select, embedding, gather, scatter_add",
       {rn({5, 4}, 18), from_vector(std::vector<int64_t>{4, 0, 2}), from_vector(std::vector<int32_t>{1, 0, 3, 3}, {2, 2})},
       [](const std::vector<Tensor>& a) {
         return std::vector<Tensor>{index_select(a[0], 1, a[1]), embedding(a[0], a[2]), gather(a[0], 1, a[2]),
                                    scatter_add(a[0], 1, a[2], a[0])};
       },
       {"stablehlo.gather", "stablehlo.scatter", "stablehlo.iota", "stablehlo.concatenate", "stablehlo.add"}},
  };
}

// The current syntax rewritten into MLIR 14's: the only differences the exporter makes.
std::string to_mlir14(std::string s) {
  static const std::regex arr(R"(array<i64(: ([-0-9, ]*))?>)"), cmp(R"(#stablehlo<comparison_direction (\w+)>)");
  std::string out;
  auto begin = std::sregex_iterator(s.begin(), s.end(), arr);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const std::string list = (*it)[2].str();
    const size_t n = list.empty() ? 0 : size_t(std::count(list.begin(), list.end(), ',') + 1);
    out += s.substr(last, size_t(it->position()) - last);
    out += "dense<[" + list + "]> : tensor<" + std::to_string(n) + "xi64>";
    last = size_t(it->position() + it->length());
  }
  out += s.substr(last);
  out = std::regex_replace(out, cmp, "#stablehlo<\"comparison_direction $1\">");
  return std::regex_replace(out, std::regex("generic form\\)"), "generic form, MLIR 14 attribute syntax)");
}

}  // namespace

TEST_CASE("stablehlo: module structure, arguments, results and captured constants", "[stablehlo]") {
  const Tensor w = rn({3, 4}, 20);
  const std::string m = export_stablehlo(
      [&](const std::vector<Tensor>& a) { return matmul(a[0], w) + a[1]; }, {rn({2, 3}, 21), rn({4}, 22)},
      {.function_name = "affine"});
  CHECK_THAT(m, Contains("StableHLO 1.0"));
  CHECK_THAT(m, Contains("\"builtin.module\"() ({") && Contains("\"func.func\"() ({"));
  CHECK_THAT(m, Contains("^bb0(%arg0: tensor<2x3xf32>, %arg1: tensor<4xf32>):"));
  CHECK_THAT(m, Contains("function_type = (tensor<2x3xf32>, tensor<4xf32>) -> (tensor<2x4xf32>), sym_name = \"affine\""));
  // The captured weight is a constant holding its bytes (first element, little-endian hex).
  const float w0 = w.to_vector<float>()[0];
  uint32_t bits;
  std::memcpy(&bits, &w0, 4);
  CHECK_THAT(m, Contains(fmt::format("\"stablehlo.constant\"() {{value = dense<\"0x{:02X}{:02X}", bits & 0xff, (bits >> 8) & 0xff)) &&
                    Contains(": tensor<3x4xf32>"));
  CHECK_THAT(m, Contains("lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]"));
  CHECK_THAT(m, Contains("\"stablehlo.broadcast_in_dim\"(%arg1) {broadcast_dimensions = array<i64: 1>} : (tensor<4xf32>) -> tensor<2x4xf32>"));
  CHECK_THAT(m, Contains("\"func.return\"("));
}

TEST_CASE("stablehlo: each example maps to the expected ops, in both syntaxes", "[stablehlo]") {
  for (const Example& e : examples()) {
    INFO(e.name);
    const std::string cur = export_stablehlo(e.fn, e.inputs);
    for (const char* op : e.expect) CHECK_THAT(cur, Contains(std::string("\"") + op + "\""));
    CHECK(cur.find("%missing") == std::string::npos);
    const std::string old = export_stablehlo(e.fn, e.inputs, {.syntax = StableHloSyntax::mlir14});
    CHECK(old.find("array<") == std::string::npos);
    CHECK(to_mlir14(cur) == old);
  }
}

TEST_CASE("stablehlo: ops without a counterpart are named in one error", "[stablehlo]") {
  const Tensor x = rn({4, 5}, 30);
  CHECK_THROWS_WITH(export_stablehlo(
                        [&](const std::vector<Tensor>& a) {
                          return std::vector<Tensor>{argmax(a[0], 1), argmin(a[0], 0), a[0] + 1.0};
                        },
                        {x}),
                    Contains("2 op(s)") && Contains("'argmax'") && Contains("'argmin'") &&
                        Contains("StableHLO 1.0"));
  // A graph break inside the function is an error too; the runtime stays usable.
  CHECK_THROWS(export_stablehlo([&](const std::vector<Tensor>& a) { return a[0] * a[0].sum().item().to_double(); }, {x}));
  CHECK_THROWS_WITH(export_stablehlo([&](const std::vector<Tensor>& a) { return a[0]; }, {Tensor()}),
                    Contains("undefined"));
  CHECK(sum(x * 0.0).item().to_double() == 0.0);
}

// Run by the CTest "stablehlo: mlir-opt parses every exported module" (tests/CMakeLists.txt) when
// mlir-opt is installed, with TPU_MLIR_OPT set to it.
TEST_CASE("stablehlo: mlir-opt parses every exported module", "[.mlir]") {
  const char* tool = std::getenv("TPU_MLIR_OPT");
  REQUIRE(tool != nullptr);
  int k = 0;
  for (const Example& e : examples()) {
    INFO(e.name);
    const std::string m = export_stablehlo(e.fn, e.inputs, {.syntax = StableHloSyntax::mlir14});
    const std::string path = fmt::format("/tmp/tpucore_stablehlo_{}_{}.mlir", getpid(), k++);
    std::ofstream(path) << m;
    const std::string cmd = fmt::format("'{}' --allow-unregistered-dialect '{}' > /dev/null 2> '{}.err'", tool, path, path);
    const int rc = std::system(cmd.c_str());
    std::ifstream errf(path + ".err");
    const std::string err((std::istreambuf_iterator<char>(errf)), std::istreambuf_iterator<char>());
    INFO("mlir-opt: " << err);
    CHECK(rc == 0);
    std::remove(path.c_str());
    std::remove((path + ".err").c_str());
  }
  // A module broken on purpose is rejected (the check can fail).
  const std::string bad = fmt::format("/tmp/tpucore_stablehlo_{}_bad.mlir", getpid());
  std::ofstream(bad) << "\"builtin.module\"() ({\n  %0 = \"stablehlo.add\"(%1, %1) : (tensor<f32>, tensor<f32>) -> tensor<f32>\n}) : () -> ()\n";
  CHECK(std::system(fmt::format("'{}' --allow-unregistered-dialect '{}' > /dev/null 2>&1", tool, bad).c_str()) != 0);
  std::remove(bad.c_str());
}

}  // namespace tpu::testing
