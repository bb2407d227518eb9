// Defects found on `sim` by an independent reference: explicit bf16 roundings in
// compiled code, layer_norm with a large mean, device mismatches in backward formulas and
// wrapped numbers, and the result dtype of a compiled f16 matmul. References are computed here,
// in double, with this file's own bf16 rounding.
#include <cstring>

#include "codegen_testing.h"
#include "jit_testing.h"
#include "tpucore/autograd.h"

namespace tpu::testing {
namespace {

// Round-to-nearest-even of a float to bf16, written from the definition (keep the top 16 bits).
float round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

Tensor around(const Shape& s, double centre, uint64_t seed) {
  return jit_testing::rnd(s, seed) + centre;
}

}  // namespace

TEST_CASE("hardening: compiled casts to bf16 round on sim as eager does (issue 16, item 1)", "[hardening][codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Tensor x = around({6, 40}, 74.0, 1), y = around({6, 40}, 3.0, 2);
  const std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>();
  x = x.to(d);
  y = y.to(d);
  auto roundtrip = tpu::compile([](const Tensor& a) { return a.to(DType::bf16).to(DType::f32); }, {.name = "h1_round"});
  auto times = tpu::compile([](const Tensor& a, const Tensor& b) { return a.to(DType::bf16).to(DType::f32) * b; },
                            {.name = "h1_times"});
  for (int call = 0; call < 2; ++call) {  // the tracing call and the cached one
    const std::vector<float> r = roundtrip(x).to("cpu").to_vector<float>();
    const std::vector<float> t = times(x, y).to("cpu").to_vector<float>();
    REQUIRE(r.size() == xv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      INFO("call " << call << " element " << i << ": x = " << xv[i]);
      REQUIRE(r[i] == round_bf16(xv[i]));
      REQUIRE(t[i] == round_bf16(xv[i]) * yv[i]);
    }
  }
  // A bf16 matmul whose result is cast to f32: every value is a bf16 value.
  Tensor a = around({8, 16}, 0.5, 3), b = around({16, 8}, 0.5, 4);
  auto mm = tpu::compile([](const Tensor& p, const Tensor& q) { return tpu::matmul(p, q).to(DType::f32); },
                         {.name = "h1_matmul"});
  const Tensor ab = a.to(DType::bf16).to(d), bb = b.to(DType::bf16).to(d);
  const std::vector<float> av = ab.to("cpu").to(DType::f32).to_vector<float>(),
                           bv = bb.to("cpu").to(DType::f32).to_vector<float>();
  for (int call = 0; call < 2; ++call) {
    const std::vector<float> got = mm(ab, bb).to("cpu").to_vector<float>();
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j) {
        double ref = 0;
        for (int k = 0; k < 16; ++k) ref += double(av[size_t(i * 16 + k)]) * bv[size_t(k * 8 + j)];
        const float g = got[size_t(i * 8 + j)];
        INFO("call " << call << " (" << i << ", " << j << "): got " << g << ", exact " << ref);
        REQUIRE(g == round_bf16(g));
        REQUIRE(std::fabs(g - ref) <= std::fabs(ref) / 128 + 1e-3);
      }
  }
}

TEST_CASE("hardening: layer_norm on sim is accurate for inputs with a large mean (item 2)", "[hardening][codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  for (double centre : {100.0, 10000.0}) {
    const Tensor x = around({4, 96}, centre, 5);
    const std::vector<float> xv = x.to_vector<float>();
    std::vector<double> ref(xv.size());
    for (int r = 0; r < 4; ++r) {
      double m = 0, v = 0;
      for (int c = 0; c < 96; ++c) m += xv[size_t(r * 96 + c)];
      m /= 96;
      for (int c = 0; c < 96; ++c) v += (xv[size_t(r * 96 + c)] - m) * (xv[size_t(r * 96 + c)] - m);
      v /= 96;
      for (int c = 0; c < 96; ++c) ref[size_t(r * 96 + c)] = (xv[size_t(r * 96 + c)] - m) / std::sqrt(v + 1e-5);
    }
    auto err_of = [&](const Tensor& y) {
      const std::vector<float> g = y.to("cpu").to_vector<float>();
      double e = 0;
      for (size_t i = 0; i < g.size(); ++i) e = std::max(e, std::fabs(g[i] - ref[i]));
      return e;
    };
    auto ln = [](const Tensor& t) { return tpu::layer_norm(t, {96}); };
    auto compiled = tpu::compile(ln, {.name = "h2_layer_norm"});
    const double cpu_err = err_of(ln(x)), eager_err = err_of(ln(x.to(d)));
    (void)compiled(x.to(d));
    const double compiled_err = err_of(compiled(x.to(d)));
    INFO("mean " << centre << ": cpu error " << cpu_err << ", sim eager " << eager_err << ", sim compiled "
                 << compiled_err);
    // Within 1.5 times the cpu's error, and never worse than a few f32 ulps of 1.
    const double bound = std::max(1.5 * cpu_err, 2e-6);
    CHECK(eager_err <= bound);
    CHECK(compiled_err <= bound);
  }
}

