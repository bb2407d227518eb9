// Helpers for the JIT tests: random inputs and an eager-vs-compiled closeness check.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "tpucore/compile.h"
#include "tpucore/ops.h"

namespace tpu::jit_testing {

inline Tensor rnd(const Shape& s, uint64_t seed, DType dt = DType::f32) {
  Generator g(seed);
  return tpu::randn(s, TensorOptions(dt), &g);
}

// Element-wise |a - b| <= atol + rtol * |b|, with the first mismatch in the message.
inline void expect_close(const Tensor& got, const Tensor& want, double rtol = 1e-5, double atol = 1e-5,
                         const std::string& what = "") {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  std::vector<float> a = got.to_vector<float>(), b = want.to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= atol + rtol * std::fabs(static_cast<double>(b[i])))) {
      FAIL_CHECK("element " << i << ": got " << a[i] << ", eager " << b[i]);
      return;
    }
  }
  SUCCEED();
}

inline const jit::FunctionStats& stats_of(const std::string& name) {
  static jit::Stats s;
  s = jit::stats();
  const jit::FunctionStats* f = s.find(name);
  REQUIRE(f != nullptr);
  return *f;
}

}  // namespace tpu::jit_testing
