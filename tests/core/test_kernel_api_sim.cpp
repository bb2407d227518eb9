// Kernels lowered to the simulated chip (tiny preset): the same kernel bodies as the interpreter
// tests, run as chip programs (no host fallback, cycles counted), compared with naive loops and
// with the library's own chip kernels; what the lowering lacks is an error naming it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "codegen_testing.h"
#include "examples/kernels/flash_attention.h"
#include "examples/kernels/matmul_epilogue.h"
#include "jit_testing.h"
#include "sim/presets.h"
#include "tpucore/compile.h"
#include "tpucore/kernel.h"
#include "tpucore/kernel/lower_sim.h"
#include "sim/chip.h"

namespace tpu {
namespace {
using namespace tpu::kernel;
using jit_testing::expect_close;
using testing::ChipRunProbe;
using testing::TinySim;

Tensor rnd(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, {}, &g);
}

TEST_CASE("kernel sim: the tiled matmul with an epilogue runs as a chip program and matches the chip's matmul",
          "[kernel][sim]") {
  TinySim tiny;
  const Device dev = tiny.dev();
  const int64_t m = 37, k = 50, n = 29;
  Tensor x = rnd({m, k}, 1), w = rnd({k, n}, 2), b = rnd({n}, 3);
  const Params params{{"bm", 16}, {"bn", 16}, {"bk", 16}, {"act", static_cast<int64_t>(examples::Act::relu)}};
  ChipRunProbe probe;
  Tensor y = examples::matmul_epilogue_op()({x.to(dev), w.to(dev), b.to(dev)}, params);
  CHECK(y.device() == dev);
  const Tensor yh = y.to(Device());  // read first (under TPU_EAGER=defer the op runs here)
  CHECK(probe.new_fallbacks() == 0);
  CHECK(probe.new_runs() >= 1);
  CHECK(probe.new_cycles() > 0);
  CHECK(codegen::stats().runs_by_kernel.count("matmul_epilogue") == 1);
  // The chip's own matmul runs f32 in the same MXU mode as this kernel's dot (this test binary
  // sets "highest": f32-accurate products): both agree with each other and with the
  // interpreter's f32 result to accumulation order.
  Tensor want = relu(add(matmul(x.to(dev), w.to(dev)), b.to(dev)));
  expect_close(yh, want.to(Device()), 1e-5, 1e-5, "kernel vs built-in on the chip");
  Tensor cpu = examples::matmul_epilogue_op()({x, w, b}, params);
  expect_close(yh, cpu, 1e-5, 1e-5, "chip vs interpreter");
  // Blocks one MXU wide: the dot's rows are split over both MXUs of the chip.
  const Params narrow{{"bm", 16}, {"bn", 8}, {"bk", 16}, {"act", static_cast<int64_t>(examples::Act::relu)}};
  Tensor yn = examples::matmul_epilogue_op()({x.to(dev), w.to(dev), b.to(dev)}, narrow);
  expect_close(yn.to(Device()), want.to(Device()), 1e-5, 1e-5, "narrow blocks vs built-in on the chip");
}

TEST_CASE("kernel sim: bf16 operands, row softmax, masked stores and scratch accumulation equal naive loops",
          "[kernel][sim]") {
  TinySim tiny;
  const Device dev = tiny.dev();
  SECTION("bf16 matmul with silu") {
    Tensor x = rnd({20, 24}, 4).to(DType::bf16), w = rnd({24, 12}, 5).to(DType::bf16), b = rnd({12}, 6);
    const Params p{{"bm", 8}, {"bn", 8}, {"bk", 8}, {"act", static_cast<int64_t>(examples::Act::silu)}};
    Tensor y = examples::matmul_epilogue_op()({x.to(dev), w.to(dev), b.to(dev)}, p);
    CHECK(y.dtype() == DType::bf16);
    Tensor want = examples::matmul_epilogue_op()({x, w, b}, p);
    expect_close(y.to(Device()).to(DType::f32), want.to(DType::f32), 1.0 / 64, 1e-2, "bf16");
  }
  SECTION("row softmax") {
    const int64_t rows = 12, cols = 10;
    Tensor x = rnd({rows, cols}, 7);
    KernelDef k;
    k.name = "softmax_rows";
    k.grid = {3};
    k.in_specs = {{.block_shape = {5, cols}, .index_map = [](auto g) { return Index{g[0], 0}; }}};
    k.out_specs = k.in_specs;
    k.body = [](KernelContext& c) {
      Value v = c.in(0).load();
      Value e = exp(v - row_max(v));
      c.out(0).store(e / row_sum(e));
    };
    ChipRunProbe probe;
    Tensor y = call(k, {x.to(dev)}, {{Shape{rows, cols}, DType::f32}})[0];
    CHECK(probe.new_runs() == 1);
    const std::vector<float> xv = x.to_vector<float>(), yv = y.to(Device()).to_vector<float>();
    for (int64_t i = 0; i < rows; ++i) {
      double mx = -INFINITY, s = 0;
      for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, double(xv[size_t(i * cols + j)]));
      for (int64_t j = 0; j < cols; ++j) s += std::exp(xv[size_t(i * cols + j)] - mx);
      for (int64_t j = 0; j < cols; ++j) {
        const double want = std::exp(xv[size_t(i * cols + j)] - mx) / s;
        INFO(i << "," << j);
        REQUIRE(std::fabs(yv[size_t(i * cols + j)] - want) <= 1e-5 + 1e-4 * want);
      }
    }
  }
  SECTION("iota and a masked store of the lower triangle") {
    const int64_t n = 9;
    KernelDef k;
    k.name = "tril_fill";
    k.grid = {3, 3};
    k.out_specs = {{.block_shape = {4, 4}, .index_map = [](auto g) { return Index{g[0], g[1]}; }}};
    k.body = [](KernelContext& c) {
      Ref o = c.out(0);
      Value row = cast(iota(o.shape(), 0), DType::f32) + static_cast<double>(o.offset(0));
      Value col = cast(iota(o.shape(), 1), DType::f32) + static_cast<double>(o.offset(1));
      o.store(row * 10.0 + col, ge(row, col));
    };
    // No inputs: kernel::call takes its device from the inputs, so run it as a one-input kernel
    // whose input is unused.
    KernelDef k1 = k;
    k1.in_specs = {{.block_shape = {1}, .index_map = [](auto) { return Index{0}; }}};
    Tensor y = call(k1, {zeros({1}).to(dev)}, {{Shape{n, n}, DType::f32}})[0];
    const std::vector<float> yv = y.to(Device()).to_vector<float>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        INFO(i << "," << j);
        CHECK(yv[size_t(i * n + j)] == (i >= j ? float(i * 10 + j) : 0.0f));
      }
  }
}

