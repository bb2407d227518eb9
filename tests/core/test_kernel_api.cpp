// The kernel API in the cpu interpreter: block specs, ragged edges, squeezed dims, scratch
// accumulators, block math, and the errors a bad kernel gives. References are naive loops.
#include <catch2/catch.hpp>

#include <cmath>

#include "examples/kernels/flash_attention.h"
#include "examples/kernels/matmul_epilogue.h"
#include "tpucore/kernel.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace tpu::kernel;

Tensor host(const std::vector<float>& v, const Shape& s) { return from_vector(v, s); }

std::vector<float> random_values(int64_t n, uint64_t seed) {
  Generator g(seed);
  return randn({n}, {}, &g).to_vector<float>();
}

void check_close(const std::vector<float>& got, const std::vector<double>& want, double rtol, double atol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    REQUIRE(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]));
  }
}

KernelDef add_one_rows(int64_t rows, int64_t cols, int64_t block_rows) {
  KernelDef k;
  k.name = "add_one";
  k.grid = {(rows + block_rows - 1) / block_rows};
  k.in_specs = {{.block_shape = {block_rows, cols}, .index_map = [](auto g) { return Index{g[0], 0}; }}};
  k.out_specs = k.in_specs;
  k.body = [](KernelContext& c) { c.out(0).store(c.in(0).load() + 1.0); };
  return k;
}

TEST_CASE("kernel api: hello block adds one over a grid with a ragged last block", "[kernel]") {
  const int64_t rows = 10, cols = 7;
  const std::vector<float> x = random_values(rows * cols, 1);
  Tensor y = call(add_one_rows(rows, cols, 4), {host(x, {rows, cols})}, {{Shape{rows, cols}, DType::f32}})[0];
  std::vector<double> want;
  for (float v : x) want.push_back(static_cast<double>(static_cast<float>(v + 1.0f)));
  check_close(y.to_vector<float>(), want, 0, 0);
}

TEST_CASE("kernel api: a tiled matmul with a bias + activation epilogue equals naive loops", "[kernel]") {
  const int64_t m = 37, k = 50, n = 29;  // none a multiple of the blocks
  const std::vector<float> x = random_values(m * k, 2), w = random_values(k * n, 3), b = random_values(n, 4);
  for (auto [act, dt] : {std::pair{examples::Act::relu, DType::f32}, std::pair{examples::Act::silu, DType::f32},
                         std::pair{examples::Act::relu, DType::bf16}}) {
    DYNAMIC_SECTION("act " << static_cast<int>(act) << " " << dtype_name(dt)) {
      Tensor tx = host(x, {m, k}).to(dt), tw = host(w, {k, n}).to(dt), tb = host(b, {n});
      std::vector<float> xr = tx.to(DType::f32).to_vector<float>(), wr = tw.to(DType::f32).to_vector<float>();
      TensorType xt{tx.shape(), dt}, wt{tw.shape(), dt}, bt{tb.shape(), DType::f32};
      std::vector<TensorType> ins{xt, wt, bt}, outs{{Shape{m, n}, dt}};
      KernelDef kd = examples::matmul_epilogue_kernel(ins, outs,
                                                     {{"bm", 16}, {"bn", 8}, {"bk", 16}, {"act", static_cast<int64_t>(act)}});
      CHECK(kd.grid == Index{3, 4, 4});
      Tensor y = call(kd, std::vector<Tensor>{tx, tw, tb}, outs)[0];
      std::vector<double> want;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = b[static_cast<size_t>(j)];
          for (int64_t p = 0; p < k; ++p) s += static_cast<double>(xr[static_cast<size_t>(i * k + p)]) * wr[static_cast<size_t>(p * n + j)];
          if (act == examples::Act::relu) s = std::max(s, 0.0);
          else s = s / (1.0 + std::exp(-s));
          want.push_back(dt == DType::bf16 ? static_cast<double>(bf16(static_cast<float>(s)).to_f32()) : s);
        }
      // f32: accumulation in f32 over 50 terms; bf16: the result rounded to bf16 once.
      if (dt == DType::f32) check_close(y.to_vector<float>(), want, 1e-5, 1e-5);
      else check_close(y.to(DType::f32).to_vector<float>(), want, 1.0 / 128, 1e-2);
    }
  }
}

TEST_CASE("kernel api: row softmax from row max, exp and row sum", "[kernel]") {
  const int64_t rows = 6, cols = 13;
  const std::vector<float> x = random_values(rows * cols, 5);
  KernelDef k;
  k.name = "softmax_rows";
  k.grid = {3};
  k.in_specs = {{.block_shape = {2, cols}, .index_map = [](auto g) { return Index{g[0], 0}; }}};
  k.out_specs = k.in_specs;
  k.body = [](KernelContext& c) {
    Value v = c.in(0).load();
    Value e = exp(v - row_max(v));
    c.out(0).store(e / row_sum(e));
  };
  Tensor y = call(k, {host(x, {rows, cols})}, {{Shape{rows, cols}, DType::f32}})[0];
  std::vector<double> want;
  for (int64_t i = 0; i < rows; ++i) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, static_cast<double>(x[static_cast<size_t>(i * cols + j)]));
    for (int64_t j = 0; j < cols; ++j) s += std::exp(x[static_cast<size_t>(i * cols + j)] - mx);
    for (int64_t j = 0; j < cols; ++j) want.push_back(std::exp(x[static_cast<size_t>(i * cols + j)] - mx) / s);
  }
  check_close(y.to_vector<float>(), want, 1e-5, 1e-6);
}

