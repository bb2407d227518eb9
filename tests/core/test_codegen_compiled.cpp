// tpu::compile on sim tensors: fused regions run as codegen kernels (a matmul with its bias,
// activation and residual in the epilogue; elementwise chains as one kernel) and the results
// equal eager on sim.
#include "codegen_testing.h"
#include "jit_testing.h"

namespace tpu::testing {

TEST_CASE("codegen: compiled MLP on sim equals eager, both linears in one kernel", "[codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Tensor x = jit_testing::rnd({2, 6, 16}, 1).to(d);
  Tensor w1 = jit_testing::rnd({32, 16}, 2).to(d), b1 = jit_testing::rnd({32}, 3).to(d);
  Tensor w2 = jit_testing::rnd({16, 32}, 4).to(d), b2 = jit_testing::rnd({16}, 5).to(d);
  auto mlp = [&](const Tensor& in) { return in + tpu::linear(tpu::gelu(tpu::linear(in, w1, b1)), w2, b2); };
  Tensor eager = mlp(x);
  auto f = tpu::compile(mlp, {.name = "codegen_mlp"});
  (void)f(x);  // first call traces
  ChipRunProbe probe;
  const uint64_t fused0 = codegen::stats().runs_by_kernel["region:mlp"];
  Tensor got = f(x);
  CHECK(got.device() == d);
  CHECK(probe.new_fallbacks() == 0);
  CHECK(codegen::stats().runs_by_kernel["region:mlp"] == fused0 + 1);
  CHECK(probe.new_runs() == 1);
  jit_testing::expect_close(got.to("cpu"), eager.to("cpu"), 1e-4, 1e-4, "compiled MLP vs eager on sim");
}

TEST_CASE("codegen: compiled linear with activation and residual epilogue on sim equals eager", "[codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Tensor x = jit_testing::rnd({20, 24}, 11).to(d), r = jit_testing::rnd({20, 40}, 12).to(d);
  Tensor w = jit_testing::rnd({40, 24}, 13).to(d), b = jit_testing::rnd({40}, 14).to(d);
  auto fn = [&](const Tensor& in) { return (tpu::silu(tpu::linear(in, w, b)) + r).to(DType::bf16); };
  Tensor eager = fn(x);
  auto f = tpu::compile(fn, {.name = "codegen_epilogue"});
  (void)f(x);
  ChipRunProbe probe;
  const uint64_t fused0 = codegen::stats().runs_by_kernel["region:matmul"];
  Tensor got = f(x);
  CHECK(probe.new_runs() == 1);
  CHECK(probe.new_fallbacks() == 0);
  CHECK(codegen::stats().runs_by_kernel["region:matmul"] == fused0 + 1);
  jit_testing::expect_close(got.to("cpu").to(DType::f32), eager.to("cpu").to(DType::f32), 1e-2, 1e-2,
                            "compiled epilogue vs eager on sim");
}

TEST_CASE("codegen: compiled elementwise chain is one chip kernel", "[codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Tensor x = jit_testing::rnd({33, 20}, 6).to(d), w = jit_testing::rnd({20}, 7).to(d);
  auto fn = [&](const Tensor& in) { return tpu::sigmoid(in * w + 0.5) * in; };
  Tensor eager = fn(x);
  auto f = tpu::compile(fn, {.name = "codegen_chain"});
  (void)f(x);
  ChipRunProbe probe;
  Tensor got = f(x);
  CHECK(probe.new_runs() == 1);
  CHECK(probe.new_fallbacks() == 0);
  jit_testing::expect_close(got.to("cpu"), eager.to("cpu"), 1e-5, 1e-5, "compiled chain vs eager on sim");
}

TEST_CASE("codegen: compiled softmax and layer_norm on sim equal eager", "[codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Tensor x = jit_testing::rnd({4, 7, 24}, 8).to(d), w = jit_testing::rnd({24}, 9).to(d), b = jit_testing::rnd({24}, 10).to(d);
  auto fn = [&](const Tensor& in) {
    return tpu::softmax(in * 0.5, -1) + tpu::layer_norm(in, {24}, w, b) + tpu::rms_norm(in, {24}, w);
  };
  Tensor eager = fn(x);
  auto f = tpu::compile(fn, {.name = "codegen_rowwise"});
  (void)f(x);
  ChipRunProbe probe;
  Tensor got = f(x);
  CHECK(probe.new_fallbacks() == 0);
  CHECK(probe.new_runs() >= 1);
  jit_testing::expect_close(got.to("cpu"), eager.to("cpu"), 1e-5, 1e-5, "compiled rowwise vs eager on sim");
}

}  // namespace tpu::testing

namespace tpu::testing {

TEST_CASE("codegen: a compiled softmax / layer_norm region with producers and consumers is one kernel", "[codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Tensor x = jit_testing::rnd({6, 5, 40}, 15).to(d), r = jit_testing::rnd({6, 5, 40}, 16).to(d);
  Tensor w = jit_testing::rnd({40}, 17).to(d), b = jit_testing::rnd({40}, 18).to(d);
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> fn;
  };
  const Case cases[] = {
      {"softmax", [&](const Tensor& in) { return tpu::softmax(in * 0.5 + r, -1) * 2.0; }},
      {"log_softmax", [&](const Tensor& in) { return tpu::log_softmax(in - w, -1); }},
      {"layer_norm", [&](const Tensor& in) { return tpu::layer_norm(in + r, {40}, w, b) * 3.0 + r; }},
      {"rms_norm", [&](const Tensor& in) { return tpu::silu(tpu::rms_norm(in * in, {40}, w)); }},
  };
  for (const Case& c : cases) {
    Tensor eager = c.fn(x);
    auto f = tpu::compile(c.fn, {.name = std::string("codegen_") + c.name});
    (void)f(x);
    ChipRunProbe probe;
    const uint64_t fused0 = codegen::stats().runs_by_kernel["region:rowwise"];
    Tensor got = f(x);
    INFO(c.name);
    CHECK(probe.new_runs() == 1);
    CHECK(probe.new_fallbacks() == 0);
    CHECK(codegen::stats().runs_by_kernel["region:rowwise"] == fused0 + 1);
    jit_testing::expect_close(got.to("cpu"), eager.to("cpu"), 1e-5, 1e-5, std::string("compiled vs eager: ") + c.name);
  }
}

}  // namespace tpu::testing
