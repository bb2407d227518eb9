// Manual mode of the kernel API: scalar prefetch (index maps that follow a table, scalars read
// in the body), operands left in HBM with async copies and DMA semaphores (double-buffered
// across grid steps, both directions), the errors of a bad copy schedule, the chip's race
// checker on an unchecked body, the paged decode attention example, and i8 dots; on the cpu
// interpreter and lowered to the tiny sim chip. References are naive loops.
#include <catch2/catch.hpp>

#include <cmath>

#include "codegen/launch.h"
#include "codegen_testing.h"
#include "examples/kernels/paged_attention.h"
#include "sim/chip.h"
#include "tpucore/kernel.h"
#include "tpucore/kernel/lower_sim.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace tpu::kernel;
using testing::ChipRunProbe;
using testing::TinySim;

std::vector<float> manual_random(int64_t n, uint64_t seed) {
  Generator g(seed);
  return randn({n}, {}, &g).to_vector<float>();
}

Tensor manual_i32(const std::vector<int32_t>& v, const Shape& s) {
  return from_vector(v, s, TensorOptions(DType::i32));
}

std::vector<Tensor> manual_call(const KernelDef& k, std::vector<Tensor> in, std::vector<TensorType> out) {
  return call(k, in, out);
}

void manual_check_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  double scale = 0, diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    diff = std::max(diff, std::fabs(got[i] - want[i]));
  }
  INFO("max |diff| " << diff << " over max |want| " << scale);
  CHECK(diff <= tol * std::max(scale, 1e-30));
}

// Output block j is input block table[j] times scale[j] (blocks of 2 x 4 rows).
KernelDef gather_kernel() {
  KernelDef k;
  k.name = "gather_blocks";
  k.grid = {3};
  k.num_scalar_prefetch = 2;
  k.in_specs = {{.block_shape = {2, 4},
                 .name = "x",
                 .scalar_index_map = [](auto g, const Scalars& s) { return Index{s(0, g[0]), 0}; }}};
  k.out_specs = {{.block_shape = {2, 4}, .index_map = [](auto g) { return Index{g[0], 0}; }, .name = "y"}};
  k.body = [](KernelContext& c) { c.out(0).store(c.in(0).load() * static_cast<double>(c.scalar(1, c.program_id(0)))); };
  return k;
}

// y = 2 x + 1 over row blocks of `br`, x and y left in HBM: block g + 1 is copied in during step
// g (two slots, semaphores 0 and 1), the result goes out from scratch 2 on semaphore 2, whose
// previous copy is waited on before the buffer is written again.
KernelDef stream_kernel(int64_t rows, int64_t cols, int64_t br) {
  KernelDef k;
  k.name = "stream";
  k.grid = {rows / br};
  k.num_semaphores = 3;
  k.in_specs = {{.name = "x", .memory = MemorySpace::any}};
  k.out_specs = {{.name = "y", .memory = MemorySpace::any}};
  k.scratch = {{.shape = {br, cols}, .name = "in0"}, {.shape = {br, cols}, .name = "in1"}, {.shape = {br, cols}, .name = "out"}};
  k.body = [br, cols](KernelContext& c) {
    const int64_t g = c.program_id(0), n = c.num_programs(0);
    const int s = static_cast<int>(g % 2);
    auto in_copy = [&](int64_t j, int slot) { return c.async_copy(c.in(0).at({j * br, 0}, {br, cols}), c.scratch(slot), slot); };
    auto out_copy = [&](int64_t j) { return c.async_copy(c.scratch(2), c.out(0).at({j * br, 0}, {br, cols}), 2); };
    if (g == 0) in_copy(0, 0).start();
    if (g + 1 < n) in_copy(g + 1, 1 - s).start();
    in_copy(g, s).wait();
    if (g > 0) out_copy(g - 1).wait();
    c.scratch(2).store(c.scratch(s).load() * 2.0 + 1.0);
    out_copy(g).start();
    if (g + 1 == n) out_copy(g).wait();
  };
  return k;
}