TEST_CASE("kernel api: iota, where and masked stores write the lower triangle only", "[kernel]") {
  const int64_t n = 9;
  KernelDef k;
  k.name = "tril_fill";
  k.grid = {3, 3};
  k.in_specs = {};
  k.out_specs = {{.block_shape = {4, 4}, .index_map = [](auto g) { return Index{g[0], g[1]}; }}};
  k.body = [](KernelContext& c) {
    Ref o = c.out(0);
    Value row = iota(o.shape(), 0) + o.offset(0) * 1.0, col = iota(o.shape(), 1) + o.offset(1) * 1.0;
    Value val = cast(row * 10.0 + col, DType::f32);
    o.store(val, ge(row, col));
  };
  // grid 3 x 3 blocks of 4 over 9: the last row/column blocks are ragged
  Tensor y = call(k, {}, {{Shape{n, n}, DType::f32}})[0];
  std::vector<double> want;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) want.push_back(i >= j ? static_cast<double>(i * 10 + j) : 0.0);
  check_close(y.to_vector<float>(), want, 0, 0);
}

TEST_CASE("kernel api: squeezed block dims and reductions along an axis", "[kernel]") {
  const int64_t b = 3, s = 5, d = 4;
  const std::vector<float> x = random_values(b * s * d, 6);
  KernelDef k;
  k.name = "sum_seq";
  k.grid = {b};
  k.in_specs = {{.block_shape = {squeezed, s, d}, .index_map = [](auto g) { return Index{g[0], 0, 0}; }}};
  k.out_specs = {{.block_shape = {squeezed, d}, .index_map = [](auto g) { return Index{g[0], 0}; }}};
  k.body = [](KernelContext& c) {
    REQUIRE(c.in(0).shape() == std::vector<int64_t>{5, 4});
    c.out(0).store(sum(c.in(0).load(), 0, false));
  };
  Tensor y = call(k, {host(x, {b, s, d})}, {{Shape{b, d}, DType::f32}})[0];
  std::vector<double> want;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < d; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < s; ++t) acc += x[static_cast<size_t>((i * s + t) * d + j)];
      want.push_back(acc);
    }
  check_close(y.to_vector<float>(), want, 1e-6, 1e-6);
}

TEST_CASE("kernel api: ragged loads read the fill value and valid() counts the elements inside", "[kernel]") {
  KernelDef k;
  k.name = "row_counts";
  k.grid = {2};
  k.in_specs = {{.block_shape = {3, 4}, .index_map = [](auto g) { return Index{g[0], 0}; }}};
  k.out_specs = {{.block_shape = {3, 1}, .index_map = [](auto g) { return Index{g[0], 0}; }}};
  k.body = [](KernelContext& c) {
    Ref in = c.in(0);
    CHECK(in.valid(0) == (c.program_id(0) == 0 ? 3 : 2));
    // max over rows with -inf padding: padding never wins; the valid mask counts real elements
    c.out(0).store(row_max(in.load(-INFINITY)) + row_sum(cast(in.valid_mask(), DType::f32)));
  };
  std::vector<float> x(20);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  Tensor y = call(k, {host(x, {5, 4})}, {{Shape{5, 1}, DType::f32}})[0];
  std::vector<double> want;
  for (int64_t i = 0; i < 5; ++i) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < 4; ++j) mx = std::max(mx, static_cast<double>(x[static_cast<size_t>(i * 4 + j)]));
    want.push_back(mx + 4);
  }
  check_close(y.to_vector<float>(), want, 0, 0);
}