TEST_CASE("kernel sim: a dot accumulated into scratch is MXU accumulation, with no vector add or copy per K step",
          "[kernel][sim]") {
  // x [32, 48] w [48, 24] in blocks 16 x 8 x 16 on the tiny chip (2 MXUs of 8 x 8): a grid of
  // 2 x 3 x 3 steps, 6 output tiles. Per step the dot is one 8-wide column tile, its 16 rows in
  // two groups of 8 (one per MXU), K in two tiles of 8.
  const sim::ChipConfig cfg = sim::preset_config("tiny");
  REQUIRE(cfg.mxu.cols == 8);
  REQUIRE(cfg.mxu.rows == 8);
  REQUIRE(cfg.mxu.count == 2);
  const int64_t m = 32, k = 48, n = 24, bm = 16, bn = 8, bk = 16;
  const std::vector<TensorType> in{{Shape{m, k}, DType::f32}, {Shape{k, n}, DType::f32}, {Shape{n}, DType::f32}};
  const std::vector<TensorType> out{{Shape{m, n}, DType::f32}};
  const Params params{{"bm", bm}, {"bn", bn}, {"bk", bk}, {"act", static_cast<int64_t>(examples::Act::relu)}};
  const KernelDef def = examples::matmul_epilogue_kernel(in, out, params);
  const sim::Program p = kernel::detail::lower_to_chip(def, in, out, cfg);
  const int64_t tiles = (m / bm) * (n / bn), steps = tiles * (k / bk);
  const int64_t groups = 2, ktiles = bk / 8;
  int64_t vadd = 0, vmov = 0, mm = 0, mm_first = 0;
  for (const sim::Instr& i : p.code) {
    vadd += i.op == sim::Op::vadd;
    vmov += i.op == sim::Op::vmov;
    if (i.op == sim::Op::mxu_mm) {
      ++mm;
      mm_first += !i.acc;
    }
  }
  CHECK(vadd == tiles);  // the bias of the epilogue only
  CHECK(vmov == 0);      // none per K step, and the epilogue's relu writes the output block directly
  CHECK(mm == steps * groups * ktiles);
  CHECK(mm_first == tiles * groups);  // the first K tile of a tile writes its result; the rest accumulate
}

