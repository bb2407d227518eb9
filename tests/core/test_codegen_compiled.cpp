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

TEST_CASE("codegen: a fused region with more operands than the chip has registers runs node by node", "[codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  // One elementwise chain reading 40 tensors: more inputs than a program has scalar registers
  // for addresses, so the region must not lower as one kernel (and must not fail).
  std::vector<Tensor> xs;
  for (int i = 0; i < 40; ++i) xs.push_back(jit_testing::rnd({8, 16}, 200 + i).to(d));
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor acc = in[0];
    for (size_t i = 1; i < in.size(); ++i) acc = acc * 0.5 + in[i];
    return acc;
  };
  Tensor eager = fn(xs);
  auto f = tpu::compile(fn, {.name = "codegen_many_inputs"});
  Tensor got = f(xs);
  got = f(xs);
  CHECK(got.device() == d);
  jit_testing::expect_close(got.to("cpu"), eager.to("cpu"), 1e-5, 1e-5, "40-input chain on sim vs eager");
  // The same chain as a matmul epilogue: too many operands for the matmul kernel too.
  Tensor a = jit_testing::rnd({8, 12}, 300).to(d), bm = jit_testing::rnd({12, 16}, 301).to(d);
  auto mm = [&](const std::vector<Tensor>& in) {
    Tensor acc = tpu::matmul(a, bm);
    for (const Tensor& t : in) acc = acc * 0.5 + t;  // every node joins the matmul's region
    return acc;
  };
  auto fm = tpu::compile(mm, {.name = "codegen_many_epilogue"});
  jit_testing::expect_close(fm(xs).to("cpu"), mm(xs).to("cpu"), 1e-4, 1e-4, "40-input epilogue on sim vs eager");
  // And as the epilogue of a row-wise region (softmax, then the chain).
  auto sm = [&](const std::vector<Tensor>& in) {
    Tensor acc = tpu::softmax(in[0], -1);
    for (size_t i = 1; i < in.size(); ++i) acc = acc * 0.5 + in[i];
    return acc;
  };
  auto fs = tpu::compile(sm, {.name = "codegen_many_rowwise"});
  jit_testing::expect_close(fs(xs).to("cpu"), sm(xs).to("cpu"), 1e-4, 1e-4, "40-input rowwise epilogue on sim vs eager");
  // And between two chained linears.
  Tensor xin = jit_testing::rnd({8, 16}, 302).to(d);
  Tensor w1 = jit_testing::rnd({16, 16}, 303).to(d), w2 = jit_testing::rnd({16, 16}, 304).to(d);
  auto mlp = [&](const std::vector<Tensor>& in) {
    Tensor h = tpu::linear(xin, w1);
    for (const Tensor& t : in) h = h * 0.5 + t;
    return tpu::linear(h, w2);
  };
  auto fl = tpu::compile(mlp, {.name = "codegen_many_mlp"});
  jit_testing::expect_close(fl(xs).to("cpu"), mlp(xs).to("cpu"), 1e-4, 1e-4, "40-input MLP epilogue on sim vs eager");
  // A chain within the limit stays one kernel.
  std::vector<Tensor> few(xs.begin(), xs.begin() + 8);
  (void)f(few);
  ChipRunProbe probe;
  Tensor got8 = f(few);
  CHECK(probe.new_runs() == 1);
  jit_testing::expect_close(got8.to("cpu"), fn(few).to("cpu"), 1e-5, 1e-5, "8-input chain on sim vs eager");
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