TEST_CASE("kernel api: bad kernels are errors naming the problem", "[kernel][errors]") {
  Tensor x = zeros({64, 64});
  SECTION("a block larger than the vector-memory budget names the block, the budget and the shape") {
    KernelDef k = add_one_rows(64, 64, 64);
    k.in_specs[0].name = "x";
    k.vmem_budget_bytes = 16384;
    CHECK_THROWS_WITH(call(k, {x}, {{Shape{64, 64}, DType::f32}}),
                      Catch::Contains("input 0 ('x') block f32 [64, 64]") && Catch::Contains("32768 bytes") &&
                          Catch::Contains("budget of 16384 bytes"));
  }
  SECTION("blocks that fit alone but not together list every block") {
    KernelDef k = add_one_rows(64, 64, 32);
    k.vmem_budget_bytes = 20000;
    CHECK_THROWS_WITH(call(k, {x}, {{Shape{64, 64}, DType::f32}}),
                      Catch::Contains("32768 bytes of vector memory together") && Catch::Contains("output 0 f32 [32, 64]"));
  }
  SECTION("an index map out of range names the operand, the grid index and the block index") {
    KernelDef k = add_one_rows(64, 64, 16);
    k.in_specs[0].index_map = [](auto g) { return Index{g[0] + 1, 0}; };
    CHECK_THROWS_WITH(call(k, {x}, {{Shape{64, 64}, DType::f32}}),
                      Catch::Contains("index map of input 0 gave block index [4, 0] at grid index [3]") &&
                          Catch::Contains("[4, 1] blocks per dim"));
  }
  SECTION("an index map of the wrong rank") {
    KernelDef k = add_one_rows(64, 64, 16);
    k.out_specs[0].index_map = [](auto g) { return Index{g[0]}; };
    CHECK_THROWS_WITH(call(k, {x}, {{Shape{64, 64}, DType::f32}}), Catch::Contains("gave 1 entries"));
  }
  SECTION("a dtype mismatch in a dot names both operands") {
    KernelDef k = add_one_rows(64, 64, 64);
    k.body = [](KernelContext& c) {
      Value a = c.in(0).load();
      c.out(0).store(dot(a, cast(a, DType::bf16)));
    };
    CHECK_THROWS_WITH(call(k, {x}, {{Shape{64, 64}, DType::f32}}),
                      Catch::Contains("dot: dtype mismatch: a is f32 [64, 64], b is bf16 [64, 64]"));
  }
  SECTION("a missing parameter, a store into an input, a wrong block shape, an unsupported dtype") {
    KernelDef k = add_one_rows(64, 64, 64);
    k.body = [](KernelContext& c) { c.out(0).store(full({1}, static_cast<double>(c.param("bm")))); };
    CHECK_THROWS_WITH(call(k, {x}, {{Shape{64, 64}, DType::f32}}), Catch::Contains("no compile-time parameter 'bm'"));
    k.body = [](KernelContext& c) { c.in(0).store(c.in(0).load()); };
    CHECK_THROWS_WITH(call(k, {x}, {{Shape{64, 64}, DType::f32}}), Catch::Contains("inputs are read-only"));
    k.body = [](KernelContext& c) { c.out(0).store(full({3, 5}, 1.0)); };
    CHECK_THROWS_WITH(call(k, {x}, {{Shape{64, 64}, DType::f32}}),
                      Catch::Contains("value of shape [3, 5] into output 0 whose block has shape [64, 64]"));
    CHECK_THROWS_WITH(call(k, {x.to(DType::i64)}, {{Shape{64, 64}, DType::f32}}), Catch::Contains("has dtype i64"));
  }
  SECTION("inputs on two devices name both") {
    KernelDef k = add_one_rows(64, 64, 64);
    k.in_specs.push_back(k.in_specs[0]);
    CHECK_THROWS_WITH(call(k, {x, x.to(Device("sim:0"))}, {{Shape{64, 64}, DType::f32}}),
                      Catch::Contains("inputs on cpu and sim:0"));
  }
}

}  // namespace
}  // namespace tpu

namespace tpu {
namespace {

// softmax(q k^T / sqrt(D)) v per head in double, naive loops.
std::vector<double> naive_attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                    int64_t h, int64_t s, int64_t sk, int64_t d, bool causal) {
  std::vector<double> o(static_cast<size_t>(h * s * d), 0.0);
  for (int64_t b = 0; b < h; ++b)
    for (int64_t i = 0; i < s; ++i) {
      std::vector<double> w(static_cast<size_t>(sk));
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < sk; ++j) {
        double dotv = 0;
        for (int64_t e = 0; e < d; ++e) dotv += double(q[size_t((b * s + i) * d + e)]) * k[size_t((b * sk + j) * d + e)];
        w[size_t(j)] = causal && j > i ? -INFINITY : dotv / std::sqrt(double(d));
        mx = std::max(mx, w[size_t(j)]);
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j < sk; ++j)
        for (int64_t e = 0; e < d; ++e) o[size_t((b * s + i) * d + e)] += w[size_t(j)] / sum * v[size_t((b * sk + j) * d + e)];
    }
  return o;
}

TEST_CASE("kernel api: flash attention with online softmax equals naive attention", "[kernel]") {
  for (bool causal : {false, true}) {
    DYNAMIC_SECTION("causal " << causal) {
      const int64_t h = 3, s = 13, sk = causal ? 13 : 11, d = 8;
      const std::vector<float> q = random_values(h * s * d, 21), k = random_values(h * sk * d, 22),
                               v = random_values(h * sk * d, 23);
      Tensor o = examples::flash_attention_op()(
          {from_vector(q, {h, s, d}), from_vector(k, {h, sk, d}), from_vector(v, {h, sk, d})},
          {{"bq", 4}, {"bk", 4}, {"causal", causal ? 1 : 0}});
      check_close(o.to_vector<float>(), naive_attention(q, k, v, h, s, sk, d, causal), 1e-5, 1e-5);
    }
  }
}

}  // namespace
}  // namespace tpu
