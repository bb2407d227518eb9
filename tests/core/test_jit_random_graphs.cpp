// Random graphs through the whole JIT: elementwise chains that meet, reductions over the
// leading dim (not fused: a path around a region), row reductions and softmax (row-wise
// regions), broadcasts, several outputs. Each graph must compile (the fusion pass must never
// form a cycle), and the compiled results must equal eager ones computed by the same code.
#include <random>

#include "codegen_testing.h"
#include "jit_testing.h"

namespace tpu::testing {
namespace {

struct RandomNode {
  int kind, op, a, b;
};

// A recipe of `n` nodes over 3 inputs, all [R, C] or broadcastable to it.
// `casts`: include bf16 round trips (kind 6).
std::vector<RandomNode> recipe(uint32_t seed, int n, bool casts = true) {
  std::mt19937 rng(seed);
  std::vector<RandomNode> r;
  for (int i = 0; i < n; ++i) {
    const int avail = 3 + i;
    // Prefer recent values (chains), sometimes reach far back (chains that meet).
    auto pick = [&] {
      const int back = static_cast<int>(rng() % 4 == 0 ? rng() % avail : rng() % std::min(avail, 3));
      return avail - 1 - back;
    };
    const int k = static_cast<int>(rng() % 14);
    int kind = k < 4 ? 0 : k < 8 ? 1 : k == 8 ? 2 : k == 9 ? 3 : k - 6;  // 0-3, then 4-7
    if (kind == 6 && !casts) kind = 1;
    r.push_back({kind, static_cast<int>(rng() % 6), pick(), pick()});
  }
  return r;
}

// The weight of the matmul nodes, [C, C], captured by the traced function: set per device
// before tracing (a tensor made while tracing would be a proxy), released when the test ends
// (a chip tensor left alive would pin its device for the tests after).
Tensor g_weight;
struct ReleaseWeight {
  ~ReleaseWeight() { g_weight = Tensor(); }
};

std::vector<Tensor> run_recipe(const std::vector<RandomNode>& nodes, const std::vector<Tensor>& in) {
  std::vector<Tensor> v(in.begin(), in.end());
  for (const RandomNode& n : nodes) {
    const Tensor& a = v[static_cast<size_t>(n.a)];
    const Tensor& b = v[static_cast<size_t>(n.b)];
    Tensor y;
    switch (n.kind) {
      case 0:  // unary, bounded
        switch (n.op) {
          case 0: y = tanh(a); break;
          case 1: y = sigmoid(a); break;
          case 2: y = relu(a) - a * 0.25; break;
          case 3: y = neg(a); break;
          case 4: y = abs(a) * 0.5; break;
          default: y = gelu(a); break;
        }
        break;
      case 1:  // binary, broadcasting
        switch (n.op) {
          case 0: y = a + b; break;
          case 1: y = a - b * 0.5; break;
          case 2: y = a * b; break;
          case 3: y = maximum(a, b); break;
          case 4: y = minimum(a, b); break;
          default: y = a / (abs(b) + 1.0); break;
        }
        break;
      case 2:  // reductions: over the leading dim (not fused) or the last (row-wise)
        y = n.op % 2 ? mean(a, {0}, true) : sum(a, {-1}, true) * 0.1;
        break;
      case 3:  // softmax over the row, or a row broadcast back to [R, C]
        y = n.op % 2 ? softmax(a, -1) : a + mean(b, {-1}, true);
        break;
      case 4:  // a matmul (its epilogue fuses) with a weight captured by the function
        y = matmul(a + v[0] * 0.0, g_weight) * 0.3;
        break;
      case 5: {  // views: reshape to another shape and transpose back
        const Tensor full = a + v[0] * 0.0;  // [R, C] whatever a's broadcast shape
        y = full.reshape({full.size(1), full.size(0)}).transpose(0, 1) * 0.9 + b;
        break;
      }
      case 6:  // casts through bf16
        y = (a.to(DType::bf16) * b.to(DType::bf16)).to(DType::f32) + a;
        break;
      default:  // compare and select
        y = where(gt(a, b), a, b * 0.5);
        break;
    }
    v.push_back(y);
  }
  // The last value and two others as outputs.
  return {v.back(), v[v.size() / 2], v[3 + nodes.size() / 3]};
}

}  // namespace

TEST_CASE("jit: random graphs compile without cycles and match eager on the cpu", "[jit]") {
  const ReleaseWeight release;
  g_weight = jit_testing::rnd({10, 10}, 77) * 0.3;
  int regions = 0;
  for (uint32_t seed = 1; seed <= 400; ++seed) {
    const auto nodes = recipe(seed, 6 + static_cast<int>(seed % 40));
    std::vector<Tensor> in = {jit_testing::rnd({6, 10}, seed), jit_testing::rnd({6, 10}, seed + 1000),
                              jit_testing::rnd({1, 10}, seed + 2000)};
    auto fn = [&](const std::vector<Tensor>& x) { return run_recipe(nodes, x); };
    auto f = compile(fn, {.name = "random_graph", .verify = 1});
    INFO("seed " << seed);
    const std::vector<Tensor> got = f(in), want = fn(in);
    for (const std::string& t : f.graphs())
      for (size_t at = t.find("\n# region "); at != std::string::npos; at = t.find("\n# region ", at + 1)) ++regions;
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i)
      jit_testing::expect_close(got[i], want[i], 1e-3, 1e-4, "seed " + std::to_string(seed) + " output " + std::to_string(i));
  }
  CHECK(regions >= 400);  // the graphs do fuse (a few regions each)
}

TEST_CASE("jit: random graphs compile and match eager on sim", "[jit][codegen]") {
  TinySim tiny;
  const ReleaseWeight release;
  g_weight = (jit_testing::rnd({10, 10}, 77) * 0.3).to(tiny.dev());
  auto region_runs = [] {
    uint64_t n = 0;
    for (const auto& [k, v] : codegen::stats().runs_by_kernel)
      if (k.rfind("region:", 0) == 0) n += v;
    return n;
  };
  const uint64_t runs0 = region_runs();
  for (uint32_t seed = 1; seed <= 100; ++seed) {
    // No bf16 round trips: a fused chip kernel keeps bf16 intermediates in f32 and rounds only
    // what it stores (eager rounds every op's result), so a comparison downstream may flip.
    const auto nodes = recipe(seed, 6 + static_cast<int>(seed % 30), false);
    std::vector<Tensor> in = {jit_testing::rnd({6, 10}, seed).to(tiny.dev()),
                              jit_testing::rnd({6, 10}, seed + 1000).to(tiny.dev()),
                              jit_testing::rnd({1, 10}, seed + 2000).to(tiny.dev())};
    auto fn = [&](const std::vector<Tensor>& x) { return run_recipe(nodes, x); };
    auto f = compile(fn, {.name = "random_graph_sim"});
    INFO("seed " << seed);
    const std::vector<Tensor> got = f(in), want = fn(in);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i)
      jit_testing::expect_close(got[i].to("cpu"), want[i].to("cpu"), 1e-3, 1e-4,
                                "seed " + std::to_string(seed) + " output " + std::to_string(i));
  }
  CHECK(region_runs() >= runs0 + 100);  // fused regions ran as chip kernels
}

}  // namespace tpu::testing