// Naive decode attention in double: sequence b's query head hq against positions 0..lens[b]-1
// of the cache through its block table.
std::vector<double> naive_paged(const std::vector<float>& q, const std::vector<float>& kc, const std::vector<float>& vc,
                                const std::vector<int32_t>& table, const std::vector<int32_t>& lens, int64_t heads,
                                int64_t kvh, int64_t d, int64_t page, int64_t max_pages) {
  const int64_t nb = static_cast<int64_t>(lens.size()), row = kvh * d;
  std::vector<double> o(static_cast<size_t>(nb * heads * d), 0.0);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t hq = 0; hq < heads; ++hq) {
      const int64_t h = hq / (heads / kvh), len = lens[size_t(b)];
      std::vector<double> w(static_cast<size_t>(len));
      double mx = -INFINITY, sum = 0;
      auto at = [&](int64_t p) { return (table[size_t(b * max_pages + p / page)] * page + p % page) * row + h * d; };
      for (int64_t p = 0; p < len; ++p) {
        double s = 0;
        for (int64_t e = 0; e < d; ++e) s += double(q[size_t((b * heads + hq) * d + e)]) * kc[size_t(at(p) + e)];
        mx = std::max(mx, w[size_t(p)] = s / std::sqrt(double(d)));
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int64_t p = 0; p < len; ++p)
        for (int64_t e = 0; e < d; ++e) o[size_t((b * heads + hq) * d + e)] += w[size_t(p)] / sum * vc[size_t(at(p) + e)];
    }
  return o;
}

struct PagedCase {
  // Ragged lengths (one sequence empty), pages scattered over a cache of 12.
  int64_t nb = 4, heads = 4, kvh = 2, d = 8, page = 4, max_pages = 3;
  std::vector<int32_t> table{5, 1, 7, 11, 10, 9, 0, 3, 2, 8, 6, 4}, lens{9, 0, 12, 1};
  std::vector<float> q = manual_random(nb * heads * d, 31), kc = manual_random(12 * page * kvh * d, 32),
                     vc = manual_random(12 * page * kvh * d, 33);
  std::vector<Tensor> inputs(Device dev) const {
    return {manual_i32(table, {nb, max_pages}), manual_i32(lens, {nb}), from_vector(q, {nb * heads, d}).to(dev),
            from_vector(kc, {12 * page, kvh * d}).to(dev), from_vector(vc, {12 * page, kvh * d}).to(dev)};
  }
  KernelDef def(int64_t pages_per_step) const {
    return examples::paged_decode_attention_kernel(nb, heads, kvh, d, page, max_pages, 1.0 / std::sqrt(double(d)),
                                                   pages_per_step);
  }
  std::vector<double> want() const { return naive_paged(q, kc, vc, table, lens, heads, kvh, d, page, max_pages); }
};

TEST_CASE("kernel manual: an index map follows a scalar-prefetched table and the body reads scalars", "[kernel]") {
  const std::vector<float> x = manual_random(8 * 4, 41);
  const std::vector<int32_t> table{3, 0, 2}, scale{2, -1, 5};
  Tensor y = call(gather_kernel(), {manual_i32(table, {3}), manual_i32(scale, {3}), from_vector(x, {8, 4})},
                  {{Shape{6, 4}, DType::f32}})[0];
  std::vector<double> want;
  for (int64_t j = 0; j < 3; ++j)
    for (int64_t e = 0; e < 8; ++e) want.push_back(double(x[size_t(table[size_t(j)] * 8 + e)] * float(scale[size_t(j)])));
  manual_check_close(y.to_vector<float>(), want, 0);
}

TEST_CASE("kernel manual: a kernel op with scalar prefetch, eager on the cpu and the chip", "[kernel][sim]") {
  static const Op op = register_op({
      .name = "test_gather_blocks",
      .num_inputs = 3,
      .output_types = [](std::span<const TensorType>, const Params&) {
        return std::vector<TensorType>{{Shape{6, 4}, DType::f32}};
      },
      .kernel = [](std::span<const TensorType>, std::span<const TensorType>, const Params&) { return gather_kernel(); },
  });
  const std::vector<float> x = manual_random(8 * 4, 43);
  TinySim tiny;
  for (const std::vector<int32_t>& table : {std::vector<int32_t>{3, 0, 2}, std::vector<int32_t>{1, 1, 0}})
    for (Device dev : {Device(), tiny.dev()}) {
      const Tensor y = op({manual_i32(table, {3}).to(dev), manual_i32({2, -1, 5}, {3}).to(dev), from_vector(x, {8, 4}).to(dev)});
      std::vector<double> want;
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t e = 0; e < 8; ++e) want.push_back(double(x[size_t(table[size_t(j)] * 8 + e)] * float(std::vector<int>{2, -1, 5}[size_t(j)])));
      manual_check_close(y.to(Device()).to_vector<float>(), want, 0);
    }
}

