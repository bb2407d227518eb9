// Kernel ops: a kernel registered with a shape rule and a backward (itself partly another kernel
// op) runs eagerly, records autograd, traces into tpu::compile as one node and trains inside a
// compiled step like the same model written with library ops.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "examples/kernels/matmul_epilogue.h"
#include "jit_testing.h"
#include "tpucore/autograd.h"
#include "tpucore/devices.h"
#include "tpucore/export.h"
#include "tpucore/runtime/pjrt_client.h"
#include "tpucore/streams.h"
#include "tpucore/kernel.h"
#include "ops/fallback.h"
#include "tpucore/optim.h"

namespace tpu {
namespace {
using namespace tpu::kernel;
using jit_testing::expect_close;

// g * (y > 0) over row blocks of 8: the backward of the relu epilogue, as a kernel op.
const Op& relu_grad_op() {
  static const Op op = register_op({
      .name = "test_kernel_relu_grad",
      .num_inputs = 2,
      .output_types = [](std::span<const TensorType> in, const Params&) { return std::vector<TensorType>{in[0]}; },
      .kernel =
          [](std::span<const TensorType> in, std::span<const TensorType>, const Params&) {
            KernelDef k;
            const int64_t rows = in[0].shape[0], cols = in[0].shape[1];
            k.grid = {(rows + 7) / 8};
            BlockSpec rowsb{.block_shape = {8, cols}, .index_map = [](auto g) { return Index{g[0], 0}; }};
            k.in_specs = {rowsb, rowsb};
            k.out_specs = {rowsb};
            k.body = [](KernelContext& c) {
              Value y = c.in(1).load();
              c.out(0).store(where(gt(y, full({1}, 0.0, y.dtype())), c.in(0).load(), 0.0));
            };
            return k;
          },
  });
  return op;
}

// relu(x w + b) with the example's tiled kernel and a backward: the relu mask by the kernel above,
// the matmuls by library ops.
const Op& linear_relu_op() {
  static const Op op = register_op({
      .name = "test_kernel_linear_relu",
      .num_inputs = 3,
      .output_types =
          [](std::span<const TensorType> in, const Params&) {
            return std::vector<TensorType>{{Shape{in[0].shape[0], in[1].shape[1]}, in[0].dtype}};
          },
      .kernel = [](std::span<const TensorType> in, std::span<const TensorType> out,
                   const Params& p) { return examples::matmul_epilogue_kernel(in, out, p); },
      .backward =
          [](const BackwardContext& c) {
            Tensor gp = relu_grad_op()({c.grad_outputs[0], c.outputs[0]});
            std::vector<Tensor> g(3);
            if (c.needs_grad(0)) g[0] = matmul(gp, c.inputs[1].t());
            if (c.needs_grad(1)) g[1] = matmul(c.inputs[0].t(), gp);
            if (c.needs_grad(2)) g[2] = sum(gp, {0});
            return g;
          },
      .doc = "relu(x w + b) (test kernel)",
  });
  return op;
}

const Params kBlocks{{"bm", 8}, {"bn", 8}, {"bk", 8}, {"act", static_cast<int64_t>(examples::Act::relu)}};

Tensor reference(const Tensor& x, const Tensor& w, const Tensor& b) { return relu(add(matmul(x, w), b)); }

Tensor rn_kernel_input(std::vector<int64_t> shape, uint64_t seed) {
  Generator g(seed);
  return randn(Shape(shape), {}, &g);
}

Tensor tensor_from_i32(std::vector<int32_t> v) {
  Tensor t = empty({static_cast<int64_t>(v.size())}, TensorOptions(DType::i32));
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

TEST_CASE("kernel op: eager values and gradients equal the model written with ops", "[kernel]") {
  Generator g(11);
  Tensor x = randn({13, 10}, {}, &g), w = randn({10, 9}, {}, &g), b = randn({9}, {}, &g);
  Tensor xk = x.clone().requires_grad_(), wk = w.clone().requires_grad_(), bk = b.clone().requires_grad_();
  Tensor xr = x.clone().requires_grad_(), wr = w.clone().requires_grad_(), br = b.clone().requires_grad_();
  Tensor yk = linear_relu_op()({xk, wk, bk}, kBlocks);
  Tensor yr = reference(xr, wr, br);
  expect_close(yk, yr, 1e-5, 1e-6, "forward");
  sum(mul(yk, yk)).backward();
  sum(mul(yr, yr)).backward();
  expect_close(xk.grad(), xr.grad(), 1e-5, 1e-5, "grad x");
  expect_close(wk.grad(), wr.grad(), 1e-5, 1e-5, "grad w");
  expect_close(bk.grad(), br.grad(), 1e-5, 1e-5, "grad b");
  CHECK(is_kernel_op("test_kernel_linear_relu"));
  CHECK_FALSE(is_kernel_op("matmul"));
}

TEST_CASE("kernel op: a compiled training step equals the eager step of the model written with ops", "[kernel][jit]") {
  Generator g(12);
  Tensor w0 = randn({10, 6}, {}, &g), b0 = randn({6}, {}, &g);
  Tensor wk = w0.clone().requires_grad_(), bk = b0.clone().requires_grad_();
  Tensor wr = w0.clone().requires_grad_(), br = b0.clone().requires_grad_();
  optim::SGD ok({wk, bk}, {.lr = 0.05}), orf({wr, br}, {.lr = 0.05});
  auto step = compile(
      [&](const Tensor& x, const Tensor& t) {
        ok.zero_grad();
        Tensor y = linear_relu_op()({x, wk, bk}, kBlocks);
        Tensor loss = mean(mul(sub(y, t), sub(y, t)));
        loss.backward();
        ok.step();
        return loss;
      },
      {.name = "kernel_op_train"});
  for (int s = 0; s < 4; ++s) {
    Tensor x = randn({12, 10}, {}, &g), t = randn({12, 6}, {}, &g);
    Tensor lk = step(x, t);
    orf.zero_grad();
    Tensor yr = reference(x, wr, br);
    Tensor lr = mean(mul(sub(yr, t), sub(yr, t)));
    lr.backward();
    orf.step();
    expect_close(lk, lr.detach(), 1e-5, 1e-6, "loss");
  }
  expect_close(wk.detach(), wr.detach(), 1e-5, 1e-6, "w");
  expect_close(bk.detach(), br.detach(), 1e-5, 1e-6, "b");
  const auto& st = jit_testing::stats_of("kernel_op_train");
  CHECK(st.compiles == 1);
  CHECK(st.hits == 3);
  CHECK(st.breaks == 0);
  // The kernel is one node of the graph, and so is its backward's kernel.
  const std::vector<std::string> graphs = step.graphs();
  REQUIRE(graphs.size() == 1);
  CHECK(graphs[0].find("test_kernel_linear_relu") != std::string::npos);
  CHECK(graphs[0].find("test_kernel_relu_grad") != std::string::npos);
}

TEST_CASE("kernel op: on a chip device it runs as a chip program with the interpreter's values", "[kernel]") {
  Generator g(13);
  Tensor x = randn({9, 7}, {}, &g), w = randn({7, 5}, {}, &g), b = randn({5}, {}, &g);
  const Device sim("sim:0");
  const uint64_t fallbacks = ops::total_fallbacks();
  Tensor y = linear_relu_op()({x.to(sim), w.to(sim), b.to(sim)}, kBlocks);
  CHECK(y.device() == sim);
  CHECK(ops::total_fallbacks() == fallbacks);
  // This test binary runs f32 matmuls on the chip at "highest" precision (f32-accurate products).
  expect_close(y.to(Device()), linear_relu_op()({x, w, b}, kBlocks), 1e-5, 1e-5, "sim vs cpu");
}

TEST_CASE("kernel op: registration and call errors", "[kernel][errors]") {
  (void)linear_relu_op();
  CHECK_THROWS_WITH(register_op({.name = "test_kernel_linear_relu", .num_inputs = 3,
                                 .output_types = [](auto in, const Params&) { return std::vector<TensorType>{in[0]}; },
                                 .kernel = examples::matmul_epilogue_kernel}),
                    Catch::Contains("already registered"));
  CHECK_THROWS_WITH(register_op({.name = "test_kernel_no_rule", .num_inputs = 1}), Catch::Contains("no shape rule"));
  CHECK_THROWS_WITH(linear_relu_op()({zeros({4, 4}), zeros({4, 4})}), Catch::Contains("expected 3 tensor input(s)"));
  // A non-differentiable kernel op: the graph stops there.
  CHECK_FALSE(is_kernel_op("test_kernel_no_rule"));
}

// Two outputs per call: x + 1 and x * scale (a parameter), over row blocks of 8.
const Op& shift_scale_op() {
  static const Op op = register_op({
      .name = "test_kernel_shift_scale",
      .num_inputs = 1,
      .output_types = [](std::span<const TensorType> in, const Params&) { return std::vector<TensorType>{in[0], in[0]}; },
      .kernel =
          [](std::span<const TensorType> in, std::span<const TensorType>, const Params& p) {
            KernelDef k;
            const int64_t rows = in[0].shape[0], cols = in[0].shape[1];
            const double scale = static_cast<double>(p.at("scale"));
            k.grid = {(rows + 7) / 8};
            BlockSpec rowsb{.block_shape = {8, cols}, .index_map = [](auto g) { return Index{g[0], 0}; }};
            k.in_specs = {rowsb};
            k.out_specs = {rowsb, rowsb};
            k.body = [scale](KernelContext& c) {
              Value x = c.in(0).load();
              c.out(0).store(x + 1.0);
              c.out(1).store(x * scale);
            };
            return k;
          },
  });
  return op;
}

// Scalar prefetch: output row block i is row block table[i] of x (blocks of 8 rows); inputs
// table i32 [blocks], x [rows, cols].
const Op& block_gather_op() {
  static const Op op = register_op({
      .name = "test_kernel_block_gather",
      .num_inputs = 2,
      .output_types = [](std::span<const TensorType> in, const Params&) { return std::vector<TensorType>{in[1]}; },
      .kernel =
          [](std::span<const TensorType> in, std::span<const TensorType>, const Params&) {
            KernelDef k;
            const int64_t blocks = in[0].shape[0], cols = in[1].shape[1];
            k.grid = {blocks};
            k.num_scalar_prefetch = 1;
            k.in_specs = {{.block_shape = {8, cols},
                           .scalar_index_map = [](auto g, const Scalars& s) { return Index{s(0, g[0]), 0}; }}};
            k.out_specs = {{.block_shape = {8, cols}, .index_map = [](auto g) { return Index{g[0], 0}; }}};
            k.body = [](KernelContext& c) { c.out(0).store(c.in(0).load()); };
            return k;
          },
  });
  return op;
}

std::string kernel_test_lib_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(static_cast<void (*)(tpu::Device)>(&tpu::synchronize)), &info) && info.dli_fname) {
    std::string p = info.dli_fname;
    return p.substr(0, p.rfind('/') + 1);
  }
  return {};
}

