// Vector unit and transcendental path, functional model: every op reads f32 or bf16 (or an
// f32 immediate), computes in f32 and stores f32 or bf16 (rounded to nearest even).
// vcast converts between all dtypes (integers saturate, f32->int rounds to nearest even).
// vand / vor / vxor / vshl / vshrl / vshra work on i32 words.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "sim/kernels.h"

namespace tpu::sim::detail {
namespace {

void load_row(const MatRef& m, int64_t r, int64_t cols, float* out) {
  if (m.is_imm) {
    std::fill(out, out + cols, m.imm);
    return;
  }
  const int64_t es = dtype_size(m.dtype);
  const uint8_t* row = m.base + r * m.rs * es;
  if (m.dtype == DType::f32 && m.cs == 1) {
    std::memcpy(out, row, size_t(cols) * 4);
  } else if (m.dtype == DType::f32) {
    for (int64_t c = 0; c < cols; ++c) std::memcpy(out + c, row + c * m.cs * 4, 4);
  } else {
    for (int64_t c = 0; c < cols; ++c) {
      uint16_t b;
      std::memcpy(&b, row + c * m.cs * 2, 2);
      out[c] = bf16_bits_to_f32(b);
    }
  }
}

void store_row(const MatRef& m, int64_t r, int64_t cols, const float* in) {
  const int64_t es = dtype_size(m.dtype);
  uint8_t* row = m.base + r * m.rs * es;
  if (m.dtype == DType::f32 && m.cs == 1) {
    std::memcpy(row, in, size_t(cols) * 4);
  } else if (m.dtype == DType::f32) {
    for (int64_t c = 0; c < cols; ++c) std::memcpy(row + c * m.cs * 4, in + c, 4);
  } else {
    for (int64_t c = 0; c < cols; ++c) {
      uint16_t b = f32_to_bf16_bits(in[c]);
      std::memcpy(row + c * m.cs * 2, &b, 2);
    }
  }
}

template <class F>
void map1(float* d, const float* a, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) d[i] = f(a[i]);
}
template <class F>
void map2(float* d, const float* a, const float* b, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) d[i] = f(a[i], b[i]);
}

void apply(Op op, float* d, const float* a, const float* b, const float* c, int64_t n) {
  switch (op) {
    case Op::vadd: map2(d, a, b, n, [](float x, float y) { return x + y; }); break;
    case Op::vsub: map2(d, a, b, n, [](float x, float y) { return x - y; }); break;
    case Op::vmul: map2(d, a, b, n, [](float x, float y) { return x * y; }); break;
    case Op::vdiv: map2(d, a, b, n, [](float x, float y) { return x / y; }); break;
    case Op::vmax: map2(d, a, b, n, [](float x, float y) { return (x != x || y != y) ? NAN : std::max(x, y); }); break;
    case Op::vmin: map2(d, a, b, n, [](float x, float y) { return (x != x || y != y) ? NAN : std::min(x, y); }); break;
    case Op::vcmplt: map2(d, a, b, n, [](float x, float y) { return x < y ? 1.f : 0.f; }); break;
    case Op::vcmple: map2(d, a, b, n, [](float x, float y) { return x <= y ? 1.f : 0.f; }); break;
    case Op::vcmpeq: map2(d, a, b, n, [](float x, float y) { return x == y ? 1.f : 0.f; }); break;
    case Op::vfma:
      for (int64_t i = 0; i < n; ++i) d[i] = std::fma(a[i], b[i], c[i]);
      break;
    case Op::vsel:
      for (int64_t i = 0; i < n; ++i) d[i] = a[i] != 0.f ? b[i] : c[i];
      break;
    case Op::vmov: std::copy(a, a + n, d); break;
    case Op::vneg: map1(d, a, n, [](float x) { return -x; }); break;
    case Op::vabs: map1(d, a, n, [](float x) { return std::fabs(x); }); break;
    case Op::vexp: map1(d, a, n, [](float x) { return std::exp(x); }); break;
    case Op::vlog: map1(d, a, n, [](float x) { return std::log(x); }); break;
    case Op::vtanh: map1(d, a, n, [](float x) { return std::tanh(x); }); break;
    case Op::vrsqrt: map1(d, a, n, [](float x) { return 1.f / std::sqrt(x); }); break;
    case Op::vrecip: map1(d, a, n, [](float x) { return 1.f / x; }); break;
    case Op::verf: map1(d, a, n, [](float x) { return std::erf(x); }); break;
    case Op::vsqrt: map1(d, a, n, [](float x) { return std::sqrt(x); }); break;
    default: break;
  }
}

double load_any(const MatRef& m, int64_t r, int64_t c) {
  if (m.is_imm) return m.imm;
  const uint8_t* p = m.base + (r * m.rs + c * m.cs) * dtype_size(m.dtype);
  switch (m.dtype) {
    case DType::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::bf16: { uint16_t b; std::memcpy(&b, p, 2); return bf16_bits_to_f32(b); }
    case DType::i32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::i8: return int8_t(*p);
    case DType::f8e4m3: return e4m3_bits_to_f32(*p);
  }
  return 0;
}