TEST_CASE("kernel manual: double-buffered async copies in and out of HBM operands", "[kernel]") {
  const std::vector<float> x = manual_random(12 * 8, 42);
  Tensor y = call(stream_kernel(12, 8, 4), {from_vector(x, {12, 8})}, {{Shape{12, 8}, DType::f32}})[0];
  std::vector<double> want;
  for (float v : x) want.push_back(double(v * 2.0f + 1.0f));
  manual_check_close(y.to_vector<float>(), want, 0);
}

TEST_CASE("kernel manual: paged decode attention equals naive attention through the block tables", "[kernel]") {
  const PagedCase pc;
  for (int64_t pps : {1, 2, 0}) {  // one page per step, two (a ragged last step), all in one step
    Tensor o = manual_call(pc.def(pps), pc.inputs(Device()), {{Shape{pc.nb * pc.heads, pc.d}, DType::f32}})[0];
    manual_check_close(o.to_vector<float>(), pc.want(), 1e-5);
  }
}

TEST_CASE("kernel manual: a bad copy schedule is an error naming the problem", "[kernel][errors]") {
  const Tensor x = zeros({12, 8});
  const std::vector<TensorType> out{{Shape{12, 8}, DType::f32}};
  KernelDef k = stream_kernel(12, 8, 4);
  auto run = [&] { (void)manual_call(k, {x}, out); };
  SECTION("a copy never waited on") {
    k.body = [](KernelContext& c) {
      if (c.program_id(0) == 1) c.async_copy(c.in(0).at({4, 0}, {4, 8}), c.scratch(0), 0).start();
    };
    CHECK_THROWS_WITH(run(), Catch::Contains("from input 0 ('x') window at [4, 0] of [4, 8] into scratch 0 ('in0') on "
                                             "semaphore 0, started at grid step [1], is never waited on"));
  }
  SECTION("a wait without a start") {
    k.body = [](KernelContext& c) { c.async_copy(c.in(0).at({0, 0}, {4, 8}), c.scratch(1), 1).wait(); };
    CHECK_THROWS_WITH(run(), Catch::Contains("waits on semaphore 1 for a copy into scratch 1 ('in1'), but no copy on "
                                             "it is in flight (a wait without start())"));
  }
  SECTION("a window out of range") {
    k.body = [](KernelContext& c) { (void)c.in(0).at({10, 0}, {4, 8}); };
    CHECK_THROWS_WITH(run(), Catch::Contains("the window at [10, 0] of [4, 8] of input 0 ('x') is out of range: the "
                                             "array is [12, 8]"));
  }
  SECTION("a read of a scratch buffer whose copy is in flight") {
    k.body = [](KernelContext& c) {
      auto cp = c.async_copy(c.in(0).at({0, 0}, {4, 8}), c.scratch(0), 0);
      cp.start();
      c.scratch(2).store(c.scratch(0).load());
      cp.wait();
    };
    CHECK_THROWS_WITH(run(), Catch::Contains("grid step [0] reads scratch 0 ('in0') while an async copy into it is in flight"));
  }
  SECTION("a write of a scratch buffer whose copy out is in flight") {
    k.body = [](KernelContext& c) {
      auto cp = c.async_copy(c.scratch(2), c.out(0).at({0, 0}, {4, 8}), 2);
      cp.start();
      c.scratch(2).store(full({4, 8}, 1.0));
      cp.wait();
    };
    CHECK_THROWS_WITH(run(), Catch::Contains("writes scratch 2 ('out') while an async copy out of it is in flight"));
  }
  SECTION("overlapping windows of one buffer in flight, and a wait for a copy that is not the oldest") {
    k.body = [](KernelContext& c) {
      c.async_copy(c.in(0).at({0, 0}, {2, 8}), c.scratch(0).at({0, 0}, {2, 8}), 0).start();
      c.async_copy(c.in(0).at({2, 0}, {2, 8}), c.scratch(0).at({2, 0}, {2, 8}), 0).start();  // disjoint: fine
      c.async_copy(c.in(0).at({4, 0}, {2, 8}), c.scratch(0).at({1, 0}, {2, 8}), 1).start();
    };
    CHECK_THROWS_WITH(run(), Catch::Contains("starts a copy into scratch 0 ('in0') window at [1, 0] of [2, 8] while the "
                                             "async copy from input 0 ('x') window at [0, 0] of [2, 8]"));
    k.body = [](KernelContext& c) {
      c.async_copy(c.in(0).at({0, 0}, {4, 8}), c.scratch(0), 0).start();
      c.async_copy(c.in(0).at({4, 0}, {4, 8}), c.scratch(1), 0).start();
      c.async_copy(c.in(0).at({4, 0}, {4, 8}), c.scratch(1), 0).wait();
    };
    CHECK_THROWS_WITH(run(), Catch::Contains("waits on semaphore 0 for a copy into scratch 1 ('in1'), but the oldest copy "
                                             "in flight on it goes from input 0 ('x') window at [0, 0] of [4, 8] into "
                                             "scratch 0 ('in0')"));
  }
  SECTION("a load of an operand left in HBM, a copy of the wrong shape, a bad semaphore") {
    k.body = [](KernelContext& c) { c.scratch(0).store(c.in(0).load()); };
    CHECK_THROWS_WITH(run(), Catch::Contains("load from input 0 ('x')") && Catch::Contains("stays in HBM"));
    k.body = [](KernelContext& c) { (void)c.async_copy(c.in(0).at({0, 0}, {2, 8}), c.scratch(0), 0); };
    CHECK_THROWS_WITH(run(), Catch::Contains("the window is f32 [2, 8] and the scratch buffer f32 [4, 8]"));
    k.body = [](KernelContext& c) { (void)c.async_copy(c.in(0).at({0, 0}, {4, 8}), c.scratch(0), 3); };
    CHECK_THROWS_WITH(run(), Catch::Contains("async copy on semaphore 3 of 3"));
  }
  SECTION("a scalar-prefetch input that is not i32, and a table entry out of range") {
    const std::vector<TensorType> o6{{Shape{6, 4}, DType::f32}};
    CHECK_THROWS_WITH(manual_call(gather_kernel(), {zeros({3}), manual_i32({1, 1, 1}, {3}), zeros({8, 4})}, o6),
                      Catch::Contains("scalar-prefetch input has dtype f32; it must be i32"));
    CHECK_THROWS_WITH(manual_call(gather_kernel(), {manual_i32({0, 4, 1}, {3}), manual_i32({1, 1, 1}, {3}), zeros({8, 4})}, o6),
                      Catch::Contains("gave block index [4, 0] at grid index [1], out of range"));
  }
}