std::shared_ptr<pjrt::Client> kernel_test_pjrt_client() {
  static std::shared_ptr<pjrt::Client> c = pjrt::Client::load(kernel_test_lib_dir() + "libpjrt_tpucore_sim.so");
  return c;
}

TEST_CASE("kernel op: export_stablehlo writes it as a custom_call with its name and parameters", "[kernel][stablehlo]") {
  const Tensor x = rn_kernel_input({9, 7}, 1), w = rn_kernel_input({7, 5}, 2), b = rn_kernel_input({5}, 3);
  const std::string m = export_stablehlo(
      [](const std::vector<Tensor>& a) { return std::vector<Tensor>{relu(linear_relu_op()({a[0], a[1], a[2]}, kBlocks))}; },
      {x, w, b});
  const std::string params = fmt::format("act={};bk=8;bm=8;bn=8", static_cast<int64_t>(examples::Act::relu));
  CHECK_THAT(m, Catch::Contains(fmt::format(
                    "= \"stablehlo.custom_call\"(%arg0, %arg1, %arg2) {{api_version = 2 : i32, backend_config = \"{}\", "
                    "call_target_name = \"test_kernel_linear_relu\", has_side_effect = false, tpucore.params = "
                    "{{\"act\" = {} : i64, \"bk\" = 8 : i64, \"bm\" = 8 : i64, \"bn\" = 8 : i64}}}} : "
                    "(tensor<9x7xf32>, tensor<7x5xf32>, tensor<5xf32>) -> tensor<9x5xf32>",
                    params, static_cast<int64_t>(examples::Act::relu))));
  CHECK_THAT(m, Catch::Contains("stablehlo.maximum"));  // the relu after it is an ordinary op
  // Several outputs: one op with a result group, its results used by index.
  const std::string m2 = export_stablehlo(
      [](const std::vector<Tensor>& a) {
        std::vector<Tensor> r = shift_scale_op().call(std::span<const Tensor>(a.data(), 1), {{"scale", 3}});
        return std::vector<Tensor>{r[1] - r[0]};
      },
      {rn_kernel_input({10, 4}, 4)});
  CHECK_THAT(m2, Catch::Contains(":2 = \"stablehlo.custom_call\"(%arg0)") &&
                     Catch::Contains("-> (tensor<10x4xf32>, tensor<10x4xf32>)") && Catch::Contains("#1, %v") &&
                     Catch::Contains("backend_config = \"scale=3\""));
}

