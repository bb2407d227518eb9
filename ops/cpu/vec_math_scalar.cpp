// The portable implementation of vec_math.h: std:: functions in plain loops (the compiler
// vectorizes the simple ones for the baseline ISA): the reference path, and the one taken under
// TPU_CPU_FEATURES=generic.
#include <cmath>

#include "ops/cpu/vec_math.h"

namespace tpu::ops::cpu {
namespace {

inline float sigmoid1(float x) {
  // Evaluated through exp(-|x|) so that neither side overflows; exact limits 0 and 1.
  const float t = std::exp(-std::fabs(x));
  const float s = 1.0f / (1.0f + t);
  return x >= 0.0f ? s : t * s;
}

template <class F>
inline void map1(float* __restrict__ o, const float* __restrict__ x, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
}
// Same as map1 but allowed to run in place (o == x).
template <class F>
inline void map1_alias(float* o, const float* x, int64_t n, F f) {
  if (o == x) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(o[i]);
  } else {
    map1(o, x, n, f);
  }
}

void exp_s(float* o, const float* x, int64_t n) { map1_alias(o, x, n, [](float v) { return std::exp(v); }); }
void log_s(float* o, const float* x, int64_t n) { map1_alias(o, x, n, [](float v) { return std::log(v); }); }
void tanh_s(float* o, const float* x, int64_t n) { map1_alias(o, x, n, [](float v) { return std::tanh(v); }); }
void sigmoid_s(float* o, const float* x, int64_t n) { map1_alias(o, x, n, sigmoid1); }
void silu_s(float* o, const float* x, int64_t n) { map1_alias(o, x, n, [](float v) { return v * sigmoid1(v); }); }
void gelu_erf_s(float* o, const float* x, int64_t n) {
  // 0.5 x (1 + erf(x / sqrt 2)) written with erfc so that the negative tail keeps its digits.
  map1_alias(o, x, n, [](float v) { return 0.5f * v * std::erfc(-v * 0.70710678118654752f); });
}
void gelu_tanh_s(float* o, const float* x, int64_t n) {
  // 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
  map1_alias(o, x, n, [](float v) {
    const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    return v * sigmoid1(2.0f * u);
  });
}
void erf_s(float* o, const float* x, int64_t n) { map1_alias(o, x, n, [](float v) { return std::erf(v); }); }
void relu_s(float* o, const float* x, int64_t n) {
  // NaN stays NaN (as PyTorch): the comparison is false for NaN, so v is kept.
  map1_alias(o, x, n, [](float v) { return v < 0.0f ? 0.0f : v; });
}

template <class F>
inline void map2(float* o, const float* x, const float* y, bool y_scalar, int64_t n, F f) {
  if (y_scalar) {
    const float b = y[0];
    for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], b);
  } else if (o != x && o != y) {
    float* __restrict__ ro = o;
    const float* __restrict__ rx = x;
    const float* __restrict__ ry = y;
    for (int64_t i = 0; i < n; ++i) ro[i] = f(rx[i], ry[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
  }
}

void add_s(float* o, const float* x, const float* y, bool ys, float alpha, int64_t n) {
  if (alpha == 1.0f) map2(o, x, y, ys, n, [](float a, float b) { return a + b; });
  else map2(o, x, y, ys, n, [alpha](float a, float b) { return a + alpha * b; });
}
void sub_s(float* o, const float* x, const float* y, bool ys, float alpha, int64_t n) {
  if (alpha == 1.0f) map2(o, x, y, ys, n, [](float a, float b) { return a - b; });
  else map2(o, x, y, ys, n, [alpha](float a, float b) { return a - alpha * b; });
}
void mul_s(float* o, const float* x, const float* y, bool ys, float, int64_t n) {
  map2(o, x, y, ys, n, [](float a, float b) { return a * b; });
}
void div_s(float* o, const float* x, const float* y, bool ys, float, int64_t n) {
  map2(o, x, y, ys, n, [](float a, float b) { return a / b; });
}
// maximum/minimum propagate NaN from either side, as PyTorch does.
void max_s(float* o, const float* x, const float* y, bool ys, float, int64_t n) {
  map2(o, x, y, ys, n, [](float a, float b) { return (a != a || b != b) ? a + b : (a > b ? a : b); });
}
void min_s(float* o, const float* x, const float* y, bool ys, float, int64_t n) {
  map2(o, x, y, ys, n, [](float a, float b) { return (a != a || b != b) ? a + b : (a < b ? a : b); });
}

const VecMathTable kScalarTable = {
    "scalar",
    {exp_s, log_s, tanh_s, sigmoid_s, silu_s, gelu_erf_s, gelu_tanh_s, erf_s, relu_s},
    {add_s, sub_s, mul_s, div_s, max_s, min_s},
};

}  // namespace

const VecMathTable& vec_math_scalar() { return kScalarTable; }

}  // namespace tpu::ops::cpu