template <class I>
I saturate(double v) {
  if (std::isnan(v)) return 0;
  double r = std::nearbyint(v);  // default rounding mode: to nearest even
  if (r <= double(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (r >= double(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return I(r);
}

void store_any(const MatRef& m, int64_t r, int64_t c, double v) {
  uint8_t* p = m.base + (r * m.rs + c * m.cs) * dtype_size(m.dtype);
  switch (m.dtype) {
    case DType::f32: { float f = float(v); std::memcpy(p, &f, 4); break; }
    case DType::bf16: { uint16_t b = f32_to_bf16_bits(float(v)); std::memcpy(p, &b, 2); break; }
    case DType::i32: { int32_t x = saturate<int32_t>(v); std::memcpy(p, &x, 4); break; }
    case DType::i8: { int8_t x = saturate<int8_t>(v); std::memcpy(p, &x, 1); break; }
    case DType::f8e4m3: *p = f32_to_e4m3_bits(float(v)); break;
  }
}

// 32-bit integer ops: operands are i32 words (immediates: integers, checked by the verifier).
int32_t load_i32(const MatRef& m, int64_t r, int64_t c) {
  if (m.is_imm) return int32_t(m.imm);
  int32_t v;
  std::memcpy(&v, m.base + (r * m.rs + c * m.cs) * 4, 4);
  return v;
}

int32_t apply_int(Op op, int32_t x, int32_t y) {
  const uint32_t ux = uint32_t(x), n = uint32_t(y) & 31u;  // shift counts: the low 5 bits
  switch (op) {
    case Op::vand: return x & y;
    case Op::vor: return x | y;
    case Op::vxor: return x ^ y;
    case Op::vshl: return int32_t(ux << n);
    case Op::vshrl: return int32_t(ux >> n);
    case Op::vshra: return x >> n;  // arithmetic for negative x (C++20)
    default: return 0;
  }
}

}  // namespace

void vector_exec(Op op, const MatRef& dst, const MatRef& a, const MatRef& b, const MatRef& c, int64_t rows,
                 int64_t cols, float fill_value) {
  if (op == Op::vcast) {
    std::vector<double> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) row[size_t(j)] = load_any(a, r, j);
      for (int64_t j = 0; j < cols; ++j) store_any(dst, r, j, row[size_t(j)]);
    }
    return;
  }
  if (is_int_vector_op(op)) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        const int32_t v = apply_int(op, load_i32(a, r, j), load_i32(b, r, j));
        std::memcpy(dst.base + (r * dst.rs + j * dst.cs) * 4, &v, 4);
      }
    return;
  }
  std::vector<float> buf(size_t(cols) * 4);
  float* fa = buf.data();
  float* fb = fa + cols;
  float* fc = fb + cols;
  float* fd = fc + cols;
  const Format f = op_info(op).format;
  for (int64_t r = 0; r < rows; ++r) {
    if (op == Op::vfill) {
      std::fill(fd, fd + cols, fill_value);
    } else {
      load_row(a, r, cols, fa);
      if (f == Format::vbinary || f == Format::vternary) load_row(b, r, cols, fb);
      if (f == Format::vternary) load_row(c, r, cols, fc);
      apply(op, fd, fa, fb, fc, cols);
    }
    store_row(dst, r, cols, fd);
  }
}

void xlu_exec(Op op, const MatRef& dst, const MatRef& a, int64_t rows, int64_t cols, int axis) {
  if (op == Op::xtrans) {
    const bool same = dst.dtype == a.dtype;
    const int64_t es = dtype_size(a.dtype);
    std::vector<uint8_t> tmp;  // a copy, so that dst may alias a
    std::vector<double> vals;
    if (same) {
      tmp.resize(size_t(rows * cols * es));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          std::memcpy(&tmp[size_t((r * cols + c) * es)], a.base + (r * a.rs + c * a.cs) * es, size_t(es));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          std::memcpy(dst.base + (c * dst.rs + r * dst.cs) * es, &tmp[size_t((r * cols + c) * es)], size_t(es));
    } else {
      vals.resize(size_t(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) vals[size_t(r * cols + c)] = load_any(a, r, c);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) store_any(dst, c, r, vals[size_t(r * cols + c)]);
    }
    return;
  }
  const bool is_max = op == Op::xmax;
  std::vector<float> row(static_cast<size_t>(cols));
  if (axis == 1) {
    std::vector<float> res(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      load_row(a, r, cols, row.data());
      float accv = is_max ? -INFINITY : 0.f;
      for (int64_t c = 0; c < cols; ++c) accv = is_max ? ((row[size_t(c)] != row[size_t(c)] || accv != accv) ? NAN : std::max(accv, row[size_t(c)])) : accv + row[size_t(c)];
      res[size_t(r)] = accv;
    }
    for (int64_t r = 0; r < rows; ++r) store_row(dst, r, 1, &res[size_t(r)]);
  } else {
    std::vector<float> accv(size_t(cols), is_max ? -INFINITY : 0.f);
    for (int64_t r = 0; r < rows; ++r) {
      load_row(a, r, cols, row.data());
      for (int64_t c = 0; c < cols; ++c) {
        float x = row[size_t(c)];
        float& y = accv[size_t(c)];
        y = is_max ? ((x != x || y != y) ? NAN : std::max(x, y)) : y + x;
      }
    }
    store_row(dst, 0, cols, accv.data());
  }
}

}  // namespace tpu::sim::detail
