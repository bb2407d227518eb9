// The Highway vector math on every target this CPU runs (AVX-512, AVX2, SSE4 and the baseline
// fallback, each called through its own table, so the AVX2 path is tested on an AVX-512 CPU
// too): which targets are offered, the TPU_CPU_ISA cap, a sweep over float bit patterns and the
// fused gelu(x * w + b) pass against double-precision references.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ops/cpu/vec_math.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/error.h"
#include "tpucore/ops.h"

using tpu::ops::cpu::VecBinary;
using tpu::ops::cpu::VecMathTable;
using tpu::ops::cpu::VecOperand;
using tpu::ops::cpu::VecStep;
using tpu::ops::cpu::VecStepKind;
using tpu::ops::cpu::VecUnary;

namespace {

// |got - ref| in ulps of the f32 result (below the normal range: in units of the smallest
// normal's ulp, so denormal results are not over-counted). Infinite or NaN references must be
// matched exactly.
double ulps(float got, double ref) {
  if (std::isnan(ref)) return std::isnan(got) ? 0.0 : 1e9;
  if (std::fabs(ref) > 3.4028234663852886e38) return std::isinf(got) && (got > 0) == (ref > 0) ? 0.0 : 1e9;
  if (!std::isfinite(got)) return 1e9;
  const double unit = std::ldexp(1.0, std::max(std::ilogb(std::fabs(ref) > 0 ? ref : 1e-45), -126) - 23);
  return std::fabs(got - ref) / unit;
}

double gelu_ref(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }

}  // namespace

TEST_CASE("vec_math targets: every ISA of this CPU is offered, best first", "[vecmath][vecmath-targets]") {
  const auto targets = tpu::ops::cpu::vec_math_targets();
  const tpu::CpuFeatures& f = tpu::cpu_features();
  std::set<std::string> names;
  for (const VecMathTable* t : targets) names.insert(t->name);
  CHECK(names.size() == targets.size());
  if (std::getenv("TPU_CPU_FEATURES") && std::string(std::getenv("TPU_CPU_FEATURES")) == "generic") {
    CHECK(targets.empty());
    return;
  }
  REQUIRE(!targets.empty());
  CHECK(std::string(targets.back()->name) == "baseline");
  if (f.avx512f && f.avx512bw && f.avx512vl) {
    CHECK(std::string(targets.front()->name) == "avx512");
    CHECK(tpu::ops::cpu::vec_math_avx512() == targets.front());
  }
  if (f.avx2 && f.fma) {
    CHECK(names.count("avx2") == 1);
    CHECK(names.count("sse4") == 1);  // every AVX2 CPU has SSE4.2
    REQUIRE(tpu::ops::cpu::vec_math_avx2() != nullptr);
    CHECK(std::string(tpu::ops::cpu::vec_math_avx2()->name) == "avx2");
  }
  // Every Highway table brings its own fused executor.
  for (const VecMathTable* t : targets) CHECK(t->program != nullptr);
}

TEST_CASE("vec_math targets: TPU_CPU_ISA names cap the choice, others are an error", "[vecmath][vecmath-targets]") {
  using tpu::ops::cpu::vec_math_capped;
  CHECK(&vec_math_capped("scalar") == &tpu::ops::cpu::vec_math_scalar());
  const auto targets = tpu::ops::cpu::vec_math_targets();
  for (const VecMathTable* t : targets) CHECK(&vec_math_capped(t->name) == t);  // a target the CPU has
  if (!targets.empty()) CHECK(&vec_math_capped("avx512") == targets.front());
  for (const char* bad : {"avx3", "", "AVX2", "neon"}) {
    INFO("TPU_CPU_ISA=" << bad);
    CHECK_THROWS_AS(vec_math_capped(bad), tpu::Error);
    CHECK_THROWS_WITH(vec_math_capped(bad), Catch::Contains("TPU_CPU_ISA") && Catch::Contains("avx2"));
  }
}

