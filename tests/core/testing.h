// Test helpers: an independent host reference (values read straight from storage through
// strides, converted by this file's own bf16/f16 decoders, kept in double), input makers for
// non-contiguous layouts, and closeness checks with per-dtype tolerances.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <source_location>
#include <string>
#include <vector>

#include "tpucore/ops.h"

namespace tpu::testing {

// Decoders written independently of tpucore/half.h.
inline double decode_bf16(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline double decode_f16(uint16_t h) {
  int s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0) v = std::ldexp(static_cast<double>(m), -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -v : v;
}
// The 8-bit floats by their closed form: E4M3 (bias 7, no infinities, S.1111.111 is NaN) and
// E5M2 (bias 15, IEEE-like specials).
inline double decode_f8e4m3(uint8_t b) {
  int s = (b >> 7) & 1, e = (b >> 3) & 15, m = b & 7;
  double v;
  if (e == 15 && m == 7) v = NAN;
  else if (e == 0) v = std::ldexp(static_cast<double>(m), -9);  // 2^(1-7) * m/8
  else v = std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}
inline double decode_f8e5m2(uint8_t b) {
  int s = (b >> 7) & 1, e = (b >> 2) & 31, m = b & 3;
  double v;
  if (e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = std::ldexp(static_cast<double>(m), -16);  // 2^(1-15) * m/4
  else v = std::ldexp(1.0 + m / 4.0, e - 15);
  return s ? -v : v;
}

// A dense row-major host array of doubles.
struct Ref {
  Shape shape;
  std::vector<double> v;
  Ref() = default;
  explicit Ref(const Shape& s, double fill = 0.0) : shape(s), v(static_cast<size_t>(s.numel()), fill) {}
  int64_t numel() const { return shape.numel(); }
  // Flat row-major offset of a multi-index.
  int64_t flat(const std::vector<int64_t>& idx) const {
    int64_t f = 0;
    for (int i = 0; i < shape.ndim(); ++i) f = f * shape[i] + idx[static_cast<size_t>(i)];
    return f;
  }
  double& at(const std::vector<int64_t>& idx) { return v[static_cast<size_t>(flat(idx))]; }
  double at(const std::vector<int64_t>& idx) const { return v[static_cast<size_t>(flat(idx))]; }
  // Value at the multi-index of out_shape, with numpy broadcasting of this array.
  double bcast(const Shape& out_shape, const std::vector<int64_t>& out_idx) const {
    int64_t f = 0;
    const int off = out_shape.ndim() - shape.ndim();
    for (int i = 0; i < shape.ndim(); ++i) {
      int64_t k = shape[i] == 1 ? 0 : out_idx[static_cast<size_t>(i + off)];
      f = f * shape[i] + k;
    }
    return v[static_cast<size_t>(f)];
  }
};

// Multi-index of a flat row-major position.
inline std::vector<int64_t> unflatten(const Shape& s, int64_t flat) {
  std::vector<int64_t> idx(static_cast<size_t>(s.ndim()));
  for (int i = s.ndim() - 1; i >= 0; --i) {
    idx[static_cast<size_t>(i)] = s[i] ? flat % s[i] : 0;
    if (s[i]) flat /= s[i];
  }
  return idx;
}

// Reads a tensor's logical elements into a Ref (moves it to the cpu first).
inline Ref ref_of(const Tensor& t_any) {
  Tensor t = t_any.to(Device());
  Ref r(t.shape());
  const char* base = static_cast<const char*>(t.storage()->data);
  const int64_t es = static_cast<int64_t>(t.element_size());
  for (int64_t i = 0; i < r.numel(); ++i) {
    auto idx = unflatten(t.shape(), i);
    int64_t off = t.offset();
    for (int d = 0; d < t.dim(); ++d) off += idx[static_cast<size_t>(d)] * t.strides()[d];
    const char* p = base + off * es;
    double v = 0;
    switch (t.dtype()) {
      case DType::f32: { float f; std::memcpy(&f, p, 4); v = f; break; }
      case DType::bf16: { uint16_t b; std::memcpy(&b, p, 2); v = decode_bf16(b); break; }
      case DType::f16: { uint16_t b; std::memcpy(&b, p, 2); v = decode_f16(b); break; }
      case DType::i32: { int32_t x; std::memcpy(&x, p, 4); v = x; break; }
      case DType::i64: { int64_t x; std::memcpy(&x, p, 8); v = static_cast<double>(x); break; }
      case DType::i8: v = *reinterpret_cast<const int8_t*>(p); break;
      case DType::u8: v = *reinterpret_cast<const uint8_t*>(p); break;
      case DType::boolean: v = *reinterpret_cast<const uint8_t*>(p) ? 1 : 0; break;
      case DType::f8e4m3: v = decode_f8e4m3(*reinterpret_cast<const uint8_t*>(p)); break;
      case DType::f8e5m2: v = decode_f8e5m2(*reinterpret_cast<const uint8_t*>(p)); break;
    }
    r.v[static_cast<size_t>(i)] = v;
  }
  return r;
}

// Elementwise reference: out[i] = f(inputs broadcast at i).
inline Ref ref_map(const std::vector<Ref>& ins, const std::function<double(const std::vector<double>&)>& f) {
  Shape out = ins[0].shape;
  for (size_t i = 1; i < ins.size(); ++i) out = broadcast_shapes(out, ins[i].shape, "ref_map");
  Ref r(out);
  std::vector<double> args(ins.size());
  for (int64_t i = 0; i < r.numel(); ++i) {
    auto idx = unflatten(out, i);
    for (size_t k = 0; k < ins.size(); ++k) args[k] = ins[k].bcast(out, idx);
    r.v[static_cast<size_t>(i)] = f(args);
  }
  return r;
}

struct Tol {
  double atol, rtol;
};
inline Tol default_tol(DType t) {
  switch (t) {
    case DType::f32: return {1e-5, 1e-5};
    case DType::bf16: return {1e-2, 1.6e-2};
    case DType::f16: return {1e-3, 2e-3};
    default: return {0, 0};
  }
}

// Checks got (any device/dtype/layout) against the expected values; NaNs must match NaNs.
inline void check_close(const Tensor& got, const Ref& expected, Tol tol, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == expected.shape);
  Ref g = ref_of(got);
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < g.numel(); ++i) {
    double a = g.v[static_cast<size_t>(i)], e = expected.v[static_cast<size_t>(i)];
    bool ok;
    if (std::isnan(e)) ok = std::isnan(a);
    else if (std::isinf(e)) ok = a == e;
    else ok = std::fabs(a - e) <= tol.atol + tol.rtol * std::fabs(e);
    if (!ok) {
      if (bad == 0) first = fmt::format("index {}: got {} expected {}", i, a, e);
      ++bad;
    }
  }
  INFO("mismatches: " << bad << " of " << g.numel() << "; first " << first);
  CHECK(bad == 0);
}

// A float tensor's values as doubles, and an element-wise check against values computed in
// the test (relative tolerance, absolute near zero).
inline std::vector<double> dvals(const Tensor& t) {
  auto f = t.to_vector<float>();
  return std::vector<double>(f.begin(), f.end());
}
inline void check_near(const Tensor& t, const std::vector<double>& want, double tol = 1e-5) {
  auto got = dvals(t);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << " want " << want[i]);
    CHECK(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])));
  }
}

