// Helpers for the elementwise op tests: sample sets for unary and binary ops, and the
// reference's model of storing a double into a dtype (integer wrap-around, f32 overflow).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "opinfo.h"

namespace tpu::testing::elementwise {

// The value a double becomes when stored as dt: integers wrap modulo 2^bits (two's
// complement), bool is x != 0, f32/bf16 overflow to inf (rounding is left to the tolerance),
// f16 overflows past 65504.
inline double store_as(DType dt, double v) {
  auto wrap = [](double x, double mod, double lo) {
    double m = std::fmod(x - lo, mod);
    if (m < 0) m += mod;
    return m + lo;
  };
  switch (dt) {
    case DType::u8: return wrap(v, 256.0, 0.0);
    case DType::i8: return wrap(v, 256.0, -128.0);
    case DType::i32: return wrap(v, 4294967296.0, -2147483648.0);
    case DType::i64: return v;  // test values stay far inside 2^53
    case DType::boolean: return v != 0 ? 1.0 : 0.0;
    case DType::f32:
    case DType::bf16: return std::isnan(v) ? v : static_cast<double>(static_cast<float>(v));
    case DType::f16:
      if (std::fabs(v) >= 65520.0) return v > 0 ? INFINITY : -INFINITY;
      return v;
    case DType::f8e4m3: case DType::f8e5m2: return v;  // no elementwise op computes in float8
  }
  return v;
}

// Tolerance of an op whose integer inputs compute in f32.
inline Tol float_result_tol(DType d) { return is_floating(d) ? default_tol(d) : default_tol(DType::f32); }

// Like make_input, but with integer values in [lo, hi) for every dtype (so that comparisons
// meet equal values and logical ops meet zeros).
inline Tensor make_int_valued(Generator& g, const Shape& shape, DType dt, Layout layout, int lo, int hi) {
  Tensor t = make_input(g, shape, DType::i32, layout, lo, hi);
  // Re-create the same layout in dt: build contiguous values in dt, then view them the same way.
  std::vector<float> vals = t.contiguous().to_vector<float>();
  Tensor flat = from_vector(vals, shape).to(dt);
  if (layout == Layout::transposed && shape.ndim() >= 2) {
    const int n = shape.ndim();
    return flat.transpose(n - 1, n - 2).contiguous().transpose(n - 1, n - 2);
  }
  if (layout == Layout::expanded && shape.ndim() >= 1 && shape[0] > 1) return flat.narrow(0, 0, 1).expand(shape);
  return flat;
}

struct Range {
  double lo = -2.0, hi = 2.0;
};

inline Range int_range(DType dt, Range r) {
  if (dt == DType::u8) return {0, std::max(2.0, r.hi * 3)};
  if (is_integral(dt)) return {std::floor(r.lo * 3), std::ceil(r.hi * 3)};
  return r;
}

// Marker appended to a sample: run the Tensor-scalar overload with the 0-d second input.
inline Tensor scalar_marker() { return full(Shape{}, true, DType::boolean); }
inline bool has_scalar_marker(const std::vector<Tensor>& ins) { return ins.size() == 3; }

inline std::vector<OpSample> binary_samples(DType dt, Generator& g, Range ra, Range rb, bool int_valued = false) {
  auto mk = [&](const Shape& s, Layout l, Range r) {
    if (int_valued) return make_int_valued(g, s, dt, l, static_cast<int>(r.lo), static_cast<int>(r.hi));
    Range q = int_range(dt, r);
    return make_input(g, s, dt, l, q.lo, q.hi);
  };
  using L = Layout;
  std::vector<OpSample> v;
  v.push_back({"same [3,4]", {mk({3, 4}, L::contiguous, ra), mk({3, 4}, L::contiguous, rb)}});
  v.push_back({"broadcast [3,1] x [4]", {mk({3, 1}, L::contiguous, ra), mk({4}, L::contiguous, rb)}});
  v.push_back({"broadcast [5,1] x [1,6]", {mk({5, 1}, L::contiguous, ra), mk({1, 6}, L::contiguous, rb)}});
  v.push_back({"transposed [4,5] x contiguous", {mk({4, 5}, L::transposed, ra), mk({4, 5}, L::contiguous, rb)}});
  v.push_back({"sliced [2,3,5] x expanded [3,5]", {mk({2, 3, 5}, L::sliced, ra), mk({3, 5}, L::expanded, rb)}});
  v.push_back({"row broadcast [3,40] x [40]", {mk({3, 40}, L::contiguous, ra), mk({40}, L::contiguous, rb)}});
  v.push_back({"column broadcast [1] x [70]", {mk({1}, L::contiguous, ra), mk({70}, L::contiguous, rb)}});
  v.push_back({"long [1037] (vector body + tail)", {mk({1037}, L::contiguous, ra), mk({1037}, L::contiguous, rb)}});
  v.push_back({"0-d x [3]", {mk({}, L::contiguous, ra), mk({3}, L::contiguous, rb)}});
  v.push_back({"[2,3] x 0-d", {mk({2, 3}, L::contiguous, ra), mk({}, L::contiguous, rb)}});
  v.push_back({"0-d x 0-d", {mk({}, L::contiguous, ra), mk({}, L::contiguous, rb)}});
  v.push_back({"zero-size [0,3] x [3]", {mk({0, 3}, L::contiguous, ra), mk({3}, L::contiguous, rb)}});
  v.push_back({"scalar operand [3,4] x scalar", {mk({3, 4}, L::transposed, ra), mk({}, L::contiguous, rb), scalar_marker()}});
  return v;
}

inline std::vector<OpSample> unary_samples(DType dt, Generator& g, Range r, bool specials) {
  using L = Layout;
  const Range q = int_range(dt, r);
  std::vector<OpSample> v;
  v.push_back({"contiguous [5,7]", {make_input(g, {5, 7}, dt, L::contiguous, q.lo, q.hi)}});
  v.push_back({"transposed [4,6]", {make_input(g, {4, 6}, dt, L::transposed, q.lo, q.hi)}});
  v.push_back({"sliced [3,5]", {make_input(g, {3, 5}, dt, L::sliced, q.lo, q.hi)}});
  v.push_back({"expanded [4,3]", {make_input(g, {4, 3}, dt, L::expanded, q.lo, q.hi)}});
  v.push_back({"long [2,531] (vector body + tail)", {make_input(g, {2, 531}, dt, L::contiguous, q.lo, q.hi)}});
  v.push_back({"0-d", {make_input(g, {}, dt, L::contiguous, q.lo, q.hi)}});
  v.push_back({"zero-size [0,4]", {make_input(g, {0, 4}, dt, L::contiguous, q.lo, q.hi)}});
  if (specials && is_floating(dt)) {
    std::vector<float> s = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-30f, -1e-30f, 30.0f, -30.0f, 90.0f, -90.0f,
                            0.5f, -0.5f, 1.5f, 2.5f, -2.5f, 3.5f, 1e-6f, -1e-6f, 7.0f, -7.0f};
    v.push_back({"special values", {from_vector(s).to(dt)}});
  }
  return v;
}

}  // namespace tpu::testing::elementwise
