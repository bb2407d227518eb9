// Fused elementwise regions with several outputs (an optimizer update: the new parameter and
// the new moments) run on sim as ONE ElementwiseKernel program that stores every output, and
// equal the same math on the cpu (f32 from the same values, rounded to the output dtype at the
// end), for ragged shapes, the pipelined row tiles and the 2-D tile loops. Compiled SGD-momentum
// and AdamW training steps on sim take no more simulated cycles than the eager steps.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "codegen_testing.h"
#include "jit_testing.h"
#include "tpucore/autograd.h"
#include "tpucore/nn.h"

namespace tpu::testing {
namespace {

using jit_testing::expect_close;
using jit_testing::rnd;

// Shapes: 1-D; ragged rows x cols (whole-row tiles); many rows (pipelined row tiles with a
// ragged last tile on the tiny chip); long rows (2-D tile loops with ragged column tiles).
const std::vector<Shape> kShapes{Shape{7}, Shape{37, 19}, Shape{301, 131}, Shape{2, 9001}, Shape{3, 4, 5}};

Tensor to_cpu_f32(const Tensor& t) { return t.to(Device()).to(DType::f32); }

// Runs f three times (trace, warm, measured) and checks the measured call is one region program.
template <class F, class... A>
auto one_region_call(F& f, const A&... args) {
  (void)f(args...);
  (void)f(args...);
  ChipRunProbe probe;
  const uint64_t region0 = codegen::stats().runs_by_kernel["region:elementwise"];
  auto got = f(args...);
  CHECK(probe.new_runs() == 1);
  CHECK(probe.new_fallbacks() == 0);
  CHECK(codegen::stats().runs_by_kernel["region:elementwise"] == region0 + 1);
  return got;
}

TEST_CASE("codegen: a compiled 2-output update (SGD momentum) is one chip program", "[codegen][multi_output]") {
  TinySim tiny;
  const Device d = tiny.dev();
  // buf' = g + mu buf; p' = p - lr buf' (the fusion pass makes one region of it)
  auto update = [](const Tensor& p, const Tensor& g, const Tensor& buf, double lr) {
    Tensor b2 = add(g, buf, 0.9);
    Tensor p2 = p - b2 * lr;
    return std::make_tuple(p2, b2);
  };
  for (DType dt : {DType::f32, DType::bf16})
    for (const Shape& sh : kShapes) {
      INFO(dtype_name(dt) << " " << sh.str());
      const Tensor p = rnd(sh, 1).to(dt), g = rnd(sh, 2).to(dt), buf = rnd(sh, 3).to(dt);
      auto f = compile(update, {.name = "multi_output_sgd"});
      auto [p2, b2] = one_region_call(f, p.to(d), g.to(d), buf.to(d), 0.05);
      CHECK(p2.dtype() == dt);
      CHECK(b2.dtype() == dt);
      auto [wp, wb] = update(p.to(DType::f32), g.to(DType::f32), buf.to(DType::f32), 0.05);
      const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
      expect_close(to_cpu_f32(p2), wp.to(dt).to(DType::f32), tol, tol, "new parameter");
      expect_close(to_cpu_f32(b2), wb.to(dt).to(DType::f32), tol, tol, "new momentum");
    }
}

TEST_CASE("codegen: a compiled 3-output update (AdamW) is one chip program", "[codegen][multi_output]") {
  TinySim tiny;
  const Device d = tiny.dev();
  // The traced AdamW update (without weight decay) of an unscaled gradient g * gscale, with the
  // scale and the bias corrections as 0-d device tensors (scalar operands). Written so that the
  // fusion pass makes one region of it: every node reads a value of the region (a node reading
  // only graph inputs, like m * 0.9, would start a region of its own).
  auto update = [](const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& gscale,
                   const Tensor& bc1, const Tensor& bc2, double lr) {
    Tensor gs = g * gscale;
    Tensor m2 = add(gs * 0.1, m, 0.9);
    Tensor v2 = add(gs * gs * 0.001, v, 0.999);
    Tensor denom = sqrt(v2 / bc2) + 1e-8;
    Tensor p2 = p - m2 / bc1 / denom * lr;
    return std::make_tuple(p2, m2, v2);
  };
  for (DType dt : {DType::f32, DType::bf16})
    for (const Shape& sh : kShapes) {
      INFO(dtype_name(dt) << " " << sh.str());
      const Tensor p = rnd(sh, 4).to(dt), g = rnd(sh, 5).to(dt), m = mul(rnd(sh, 6), 0.1).to(dt),
                   v = abs(rnd(sh, 7)).to(dt);
      const Tensor gscale = scalar_tensor(0.5, TensorOptions(dt)), bc1 = scalar_tensor(1.0 - 0.9 * 0.9, TensorOptions(dt)),
                   bc2 = scalar_tensor(1.0 - 0.999 * 0.999, TensorOptions(dt));
      auto f = compile(update, {.name = "multi_output_adamw"});
      auto [p2, m2, v2] =
          one_region_call(f, p.to(d), g.to(d), m.to(d), v.to(d), gscale.to(d), bc1.to(d), bc2.to(d), 3e-3);
      auto [wp, wm, wv] = update(p.to(DType::f32), g.to(DType::f32), m.to(DType::f32), v.to(DType::f32),
                                 gscale.to(DType::f32), bc1.to(DType::f32), bc2.to(DType::f32), 3e-3);
      const double tol = dt == DType::f32 ? 1e-4 : 1e-2;
      expect_close(to_cpu_f32(p2), wp.to(dt).to(DType::f32), tol, tol, "new parameter");
      expect_close(to_cpu_f32(m2), wm.to(dt).to(DType::f32), tol, tol, "new exp_avg");
      expect_close(to_cpu_f32(v2), wv.to(dt).to(DType::f32), tol, tol, "new exp_avg_sq");
    }
}

TEST_CASE("codegen: a multi-output region stores each output in its own dtype", "[codegen][multi_output]") {
  TinySim tiny;
  const Device d = tiny.dev();
  // f32 master weights and their bf16 copy (the same value stored twice), plus a bool mask.
  auto update = [](const Tensor& p, const Tensor& g, double lr) {
    Tensor p2 = p - g * lr;
    return std::make_tuple(p2, p2.to(DType::bf16), gt(p2, 0.0));
  };
  for (const Shape& sh : kShapes) {
    INFO(sh.str());
    const Tensor p = rnd(sh, 8), g = rnd(sh, 9);
    auto f = compile(update, {.name = "multi_output_dtypes"});
    auto [p2, p2h, pos] = one_region_call(f, p.to(d), g.to(d), 0.25);
    const Tensor wp = sub(p, mul(g, 0.25));
    expect_close(p2.to(Device()), wp, 1e-6, 1e-6, "f32 parameter");
    // The other outputs are exact conversions of the chip's f32 result.
    const Tensor chip_p2 = p2.to(Device());
    CHECK(p2h.dtype() == DType::bf16);
    expect_close(to_cpu_f32(p2h), chip_p2.to(DType::bf16).to(DType::f32), 0, 0, "bf16 copy");
    CHECK(pos.dtype() == DType::boolean);
    expect_close(to_cpu_f32(pos), gt(chip_p2, 0.0).to(DType::f32), 0, 0, "mask");
  }
}

TEST_CASE("codegen: matmul and rowwise regions with several outputs run as two programs", "[codegen][multi_output]") {
  TinySim tiny;
  const Device d = tiny.dev();
  auto count = [](const char* k) { return codegen::stats().runs_by_kernel[k]; };
  SECTION("linear + relu + its mask: the linear, then one elementwise program") {
    auto fn = [](const Tensor& x, const Tensor& w, const Tensor& b) {
      Tensor h = linear(x, w, b);
      return std::make_tuple(relu(h), gt(h, 0.0));
    };
    const Tensor x = rnd({37, 24}, 11), w = rnd({40, 24}, 12), b = rnd({40}, 13);
    auto f = compile(fn, {.name = "multi_output_linear"});
    const Tensor xd = x.to(d), wd = w.to(d), bd = b.to(d);
    (void)f(xd, wd, bd);
    ChipRunProbe probe;
    const uint64_t mm0 = count("region:matmul"), ew0 = count("region:elementwise");
    auto [r, m] = f(xd, wd, bd);
    CHECK(probe.new_runs() == 2);
    CHECK(probe.new_fallbacks() == 0);
    CHECK(count("region:matmul") == mm0 + 1);
    CHECK(count("region:elementwise") == ew0 + 1);
    auto [wr, wm] = fn(x, w, b);
    expect_close(r.to(Device()), wr, 1e-4, 1e-4, "relu(linear)");
    CHECK(m.dtype() == DType::boolean);
    expect_close(to_cpu_f32(m), gt(linear(x, w, b), 0.0).to(DType::f32), 0, 0, "mask");
  }
  SECTION("log_softmax and its backward: the row op, then one elementwise program") {
    // As cross_entropy's backward: gy - exp(log_softmax(x)) * rowsum(gy), rowsum a column vector.
    auto fn = [](const Tensor& x, const Tensor& gy, const Tensor& s) {
      Tensor ls = log_softmax(x, 1);
      return std::make_tuple(ls, gy - exp(ls) * s);
    };
    const Tensor x = rnd({45, 10}, 14), gy = rnd({45, 10}, 15), s = rnd({45, 1}, 16);
    auto f = compile(fn, {.name = "multi_output_log_softmax"});
    const Tensor xd = x.to(d), gyd = gy.to(d), sd = s.to(d);
    (void)f(xd, gyd, sd);
    ChipRunProbe probe;
    const uint64_t rw0 = count("region:rowwise"), ew0 = count("region:elementwise");
    auto [ls, gx] = f(xd, gyd, sd);
    CHECK(probe.new_runs() == 2);
    CHECK(probe.new_fallbacks() == 0);
    CHECK(count("region:rowwise") == rw0 + 1);
    CHECK(count("region:elementwise") == ew0 + 1);
    auto [wls, wgx] = fn(x, gy, s);
    expect_close(ls.to(Device()), wls, 1e-4, 1e-4, "log_softmax");
    expect_close(gx.to(Device()), wgx, 1e-4, 1e-4, "backward");
  }
}

// Simulated cycles, programs run, host fallbacks and per-kernel cycles of one call of `step`.
struct StepCost {
  double cycles = 0;
  uint64_t runs = 0, fallbacks = 0;
  std::map<std::string, double> cycles_by_kernel;
  std::map<std::string, uint64_t> runs_by_kernel;
};

template <class F>
StepCost measure(F&& step) {
  ChipRunProbe probe;
  const codegen::CodegenStats s0 = codegen::stats();
  step();
  StepCost c;
  c.cycles = probe.new_cycles();
  c.runs = probe.new_runs();
  c.fallbacks = probe.new_fallbacks();
  const codegen::CodegenStats s1 = codegen::stats();
  for (const auto& [k, v] : s1.cycles_by_kernel) {
    const auto it = s0.cycles_by_kernel.find(k);
    const double dv = v - (it == s0.cycles_by_kernel.end() ? 0.0 : it->second);
    if (dv > 0) c.cycles_by_kernel[k] = dv;
  }
  for (const auto& [k, v] : s1.runs_by_kernel) {
    const auto it = s0.runs_by_kernel.find(k);
    const uint64_t dv = v - (it == s0.runs_by_kernel.end() ? 0 : it->second);
    if (dv > 0) c.runs_by_kernel[k] = dv;
  }
  return c;
}

std::string breakdown(const StepCost& c) {
  std::string s = fmt::format("{:.0f} cycles, {} programs, {} host fallbacks:", c.cycles, c.runs, c.fallbacks);
  for (const auto& [k, v] : c.cycles_by_kernel)
    s += fmt::format(" {} {:.0f} ({}x);", k, v, c.runs_by_kernel.count(k) ? c.runs_by_kernel.at(k) : 0);
  return s;
}

struct Batch {
  Tensor x, y;
};

// Eager and compiled costs of one training step (the Fashion-MNIST example's: zero_grad,
// forward, cross_entropy, backward, optimizer step, and the count of correct predictions) of an
// MLP with `dims` on device `dev`, measured at the third step (optimizer state exists, the
// compiled step is traced and its programs are built).
template <class Opt, class MakeOpt>
std::pair<StepCost, StepCost> step_costs(Device dev, const std::vector<int64_t>& dims, int64_t batch, MakeOpt make_opt,
                                         const std::string& name, bool print_graph = false) {
  Generator g1(5), g2(5), gd(9);
  auto eager_model = std::make_shared<nn::MLP>(dims, "relu", 0.0, &g1);
  auto comp_model = std::make_shared<nn::MLP>(dims, "relu", 0.0, &g2);
  eager_model->to(dev);
  comp_model->to(dev);
  Opt eager_opt = make_opt(eager_model->parameters());
  Opt comp_opt = make_opt(comp_model->parameters());
  const Batch b{randn({batch, dims.front()}, {}, &gd).to(dev), randint(0, dims.back(), {batch}, DType::i32, &gd).to(dev)};
  auto step_fn = [](nn::Module& m, optim::Optimizer& opt, const Tensor& x, const Tensor& y, double lr) {
    opt.zero_grad();
    Tensor logits = m.forward(x);
    Tensor loss = nn::cross_entropy(logits, y);
    loss.backward();
    opt.set_lr(lr);
    opt.step();
    NoGradGuard ng;
    return std::make_tuple(loss.detach(), sum(eq(argmax(logits, 1), y)));
  };
  auto compiled = compile([&](const Tensor& x, const Tensor& y, double lr) { return step_fn(*comp_model, comp_opt, x, y, lr); },
                          {.name = name});
  for (int i = 0; i < 2; ++i) {
    (void)step_fn(*eager_model, eager_opt, b.x, b.y, 0.01);
    (void)compiled(b.x, b.y, 0.01);
  }
  const StepCost e = measure([&] { (void)step_fn(*eager_model, eager_opt, b.x, b.y, 0.01); });
  const StepCost c = measure([&] { (void)compiled(b.x, b.y, 0.01); });
  if (print_graph)
    for (const std::string& text : compiled.graphs()) std::printf("%s\n", text.c_str());
  // Both took the same three steps.
  auto pe = eager_model->named_parameters(), pc = comp_model->named_parameters();
  for (size_t i = 0; i < pe.size(); ++i)
    expect_close(to_cpu_f32(pc[i].second), to_cpu_f32(pe[i].second), 2e-2, 2e-2, pe[i].first);
  return {e, c};
}

auto make_sgd = [](std::vector<Tensor> p) { return optim::SGD(std::move(p), {.lr = 0.01, .momentum = 0.9}); };
auto make_adamw = [](std::vector<Tensor> p) { return optim::AdamW(std::move(p), {.lr = 0.01, .weight_decay = 1e-4}); };

TEST_CASE("codegen: compiled SGD-momentum and AdamW training steps take no more chip cycles than eager",
          "[codegen][multi_output][training]") {
  TinySim tiny;
  const std::vector<int64_t> dims{64, 96, 10};
  const auto [se, sc] = step_costs<optim::SGD>(tiny.dev(), dims, 32, make_sgd, "multi_output_train_sgd");
  INFO("SGD eager: " << breakdown(se));
  INFO("SGD compiled: " << breakdown(sc));
  CHECK(sc.cycles <= se.cycles);
  CHECK(sc.runs <= se.runs);
  const auto [ae, ac] = step_costs<optim::AdamW>(tiny.dev(), dims, 32, make_adamw, "multi_output_train_adamw");
  INFO("AdamW eager: " << breakdown(ae));
  INFO("AdamW compiled: " << breakdown(ac));
  CHECK(ac.cycles <= ae.cycles);
  CHECK(ac.runs <= ae.runs);
}

// The figures of codegen/README.md: the Fashion-MNIST example's step (MLP 784-256-10, batch 64)
// on the v5e preset, ideal and calibrated timing models. Hidden; run with "[measure]".
TEST_CASE("codegen: measure the compiled vs eager Fashion-MNIST training step on v5e", "[.][measure]") {
  struct V5e {  // sim:1 on a v5e preset for this test
    std::string prev = device::sim_chip(1);
    explicit V5e(const char* chip) { set_sim_chip(chip, 1); }
    ~V5e() {
      try {
        set_sim_chip(prev, 1);
      } catch (...) {
      }
    }
  };
  const Device d("sim:1");
  const std::vector<int64_t> dims{784, 256, 10};
  for (const char* chip : {"v5e-ideal", "v5e"}) {  // ideal and calibrated timing models
    V5e v5e(chip);
    std::printf("%s:\n", chip);
    const bool print_graph = std::getenv("TPU_TEST_PRINT_GRAPH") != nullptr;
    const auto [ae, ac] = step_costs<optim::AdamW>(d, dims, 64, make_adamw, "measure_train_adamw", print_graph);
    std::printf("AdamW eager:    %s\nAdamW compiled: %s\n", breakdown(ae).c_str(), breakdown(ac).c_str());
    const auto [se, sc] = step_costs<optim::SGD>(d, dims, 64, make_sgd, "measure_train_sgd", print_graph);
    std::printf("SGD eager:      %s\nSGD compiled:   %s\n", breakdown(se).c_str(), breakdown(sc).c_str());
  }
}

}  // namespace
}  // namespace tpu::testing