// Run with the other MLIR checks (tests/CMakeLists.txt) when mlir-opt is installed.
TEST_CASE("kernel op: mlir-opt parses the exported custom_calls", "[.mlir]") {
  const char* tool = std::getenv("TPU_MLIR_OPT");
  REQUIRE(tool != nullptr);
  const std::string m = export_stablehlo(
      [](const std::vector<Tensor>& a) {
        std::vector<Tensor> r = shift_scale_op().call(std::span<const Tensor>(a.data(), 1), {{"scale", 3}});
        return std::vector<Tensor>{linear_relu_op()({r[1], a[1], a[2]}, kBlocks), r[0]};
      },
      {rn_kernel_input({9, 7}, 1), rn_kernel_input({7, 5}, 2), rn_kernel_input({5}, 3)},
      {.syntax = StableHloSyntax::mlir14});
  const std::string path = fmt::format("/tmp/tpucore_kernel_custom_call_{}.mlir", getpid());
  std::ofstream(path) << m;
  const int rc = std::system(fmt::format("'{}' --allow-unregistered-dialect '{}' > /dev/null", tool, path).c_str());
  CHECK(rc == 0);
  std::remove(path.c_str());
}

TEST_CASE("kernel op: the PJRT plugin runs its custom_call on the chip with the interpreter's values", "[kernel][pjrt]") {
  const Tensor x = rn_kernel_input({9, 7}, 5), w = rn_kernel_input({7, 5}, 6), b = rn_kernel_input({5}, 7);
  auto fn = [](const std::vector<Tensor>& a) {
    std::vector<Tensor> r = shift_scale_op().call(std::span<const Tensor>(a.data(), 1), {{"scale", 2}});
    return std::vector<Tensor>{linear_relu_op()({r[1], a[1], a[2]}, kBlocks), r[0]};
  };
  // The reference: the same ops written with library ops on the cpu.
  const std::vector<Tensor> want = {reference(x * 2.0, w, b), x + 1.0};
  auto c = kernel_test_pjrt_client();
  const std::string text = export_stablehlo(fn, {x, w, b});
  auto exe = c->compile(text);
  const std::vector<Tensor> got = exe->execute({x, w, b});
  REQUIRE(got.size() == 2);
  expect_close(got[0], want[0], 1e-5, 1e-5, "linear_relu through PJRT");
  expect_close(got[1], want[1], 1e-6, 1e-6, "shift through PJRT");
  // A target no kernel of this process has, a bad parameter and a wrong operand count fail the compile.
  const std::string one = export_stablehlo(
      [](const std::vector<Tensor>& a) { return std::vector<Tensor>{linear_relu_op()({a[0], a[1], a[2]}, kBlocks)}; },
      {x, w, b});
  auto edited = [&](std::string from, std::string to) {
    std::string t = one;
    const size_t at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
  };
  CHECK_THROWS_WITH(c->compile(edited("\"test_kernel_linear_relu\"", "\"test_kernel_not_there\"")),
                    Catch::Contains("test_kernel_not_there") && Catch::Contains("not a kernel registered"));
  CHECK_THROWS_WITH(c->compile(edited("bk=8", "bk=x")), Catch::Contains("bk=x"));
  std::string few = edited("(%arg0, %arg1, %arg2) {api", "(%arg0, %arg1) {api");
  const std::string sig = "(tensor<9x7xf32>, tensor<7x5xf32>, tensor<5xf32>) -> tensor<9x5xf32>\n";
  few.replace(few.find(sig), sig.size(), "(tensor<9x7xf32>, tensor<7x5xf32>) -> tensor<9x5xf32>\n");
  CHECK_THROWS_WITH(c->compile(few), Catch::Contains("2 operand(s)") && Catch::Contains("takes 3"));
}