TEST_CASE("hardening: the gradient of pow(x, 3) on sim stays on sim (item 3)", "[hardening][autograd]") {
  TinySim tiny;
  const Device d = tiny.dev();
  const Tensor x0 = jit_testing::rnd({5, 7}, 6);
  Tensor x = x0.to(d);
  x.requires_grad_();
  Tensor y = tpu::pow(x, 3).sum();
  y.backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().device() == d);
  const std::vector<float> g = x.grad().to("cpu").to_vector<float>(), xv = x0.to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i) CHECK(std::fabs(g[i] - 3.0 * xv[i] * xv[i]) <= 1e-5 * (1 + 3 * xv[i] * xv[i]));
}

TEST_CASE("hardening: a number divided by an i32 tensor compiles on sim (item 4)", "[hardening][jit]") {
  TinySim tiny;
  const Device d = tiny.dev();
  const std::vector<int32_t> xv = {1, 2, 3, -4, 7, 9, -11, 12};
  const Tensor x = tpu::from_vector(xv, {8}).to(d);
  auto f = tpu::compile([](const Tensor& t) { return 3 / t; }, {.name = "h4_rdiv"});
  for (int call = 0; call < 2; ++call) {
    const Tensor got = f(x);
    CHECK(got.device() == d);
    REQUIRE(got.dtype() == DType::f32);
    const std::vector<float> g = got.to("cpu").to_vector<float>();
    for (size_t i = 0; i < xv.size(); ++i) CHECK(g[i] == Approx(3.0 / xv[i]).epsilon(1e-6));
  }
}

TEST_CASE("hardening: a compiled f16 matmul on sim returns f16 as eager does (item 5)", "[hardening][codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  const Tensor a = jit_testing::rnd({8, 16}, 7).to(DType::f16), b = jit_testing::rnd({16, 8}, 8).to(DType::f16);
  auto mm = tpu::compile([](const Tensor& p, const Tensor& q) { return tpu::matmul(p, q); }, {.name = "h5_f16"});
  const Tensor eager = tpu::matmul(a.to(d), b.to(d));
  REQUIRE(eager.dtype() == DType::f16);
  const std::vector<float> av = a.to(DType::f32).to_vector<float>(), bv = b.to(DType::f32).to_vector<float>();
  for (int call = 0; call < 2; ++call) {
    const Tensor got = mm(a.to(d), b.to(d));
    CHECK(got.dtype() == DType::f16);
    const std::vector<float> g = got.to("cpu").to(DType::f32).to_vector<float>();
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j) {
        double ref = 0;
        for (int k = 0; k < 16; ++k) ref += double(av[size_t(i * 16 + k)]) * bv[size_t(k * 8 + j)];
        CHECK(std::fabs(g[size_t(i * 8 + j)] - ref) <= 2e-3 * (1 + std::fabs(ref)));
      }
  }
}

TEST_CASE("hardening: eager copies into non-contiguous views on sim (item 6)", "[hardening][views]") {
  TinySim tiny;
  const Device d = tiny.dev();
  // Reference: a 5 x 8 grid of doubles written by hand.
  std::vector<double> ref(40);
  for (int i = 0; i < 40; ++i) ref[size_t(i)] = i;
  Tensor x = tpu::arange(0, 40, 1, TensorOptions(DType::f32)).reshape({5, 8}).to(d);
  Tensor col = x.narrow(1, 2, 3);  // columns 2..4 of every row
  Tensor src = jit_testing::rnd({5, 3}, 9);
  const std::vector<float> sv = src.to_vector<float>();
  col.copy_(src.to(d));
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 3; ++c) ref[size_t(r * 8 + 2 + c)] = sv[size_t(r * 3 + c)];
  Tensor column = x.select(1, 6);  // one column: stride 8
  column.copy_(tpu::full({5}, 7.5).to(d));
  for (int r = 0; r < 5; ++r) ref[size_t(r * 8 + 6)] = 7.5;
  Tensor every_other = x.select(0, 3).slice(0, 1, 8, 2);  // row 3, columns 1, 3, 5, 7
  every_other.add_(100.0);
  for (int c = 1; c < 8; c += 2) ref[size_t(3 * 8 + c)] += 100;
  Tensor bcast = x.narrow(0, 0, 2).narrow(1, 5, 2);  // a broadcast source into a 2 x 2 corner
  bcast.copy_(tpu::full({2}, -1.0).to(d));
  for (int r = 0; r < 2; ++r)
    for (int c = 5; c < 7; ++c) ref[size_t(r * 8 + c)] = -1;
  const std::vector<float> got = x.to("cpu").to_vector<float>();
  for (size_t i = 0; i < ref.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == float(ref[i]));
  }
  CHECK(x.device() == d);
}

}  // namespace tpu::testing