// Layouts in which inputs are made, so kernels see non-contiguous views.
enum class Layout { contiguous, transposed, sliced, expanded };
inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::transposed: return "transposed";
    case Layout::sliced: return "sliced";
    case Layout::expanded: return "expanded";
  }
  return "?";
}

// Random values of dtype with the given logical shape and layout. Values lie in [lo, hi)
// (integers for integer dtypes, 0/1 for bool).
inline Tensor make_input(Generator& g, const Shape& shape, DType dt, Layout layout, double lo = -2.0, double hi = 2.0) {
  auto fill = [&](const Shape& s) {
    std::vector<float> v(static_cast<size_t>(s.numel()));
    for (auto& x : v) {
      double u = lo + (hi - lo) * g.next_double();
      if (dt == DType::boolean) u = g.next_double() < 0.5 ? 0 : 1;
      else if (is_integral(dt)) u = std::floor(u);
      x = static_cast<float>(u);
    }
    return from_vector(v, s).to(dt);
  };
  const int n = shape.ndim();
  if (layout == Layout::transposed && n >= 2) {
    Shape s = shape;
    std::swap(s[n - 1], s[n - 2]);
    return fill(s).transpose(n - 1, n - 2);
  }
  if (layout == Layout::sliced && n >= 1) {
    Shape s = shape;
    s[n - 1] = shape[n - 1] * 2 + 1;
    return fill(s).slice(n - 1, 1, s[n - 1], 2);
  }
  if (layout == Layout::expanded && n >= 1 && shape[0] > 1) {
    Shape s = shape;
    s[0] = 1;
    return fill(s).expand(shape);
  }
  return fill(shape);
}

// Contiguous random values in [-1, 1) of dtype.
inline Tensor uniform_input(Generator& g, const Shape& shape, DType dt = DType::f32) {
  return make_input(g, shape, dt, Layout::contiguous, -1.0, 1.0);
}

// Every dtype, and small 1-D i32 "parameter" tensors that carry op arguments as the last
// input of an OpInfo sample (so the runner moves them to the device under test too).
inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> v{DType::f32, DType::bf16, DType::f16,     DType::i32,
                                    DType::i8,  DType::u8,   DType::boolean, DType::i64};
  return v;
}

// A contiguous input of `s` and `dt` with values in [-2, 2).
inline Tensor rnd(Generator& g, const Shape& s, DType dt = DType::f32) { return make_input(g, s, dt, Layout::contiguous); }

// Standard normal samples of `s` from a fixed seed.
inline Tensor rn(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, {}, &g);
}

// A 1-D i32 tensor of op arguments; always the last input of a sample.
inline Tensor params(const std::vector<int64_t>& p) { return from_vector(p, Shape{static_cast<int64_t>(p.size())}); }
inline std::vector<int64_t> params_of(const Tensor& t) {
  std::vector<int64_t> r;
  for (int32_t v : t.to_vector<int32_t>()) r.push_back(v);
  return r;
}
inline std::vector<int64_t> params_of(const Ref& r) {
  std::vector<int64_t> v;
  for (double d : r.v) v.push_back(static_cast<int64_t>(d));
  return v;
}
// Runs fn, which must throw a tpu::Error whose message contains every part.
template <class F>
void expect_error(F&& fn, const std::vector<std::string>& parts,
                  std::source_location loc = std::source_location::current()) {
  INFO("expect_error at " << loc.file_name() << ":" << loc.line());
  std::string msg;
  bool threw = false;
  try {
    fn();
  } catch (const tpu::Error& e) {
    threw = true;
    msg = e.what();
  }
  INFO("message: " << msg);
  REQUIRE(threw);
  for (const auto& p : parts) {
    INFO("expected part: " << p);
    CHECK(msg.find(p) != std::string::npos);
  }
}

}  // namespace tpu::testing