TEST_CASE("kernel op: on pjrt:0 eagerly and inside tpu::compile it runs through the plugin", "[kernel][pjrt]") {
  load_pjrt_plugin(kernel_test_lib_dir() + "libpjrt_tpucore_sim.so");
  const bool fallback_was = pjrt_host_fallback();
  set_pjrt_host_fallback(false);  // the op must run as the plugin's executable
  const Device d("pjrt:0");
  const Tensor x = rn_kernel_input({9, 7}, 8), w = rn_kernel_input({7, 5}, 9), b = rn_kernel_input({5}, 10);
  const Tensor want = linear_relu_op()({x, w, b}, kBlocks);  // the cpu interpreter
  const Tensor eager = linear_relu_op()({x.to(d), w.to(d), b.to(d)}, kBlocks);
  CHECK(eager.device() == d);
  expect_close(eager.to(Device()), want, 1e-5, 1e-5, "eager on pjrt:0");
  auto f = compile([](const Tensor& a, const Tensor& ww, const Tensor& bb) {
    return linear_relu_op()({a * 2.0, ww, bb}, kBlocks) + 1.0;
  });
  const PjrtStats s0 = pjrt_stats();
  const Tensor got = f(x.to(d), w.to(d), b.to(d));
  CHECK(pjrt_stats().graph_compiles == s0.graph_compiles + 1);
  expect_close(got.to(Device()), reference(x * 2.0, w, b) + 1.0, 1e-5, 1e-5, "compiled on pjrt:0");
  set_pjrt_host_fallback(fallback_was);
}