TEST_CASE("vec_math targets: a sweep over float bit patterns within the ulp bounds", "[vecmath][vecmath-targets]") {
  // Every 32771st bit pattern of either sign (131k values, denormals to infinities), against
  // the double reference; bounds as in test_elementwise_vecmath.cpp (gelu: plus the condition
  // number of its negative tail, x^2 with the rounded 1/sqrt 2).
  struct Fn {
    VecUnary op;
    double (*ref)(double);
    double lo, hi, bound;
    bool cond;
  };
  const Fn fns[] = {
      {VecUnary::exp, [](double x) { return std::exp(x); }, -1e30, 1e30, 2.0, false},
      {VecUnary::log, [](double x) { return x < 0 ? NAN : std::log(x); }, -1e30, 1e30, 2.0, false},
      {VecUnary::tanh, [](double x) { return std::tanh(x); }, -1e30, 1e30, 3.0, false},
      {VecUnary::sigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, -1e30, 1e30, 3.0, false},
      {VecUnary::erf, [](double x) { return std::erf(x); }, -1e30, 1e30, 3.0, false},
      {VecUnary::gelu_erf, gelu_ref, -13.0, 1e30, 8.0, true},  // below -13.2 the result is denormal
  };
  std::vector<float> x;
  for (uint64_t bits = 0; bits < 0x80000000u; bits += 32771u) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t b = static_cast<uint32_t>(bits) | sign;
      float v;
      std::memcpy(&v, &b, 4);
      if (!std::isnan(v)) x.push_back(v);
    }
  }
  std::vector<const VecMathTable*> tables = tpu::ops::cpu::vec_math_targets();
  tables.push_back(&tpu::ops::cpu::vec_math_scalar());
  for (const VecMathTable* t : tables) {
    for (const Fn& fn : fns) {
      std::vector<float> y(x.size());
      t->get(fn.op)(y.data(), x.data(), static_cast<int64_t>(x.size()));
      double worst = 0;
      float worst_x = 0;
      int64_t bad = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        if (x[i] < fn.lo || x[i] > fn.hi) continue;
        const double e = ulps(y[i], fn.ref(x[i]));
        const double bound = fn.bound + (fn.cond && x[i] < 0 ? 1.5 * double(x[i]) * x[i] : 0.0);
        if (e > bound) ++bad;
        if (e > worst) {
          worst = e;
          worst_x = x[i];
        }
      }
      INFO(t->name << " op " << static_cast<int>(fn.op) << ": worst " << worst << " ulp at x = " << worst_x);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("vec_math targets: fused gelu(x * w + b) in one pass against the double reference",
          "[vecmath][vecmath-targets]") {
  // The program folds the multiply and add into gelu's pass; each is rounded to f32 as the
  // eager steps are, so the reference is gelu of float(float(x * w) + b) in double.
  const int64_t n = 5000;
  std::vector<float> x(n), w(n), b(n), out(n + 8, -7.0f);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 6.0);
    w[i] = static_cast<float>(0.5 + (i % 17) * 0.11);
    b[i] = static_cast<float>((i % 29) * 0.2 - 2.8);
  }
  VecStep mul, add, gelu;
  mul.kind = add.kind = VecStepKind::binary;
  mul.bin = VecBinary::mul;
  mul.in0 = 0, mul.in1 = 1, mul.out = 3;
  add.bin = VecBinary::add;
  add.in0 = 3, add.in1 = 2, add.out = 4;
  gelu.kind = VecStepKind::unary;
  gelu.un = VecUnary::gelu_erf;
  gelu.in0 = 4, gelu.out = 5;
  const VecStep steps[] = {mul, add, gelu};
  for (const VecMathTable* t : tpu::ops::cpu::vec_math_targets()) {
    INFO(t->name);
    VecOperand ops[6];
    ops[0].in = x.data();
    ops[1].in = w.data();
    ops[2].in = b.data();
    ops[5].out = out.data();
    tpu::ops::cpu::run_vec_program(*t, steps, 3, ops, 6, n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float z = static_cast<float>(static_cast<float>(x[i] * w[i]) + b[i]);
      const double bound = 8.0 + (z < 0 ? 1.5 * double(z) * z : 0.0);
      if (ulps(out[i], gelu_ref(z)) > bound) ++bad;
    }
    CHECK(bad == 0);
    CHECK(out[n] == -7.0f);  // nothing past the end
  }
}

TEST_CASE("vec_math targets: TPU_CPU_ISA reaches the eager ops", "[.isa-env]") {
  // Run by CTest with TPU_CPU_ISA set: vec_math() is the capped table, and eager gelu gives that
  // table's results bit for bit.
  const char* isa = std::getenv("TPU_CPU_ISA");
  REQUIRE(isa != nullptr);
  const VecMathTable& want = tpu::ops::cpu::vec_math_capped(isa);
  CHECK(&tpu::ops::cpu::vec_math() == &want);
  tpu::Tensor x = tpu::randn({1000});
  tpu::Tensor y = tpu::gelu(x);
  std::vector<float> ref(1000);
  want.get(VecUnary::gelu_erf)(ref.data(), x.data<float>(), 1000);
  const float* got = y.data<float>();
  for (int i = 0; i < 1000; ++i) REQUIRE(std::memcmp(&got[i], &ref[i], 4) == 0);
}