TEST_CASE("kernel manual sim: scalar prefetch, async copies and paged attention as chip programs", "[kernel][sim]") {
  TinySim tiny;
  const Device dev = tiny.dev();
  {
    const std::vector<float> x = manual_random(8 * 4, 51);
    ChipRunProbe probe;
    Tensor y = call(gather_kernel(), {manual_i32({1, 3, 1}, {3}), manual_i32({1, 4, -2}, {3}), from_vector(x, {8, 4}).to(dev)},
                    {{Shape{6, 4}, DType::f32}})[0];
    REQUIRE(y.device() == dev);
    const std::vector<float> got = y.to(Device()).to_vector<float>();
    CHECK(probe.new_fallbacks() == 0);
    CHECK(probe.new_runs() >= 1);
    std::vector<double> want;
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t e = 0; e < 8; ++e)
        want.push_back(double(x[size_t(std::vector<int>{1, 3, 1}[size_t(j)] * 8 + e)] * float(std::vector<int>{1, 4, -2}[size_t(j)])));
    manual_check_close(got, want, 0);
  }
  {
    const std::vector<float> x = manual_random(12 * 8, 52);
    ChipRunProbe probe;
    Tensor y = call(stream_kernel(12, 8, 4), {from_vector(x, {12, 8}).to(dev)}, {{Shape{12, 8}, DType::f32}})[0];
    const std::vector<float> got = y.to(Device()).to_vector<float>();
    CHECK(probe.new_cycles() > 0);
    std::vector<double> want;
    for (float v : x) want.push_back(double(v * 2.0f + 1.0f));
    manual_check_close(got, want, 0);
  }
  const PagedCase pc;
  ChipRunProbe probe;
  Tensor o = manual_call(pc.def(2), pc.inputs(dev), {{Shape{pc.nb * pc.heads, pc.d}, DType::f32}})[0];
  const std::vector<float> got = o.to(Device()).to_vector<float>();
  CHECK(probe.new_fallbacks() == 0);
  CHECK(probe.new_runs() >= 1);
  manual_check_close(got, pc.want(), 1e-5);
}

// y = cast(x w, f32) for i8 x [8, 16] and w [16, 8] in blocks of 4 rows (w^T given when transposed).
KernelDef int8_dot_kernel(bool transpose_b) {
  KernelDef k;
  k.name = "int8_dot";
  k.grid = {2};
  k.in_specs = {{.block_shape = {4, 16}, .index_map = [](auto g) { return Index{g[0], 0}; }, .name = "x"},
                {.name = "w"}};
  k.out_specs = {{.block_shape = {4, 8}, .index_map = [](auto g) { return Index{g[0], 0}; }, .name = "y"}};
  k.body = [transpose_b](KernelContext& c) {
    const Value p = dot(c.in(0).load(), c.in(1).load(), {.transpose_b = transpose_b});
    REQUIRE(p.dtype() == DType::i32);
    c.out(0).store(cast(p, DType::f32));
  };
  return k;
}

