// Kernel ops: a kernel registered with a shape rule and a backward (itself partly another kernel
// op) runs eagerly, records autograd, traces into tpu::compile as one node and trains inside a
// compiled step like the same model written with library ops.
#include <catch2/catch.hpp>

#include "examples/kernels/matmul_epilogue.h"
#include "jit_testing.h"
#include "tpucore/autograd.h"
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

}  // namespace
}  // namespace tpu
