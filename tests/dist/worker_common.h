// Shared helpers of the tpu::dist test worker: deterministic per-rank data, a naive reference
// and value checks. Each rank computes the expected result itself from every rank's inputs
// (which it can regenerate), so the check never uses the collective's own output.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tpucore/dist.h"
#include "tpucore/ops.h"

namespace dist_test {

// Runs f and checks it throws a tpu::Error containing must_contain (printed either way):
// 0 when it does, 2 for another message, 3 when nothing was thrown.
inline int expect_error(const std::function<void()>& f, const char* must_contain) {
  try {
    f();
  } catch (const tpu::Error& e) {
    std::printf("ERROR: %s\n", e.what());
    std::fflush(stdout);
    return std::strstr(e.what(), must_contain) ? 0 : 2;
  }
  std::printf("no error\n");
  return 3;
}

using tpu::DType;
using tpu::Shape;
using tpu::Tensor;

inline int g_failures = 0;
inline int g_checks = 0;

inline void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    if (g_failures < 20) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

// The value an element of the given dtype holds after converting v (integers wrap).
inline double as_dtype(double v, DType d) {
  switch (d) {
    case DType::f32: return static_cast<float>(v);
    case DType::bf16: return static_cast<float>(tpu::bf16(static_cast<float>(v)));
    case DType::f16: return static_cast<float>(tpu::f16(static_cast<float>(v)));
    case DType::i32: return static_cast<int32_t>(static_cast<int64_t>(v));
    case DType::i64: return static_cast<double>(static_cast<int64_t>(v));
    case DType::i8: return static_cast<int8_t>(static_cast<int64_t>(v));
    case DType::u8: return static_cast<uint8_t>(static_cast<int64_t>(v));
    case DType::boolean: return v != 0 ? 1 : 0;
    case DType::f8e4m3: case DType::f8e5m2: break;  // collectives refuse float8
  }
  return v;
}

// Small values every dtype holds exactly; `salt` varies them per test.
inline double value(int rank, int64_t i, int salt, DType d) {
  int64_t v = (rank * 7 + i * 3 + salt) % 11;
  if (d == DType::boolean) return (v % 3) == 0 ? 1 : 0;
  if (d == DType::u8) return static_cast<double>(v);
  return static_cast<double>(v - 5);
}
// Values whose products stay exact in bf16 (|product of 4| <= 16).
inline double pvalue(int rank, int64_t i, int salt, DType d) {
  static const double vals[4] = {1, -1, 2, -2};
  if (d == DType::boolean) return ((rank + i + salt) % 4) != 0 ? 1 : 0;
  double v = vals[(rank + i + salt) % 4];
  return d == DType::u8 ? std::fabs(v) : v;
}

// A tensor of `shape` whose row-major element k is f(k); non-contiguous (a transposed view)
// when asked and the shape is 2-D.
inline Tensor make(DType d, const Shape& shape, const std::function<double(int64_t)>& f, bool noncontig,
                   tpu::Device dev = tpu::Device()) {
  int64_t n = shape.numel();
  if (noncontig && shape.ndim() == 2) {
    int64_t a = shape[0], b = shape[1];
    std::vector<float> base(static_cast<size_t>(n));
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j) base[static_cast<size_t>(j * a + i)] = static_cast<float>(f(i * b + j));
    Tensor t = tpu::from_vector(base, Shape{b, a}).to(d).to(dev);
    return t.t();
  }
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) v[static_cast<size_t>(k)] = static_cast<float>(f(k));
  return tpu::from_vector(v, shape).to(d).to(dev);
}

inline std::vector<float> values(const Tensor& t) {
  return t.to(tpu::Device()).to(DType::f32).contiguous().to_vector<float>();
}

inline void expect(const Tensor& t, const std::function<double(int64_t)>& want, const std::string& what) {
  std::vector<float> got = values(t);
  check(static_cast<int64_t>(got.size()) == t.numel(), what + ": size");
  int bad = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    double w = as_dtype(want(static_cast<int64_t>(k)), t.dtype());
    if (std::fabs(got[k] - w) > 1e-6 * std::max(1.0, std::fabs(w))) {
      if (bad++ == 0) check(false, what + ": element " + std::to_string(k) + " is " + std::to_string(got[k]) +
                                       ", want " + std::to_string(w));
    }
  }
  if (bad == 0) check(true, what);
}

}  // namespace dist_test