TEST_CASE("kernel sim: a scratch value read before an accumulating store keeps its value", "[kernel][sim]") {
  TinySim tiny;
  const Device dev = tiny.dev();
  Tensor x = rnd({8, 16}, 11), w = rnd({16, 8}, 12);
  KernelDef kd;
  kd.name = "acc_keeps_old";
  kd.grid = {2};
  kd.in_specs = {{.block_shape = {8, 8}, .index_map = [](auto g) { return Index{0, g[0]}; }},
                 {.block_shape = {8, 8}, .index_map = [](auto g) { return Index{g[0], 0}; }}};
  kd.out_specs = {{.block_shape = {8, 8}, .index_map = [](auto) { return Index{0, 0}; }},
                  {.block_shape = {8, 8}, .index_map = [](auto) { return Index{0, 0}; }}};
  kd.scratch = {{.shape = {8, 8}, .dtype = DType::f32, .name = "acc"}};
  kd.body = [](KernelContext& c) {
    Ref acc = c.scratch(0);
    const Value old = acc.load();
    acc.store(old + dot(c.in(0).load(), c.in(1).load()));
    c.out(1).store(old * 2.0);  // read after the store: the sum before this step's product
    if (c.program_id(0) == 1) c.out(0).store(acc.load());
  };
  std::vector<Tensor> y = call(kd, {x.to(dev), w.to(dev)}, {{Shape{8, 8}, DType::f32}, {Shape{8, 8}, DType::f32}});
  const std::vector<float> xv = x.to_vector<float>(), wv = w.to_vector<float>();
  const std::vector<float> full = y[0].to(Device()).to_vector<float>(), half = y[1].to(Device()).to_vector<float>();
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 8; ++j) {
      double first = 0, all = 0;
      for (int64_t t = 0; t < 16; ++t) {
        const double pr = double(xv[size_t(i * 16 + t)]) * wv[size_t(t * 8 + j)];
        all += pr;
        if (t < 8) first += pr;
      }
      INFO(i << "," << j);
      CHECK(std::fabs(full[size_t(i * 8 + j)] - all) <= 1e-4 * (1 + std::fabs(all)));
      CHECK(std::fabs(half[size_t(i * 8 + j)] - 2 * first) <= 1e-4 * (1 + std::fabs(first)));
    }
}

TEST_CASE("kernel sim: a kernel op inside tpu::compile on the chip equals its eager run", "[kernel][sim][jit]") {
  TinySim tiny;
  const Device dev = tiny.dev();
  Tensor x = rnd({16, 24}, 8).to(dev), w = rnd({24, 16}, 9).to(dev), b = rnd({16}, 10).to(dev);
  const Params p{{"bm", 8}, {"bn", 8}, {"bk", 8}, {"act", static_cast<int64_t>(examples::Act::relu)}};
  auto f = compile([&](const Tensor& xx) { return mul(examples::matmul_epilogue_op()({xx, w, b}, p), 3.0); },
                   {.name = "kernel_sim_compiled"});
  Tensor eager = mul(examples::matmul_epilogue_op()({x, w, b}, p), 3.0);
  ChipRunProbe probe;
  Tensor comp = f(x);
  comp = f(x);
  CHECK(probe.new_fallbacks() == 0);
  expect_close(comp.to(Device()), eager.to(Device()), 0, 0, "compiled vs eager on the chip");
}