TEST_CASE("kernel manual: an i8 x i8 dot accumulates exactly in i32, on the interpreter and the chip", "[kernel][sim]") {
  std::vector<float> x(8 * 16), w(16 * 8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>((i * 37 + 11) % 256) - 128);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(static_cast<int>((i * 53 + 5) % 255) - 127);
  std::vector<double> want(8 * 8, 0.0);
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 8; ++j)
      for (int64_t p = 0; p < 16; ++p) want[size_t(i * 8 + j)] += double(x[size_t(i * 16 + p)]) * w[size_t(p * 8 + j)];
  std::vector<float> wt(16 * 8);  // w^T [8, 16]
  for (int64_t p = 0; p < 16; ++p)
    for (int64_t j = 0; j < 8; ++j) wt[size_t(j * 16 + p)] = w[size_t(p * 8 + j)];
  TinySim tiny;
  for (Device dev : {Device(), tiny.dev()})
    for (bool tb : {false, true}) {
      const Tensor tx = from_vector(x, {8, 16}).to(DType::i8).to(dev);
      const Tensor tw = tb ? from_vector(wt, {8, 16}).to(DType::i8).to(dev) : from_vector(w, {16, 8}).to(DType::i8).to(dev);
      const Tensor y = manual_call(int8_dot_kernel(tb), {tx, tw}, {{Shape{8, 8}, DType::f32}})[0];
      manual_check_close(y.to(Device()).to_vector<float>(), want, 0);
    }
  // Mixed operands are an error naming both.
  KernelDef k = int8_dot_kernel(false);
  k.body = [](KernelContext& c) { c.out(0).store(cast(dot(c.in(0).load(), cast(c.in(1).load(), DType::f32)), DType::f32)); };
  CHECK_THROWS_WITH(manual_call(k, {zeros({8, 16}).to(DType::i8), zeros({16, 8}).to(DType::i8)}, {{Shape{8, 8}, DType::f32}}),
                    Catch::Contains("dtype mismatch: a is i8 [4, 16], b is f32 [16, 8]"));
}

TEST_CASE("kernel manual sim: the chip's race checker reports a read of a scratch buffer during its copy",
          "[kernel][sim][errors]") {
  KernelDef k = stream_kernel(12, 8, 4);
  k.grid = {1};
  k.body = [](KernelContext& c) {
    auto cp = c.async_copy(c.in(0).at({0, 0}, {4, 8}), c.scratch(0), 0);
    cp.start();
    c.scratch(2).store(c.scratch(0).load() + 1.0);  // before the wait: a race
    cp.wait();
    auto out = c.async_copy(c.scratch(2), c.out(0).at({0, 0}, {4, 8}), 2);
    out.start();
    out.wait();
  };
  const std::vector<TensorType> in{{Shape{12, 8}, DType::f32}}, out{{Shape{12, 8}, DType::f32}};
  sim::Chip chip = sim::Chip::create("tiny");
  const sim::ChipConfig& cfg = chip.config();
  // The front half refuses the body at build time ...
  CHECK_THROWS_WITH(kernel::detail::lower_to_chip(k, in, out, cfg), Catch::Contains("while an async copy into it is in flight"));
  // ... and without that check the chip's race checker reports the read of the DMA's bytes.
  const sim::Program p = kernel::detail::lower_to_chip(k, in, out, cfg, {}, false);
  const sim::RunResult r = chip.run(p, {.race_check = true, .registers = {0, 1 << 16}});
  REQUIRE(!r.races.empty());
  CHECK(r.races[0].kind == "read-after-write");
  // The same body with the wait first runs clean.
  k.body = [](KernelContext& c) {
    auto cp = c.async_copy(c.in(0).at({0, 0}, {4, 8}), c.scratch(0), 0);
    cp.start();
    cp.wait();
    c.scratch(2).store(c.scratch(0).load() + 1.0);
    auto o2 = c.async_copy(c.scratch(2), c.out(0).at({0, 0}, {4, 8}), 2);
    o2.start();
    o2.wait();
  };
  CHECK(chip.run(kernel::detail::lower_to_chip(k, in, out, cfg), {.race_check = true, .registers = {0, 1 << 16}}).races.empty());
}

}  // namespace
}  // namespace tpu