TEST_CASE("kernel op: a scalar-prefetch kernel runs inside tpu::compile on the cpu and the chip", "[kernel][jit]") {
  const Tensor x = rn_kernel_input({32, 8}, 11);
  const Tensor table = tensor_from_i32({3, 0, 0, 2});
  Tensor want = cat({x.slice(0, 24, 32), x.slice(0, 0, 8), x.slice(0, 0, 8), x.slice(0, 16, 24)}, 0);
  auto f = compile([](const Tensor& t, const Tensor& a) { return block_gather_op()({t, a * 3.0}) - 1.0; });
  expect_close(f(table, x), want * 3.0 - 1.0, 1e-6, 1e-6, "compiled on the cpu");
  const Device sim("sim:0");
  expect_close(f(table.to(sim), x.to(sim)).to(Device()), want * 3.0 - 1.0, 1e-6, 1e-6, "compiled on sim:0");
  // Another table, same shapes: the values follow the new table.
  const Tensor table2 = tensor_from_i32({1, 1, 3, 0});
  Tensor want2 = cat({x.slice(0, 8, 16), x.slice(0, 8, 16), x.slice(0, 24, 32), x.slice(0, 0, 8)}, 0);
  expect_close(f(table2.to(sim), x.to(sim)).to(Device()), want2 * 3.0 - 1.0, 1e-6, 1e-6, "new table on sim:0");
}

}  // namespace
}  // namespace tpu