TEST_CASE("kernel sim: flash attention runs as a chip program and matches the chip's attention", "[kernel][sim]") {
  TinySim tiny;
  const Device dev = tiny.dev();
  for (bool causal : {false, true}) {
    DYNAMIC_SECTION("causal " << causal) {
      const int64_t h = 2, s = 12, sk = causal ? 12 : 10, d = 8;
      Tensor q = rnd({h, s, d}, 31), k = rnd({h, sk, d}, 32), v = rnd({h, sk, d}, 33);
      const Params p{{"bq", 4}, {"bk", 4}, {"causal", causal ? 1 : 0}};
      ChipRunProbe probe;
      const Tensor o = examples::flash_attention_op()({q.to(dev), k.to(dev), v.to(dev)}, p).to(Device());
      CHECK(probe.new_fallbacks() == 0);
      CHECK(probe.new_cycles() > 0);
      // f32 MXU passes at this binary's "highest" precision; exp on the transcendental path.
      Tensor want = scaled_dot_product_attention(q.to(dev), k.to(dev), v.to(dev), {}, causal);
      expect_close(o, want.to(Device()), 1e-4, 1e-4, "kernel vs built-in attention on the chip");
      Tensor cpu = examples::flash_attention_op()({q, k, v}, p);
      expect_close(o, cpu, 1e-4, 1e-4, "chip vs interpreter");
    }
  }
}

TEST_CASE("kernel sim: the block pipeline hides the DMA latency of a copy kernel's grid steps", "[kernel][sim]") {
  TinySim tiny;
  const Device dev = tiny.dev();
  const sim::ChipConfig cfg = sim::preset_config("tiny");
  const int64_t steps = 16, rows = 1, cols = 16;
  KernelDef k;
  k.name = "copy_blocks";
  k.grid = {steps};
  k.in_specs = {{.block_shape = {rows, cols}, .index_map = [](auto g) { return Index{g[0], 0}; }}};
  k.out_specs = k.in_specs;
  k.body = [](KernelContext& c) { c.out(0).store(c.in(0).load()); };
  Tensor x = rnd({steps * rows, cols}, 11);
  ChipRunProbe probe;
  Tensor y = call(k, {x.to(dev)}, {{Shape{steps * rows, cols}, DType::f32}})[0];
  const double cycles = probe.new_cycles();  // the kernel's program alone (before reading y back)
  expect_close(y.to(Device()), x, 0, 0, "copy");
  UNSCOPED_INFO("cycles " << cycles);
  // A step that waits for its own block pays the DMA latency plus the transfer: the grid would
  // take at least steps x (latency + transfer). Copies issued steps ahead overlap the latency:
  // about one latency plus the transfers (in and out) of every block.
  const double transfer = static_cast<double>(rows * cols * 4) / cfg.dma.engine_bytes_per_cycle;
  const double serial = static_cast<double>(steps) * (cfg.dma.latency_cycles + transfer);
  CHECK(cycles > 0);
  CHECK(cycles < serial);
  CHECK(cycles < 3 * cfg.dma.latency_cycles + static_cast<double>(steps) * (2 * transfer + 0.5 * cfg.dma.latency_cycles));
}

TEST_CASE("kernel sim: the copies of every block of the look-ahead window go out before the first wait",
          "[kernel][sim]") {
  // 20 grid steps of one small block each: the input's ring holds a slot for every step of the
  // window the pipeline looks ahead (24 steps), so all 20 copies are issued before the program
  // first waits for one; a shallower ring issues the later ones only as its slots free up, after
  // the waits (and the compute) of the first steps.
  const int64_t steps = 20, cols = 16;
  KernelDef k;
  k.name = "copy_window";
  k.grid = {steps};
  k.in_specs = {{.block_shape = {1, cols}, .index_map = [](auto g) { return Index{g[0], 0}; }}};
  k.out_specs = k.in_specs;
  k.body = [](KernelContext& c) { c.out(0).store(c.in(0).load() * 2.0); };
  const std::vector<TensorType> types{{Shape{steps, cols}, DType::f32}};
  const sim::Program p = kernel::detail::lower_to_chip(k, types, types, sim::preset_config("tiny"));
  int64_t copies_in = 0, before_first_wait = -1;
  for (const sim::Instr& in : p.code) {
    if (in.op == sim::Op::wait && before_first_wait < 0) before_first_wait = copies_in;
    copies_in += in.op == sim::Op::dma && in.dst.space == sim::Space::vmem;
  }
  CHECK(copies_in == steps);  // every block copied in once
  CHECK(before_first_wait == steps);
  // And the program computes 2x (a naive loop).
  TinySim tiny;
  const Tensor x = rnd({steps, cols}, 13);
  const std::vector<Tensor> args{x.to(tiny.dev())};
  const std::vector<float> xv = x.to_vector<float>(), yv = call(k, args, types)[0].to(Device()).to_vector<float>();
  REQUIRE(yv.size() == xv.size());
  for (size_t i = 0; i < xv.size(); ++i) CHECK(yv[i] == 2.0f * xv[i]);
}

// Cycles of a kernel's chip program for these operand types on a chip (timing only).
double kernel_sim_cycles(const sim::ChipConfig& cfg, const KernelDef& k, const std::vector<TensorType>& in,
                         const std::vector<TensorType>& out) {
  sim::Chip chip(cfg);
  const sim::Program p = kernel::detail::lower_to_chip(k, in, out, chip.config());
  std::vector<int64_t> regs;
  for (size_t i = 0; i < in.size() + out.size(); ++i) regs.push_back(static_cast<int64_t>(i) << 16);
  return chip.run(p, {.timing_only = true, .registers = regs}).stats.cycles;
}

size_t count_ops(const sim::Program& p, sim::Op op) {
  return static_cast<size_t>(std::count_if(p.code.begin(), p.code.end(), [&](const sim::Instr& in) { return in.op == op; }));
}

TEST_CASE("kernel sim: independent grid steps overlap on the chip's units", "[kernel][sim]") {
  // Each head's steps are a chain of dependent operations (scores on the MXU, row max, exp, the
  // second matmul); the heads share nothing, so the program runs their chains side by side: two
  // heads take well under twice the cycles of one. The tiny chip with the MXU latency of the TPU
  // presets (hundreds of cycles from the last row in to the result), so one head's chain leaves
  // the units idle most of the time.
  sim::ChipConfig cfg = sim::preset_config("tiny");
  cfg.mxu.fill_cycles = cfg.mxu.drain_cycles = 200;
  auto cycles = [&](int64_t heads) {
    const std::vector<TensorType> in(3, TensorType{Shape{heads, 8, 8}, DType::f32});
    const KernelDef k = examples::flash_attention_kernel(in, {}, {{"bq", 8}, {"bk", 8}});
    return kernel_sim_cycles(cfg, k, in, {in[0]});
  };
  const double one = cycles(1), two = cycles(2);
  UNSCOPED_INFO("one head " << one << " cycles, two heads " << two);
  CHECK(one > 0);
  CHECK(two < 1.5 * one);
}

TEST_CASE("kernel sim: iota is made once per program and a mask known to keep everything costs no select",
          "[kernel][sim]") {
  TinySim tiny;
  const Device dev = tiny.dev();
  const int64_t steps = 8, rows = 2, cols = 16;
  for (int64_t keep : {cols, int64_t{10}}) {
    DYNAMIC_SECTION("keys kept " << keep) {
      KernelDef k;
      k.name = "iota_mask_" + std::to_string(keep);
      k.grid = {steps};
      k.in_specs = {{.block_shape = {rows, cols}, .index_map = [](auto g) { return Index{g[0], 0}; }}};
      k.out_specs = k.in_specs;
      k.body = [keep](KernelContext& c) {
        const Value col = cast(iota({rows, cols}, 1), DType::f32);
        c.out(0).store(where(lt(col, static_cast<double>(keep)), c.in(0).load() + col, 0.0));
      };
      const std::vector<TensorType> types{{Shape{steps * rows, cols}, DType::f32}};
      const sim::Program p = kernel::detail::lower_to_chip(k, types, types, sim::preset_config("tiny"));
      // One fill per column in every step would be steps x cols fills; the index is made once.
      CHECK(count_ops(p, sim::Op::vfill) < static_cast<size_t>(steps));
      CHECK(count_ops(p, sim::Op::vsel) == (keep == cols ? 0u : static_cast<size_t>(steps)));
      const Tensor x = rnd({steps * rows, cols}, 41);
      const std::vector<Tensor> args{x.to(dev)};
      const std::vector<float> xv = x.to_vector<float>(), yv = call(k, args, types)[0].to(Device()).to_vector<float>();
      REQUIRE(yv.size() == xv.size());
      for (size_t i = 0; i < xv.size(); ++i) {  // a naive loop: x + j where j < keep, else 0
        const int64_t j = static_cast<int64_t>(i) % cols;
        INFO("element " << i);
        CHECK(yv[i] == (j < keep ? xv[i] + static_cast<float>(j) : 0.0f));
      }
    }
  }
}

TEST_CASE("kernel sim: a step whose values do not fit beside deep block rings runs with two slots per block",
          "[kernel][sim]") {
  TinySim tiny;
  const Device dev = tiny.dev();
  // The tiny chip's 256 KiB of VMEM: blocks of 16 KiB (input and output) give rings of four slots
  // (128 KiB, half of VMEM); ten values of 16 KiB per step fit only beside two slots (64 KiB).
  auto chain = [](int adds) {
    KernelDef k;
    k.name = "add_chain";
    k.grid = {4};
    k.in_specs = {{.block_shape = {32, 128}, .index_map = [](auto g) { return Index{g[0], 0}; }}};
    k.out_specs = k.in_specs;
    k.body = [adds](KernelContext& c) {
      Value v = c.in(0).load();
      for (int i = 0; i < adds; ++i) v = v + 1.0;
      c.out(0).store(v);
    };
    return k;
  };
  Tensor x = rnd({128, 128}, 12);
  Tensor y = call(chain(10), {x.to(dev)}, {{Shape{128, 128}, DType::f32}})[0];
  expect_close(y.to(Device()), add(x, 10.0), 1e-6, 0, "x + 10");
  // Fourteen values do not fit even beside two slots: the error names the step and the VMEM bytes.
  CHECK_THROWS_WITH(call(chain(14), {x.to(dev)}, {{Shape{128, 128}, DType::f32}}),
                    Catch::Contains("the values of grid step [0] need more than the chip's 262144 bytes of VMEM"));
}

TEST_CASE("kernel sim: what the lowering lacks is an error naming it", "[kernel][sim][errors]") {
  TinySim tiny;
  const Device dev = tiny.dev();
  KernelDef k;
  k.name = "to_int";
  k.grid = {1};
  k.in_specs = {{}};
  k.out_specs = {{}};
  k.body = [](KernelContext& c) { c.out(0).store(cast(cast(c.in(0).load(), DType::i32), DType::f32)); };
  CHECK_THROWS_WITH(call(k, {zeros({8, 8}).to(dev)}, {{Shape{8, 8}, DType::f32}}),
                    Catch::Contains("kernel 'to_int': a cast to i32 is not lowered to the chip yet"));
  k.body = [](KernelContext& c) { c.out(0).store(c.in(0).load()); };
  CHECK_THROWS_WITH(call(k, {zeros({2, 3, 4}).to(dev)}, {{Shape{2, 3, 4}, DType::f32}}),
                    Catch::Contains("(rank 3) is not lowered to the chip"));
  CHECK_THROWS_WITH(call(k, {zeros({8, 8}, DType::i32).to(dev)}, {{Shape{8, 8}, DType::i32}}),
                    Catch::Contains("input 0 of dtype i32 is not lowered"));
}

}  // namespace
}  // namespace tpu
