// Block operations of the kernel API, as the cpu interpreter computes them.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tpucore/core/error.h"
#include "tpucore/core/half.h"
#include "tpucore/kernel/internal.h"

namespace tpu::kernel {

using detail::data_of;
using detail::make_value;
using detail::shape_str;

Value::Value(std::vector<int64_t> shape, DType dtype, std::shared_ptr<Impl> impl)
    : shape_(std::move(shape)), dtype_(dtype), impl_(std::move(impl)) {}

int64_t Value::dim(int d) const {
  const int r = rank();
  TPU_CHECK(d >= -r && d < r, "kernel value: dim {} out of range for shape {}", d, detail::shape_str(shape_));
  return shape_[static_cast<size_t>(d < 0 ? d + r : d)];
}

int64_t Value::numel() const { return detail::numel_of(shape_); }

namespace detail {

double round_to(DType t, double x) {
  switch (t) {
    case DType::f32: return static_cast<double>(static_cast<float>(x));
    case DType::bf16: return static_cast<double>(bf16(static_cast<float>(x)).to_f32());
    case DType::i32: {
      if (std::isnan(x)) return 0;
      const double tr = std::trunc(x);
      if (tr >= 2147483647.0) return 2147483647.0;
      if (tr <= -2147483648.0) return -2147483648.0;
      return tr;
    }
    case DType::i8: return std::isnan(x) ? 0 : std::clamp(std::trunc(x), -128.0, 127.0);
    case DType::boolean: return x != 0 ? 1.0 : 0.0;
    default: fail("kernel: dtype {} is not a block dtype (f32, bf16, i32, i8, bool)", dtype_name(t));
  }
}

bool block_dtype_ok(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::i32 || t == DType::i8 || t == DType::boolean;
}

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Value make_value(std::vector<int64_t> shape, DType dtype) {
  auto impl = std::make_shared<Value::Impl>();
  impl->data.assign(static_cast<size_t>(numel_of(shape)), 0.0);
  return Value(std::move(shape), dtype, std::move(impl));
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

namespace {
thread_local Lowerer* t_lowerer = nullptr;
}  // namespace

Lowerer* active_lowerer() { return t_lowerer; }
LowererScope::LowererScope(Lowerer* l) : prev_(t_lowerer) { t_lowerer = l; }
LowererScope::~LowererScope() { t_lowerer = prev_; }

}  // namespace detail

namespace {

void check_defined(const char* op, const Value& v) {
  TPU_CHECK(v.defined(), "kernel {}: an operand is an undefined value", op);
}

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16; }

Value scalar_like(const Value& a, double s) {
  if (detail::Lowerer* L = detail::active_lowerer()) return L->full({}, s, a.dtype());
  Value v = make_value({}, a.dtype());
  data_of(v)[0] = detail::round_to(a.dtype(), s);
  return v;
}

// numpy broadcasting of two shapes; a tpu::Error naming the op when they do not broadcast.
std::vector<int64_t> broadcast_shape(const char* op, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t r = std::max(a.size(), b.size());
  std::vector<int64_t> out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    TPU_CHECK(da == db || da == 1 || db == 1, "kernel {}: shapes {} and {} do not broadcast", op, shape_str(a),
              shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Element strides of `in` broadcast to `out` (0 along broadcast dims).
std::vector<int64_t> bstrides(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<int64_t> st(out.size(), 0);
  int64_t s = 1;
  for (size_t k = 0; k < in.size(); ++k) {
    const size_t i = in.size() - 1 - k, o = out.size() - 1 - k;
    st[o] = in[i] == 1 ? 0 : s;
    s *= in[i];
  }
  return st;
}

// Visits every element of `out` with the flat indices of up to three broadcast operands.
template <class F>
void for_each_bcast(const std::vector<int64_t>& out, const std::vector<std::vector<int64_t>>& ins, F f) {
  const size_t r = out.size(), n = ins.size();
  std::vector<std::vector<int64_t>> st;
  for (const auto& s : ins) st.push_back(bstrides(s, out));
  std::vector<int64_t> idx(r, 0), off(n, 0);
  const int64_t total = detail::numel_of(out);
  for (int64_t e = 0; e < total; ++e) {
    f(e, off);
    for (size_t d = r; d-- > 0;) {
      ++idx[d];
      for (size_t j = 0; j < n; ++j) off[j] += st[j][d];
      if (idx[d] < out[d]) break;
      for (size_t j = 0; j < n; ++j) off[j] -= st[j][d] * out[d];
      idx[d] = 0;
    }
  }
}

template <class F>
Value binary(const char* op, detail::BinOp bop, const Value& a, const Value& b, DType out_dtype, F f) {
  check_defined(op, a);
  check_defined(op, b);
  TPU_CHECK(a.dtype() == b.dtype(), "kernel {}: dtype mismatch: {} {} and {} {} (convert one with kernel::cast)", op,
            dtype_name(a.dtype()), shape_str(a.shape()), dtype_name(b.dtype()), shape_str(b.shape()));
  std::vector<int64_t> shape = broadcast_shape(op, a.shape(), b.shape());
  if (detail::Lowerer* L = detail::active_lowerer()) return L->binary(bop, a, b, shape, out_dtype);
  Value out = make_value(shape, out_dtype);
  auto& o = data_of(out);
  const auto& x = data_of(a);
  const auto& y = data_of(b);
  for_each_bcast(shape, {a.shape(), b.shape()}, [&](int64_t e, const std::vector<int64_t>& off) {
    o[static_cast<size_t>(e)] = detail::round_to(out_dtype, f(x[static_cast<size_t>(off[0])], y[static_cast<size_t>(off[1])]));
  });
  return out;
}

Value arith(const char* op, detail::BinOp bop, const Value& a, const Value& b, double (*f)(double, double)) {
  check_defined(op, a);
  TPU_CHECK(a.dtype() != DType::boolean, "kernel {}: bool operands (use logical_and / where)", op);
  return binary(op, bop, a, b, a.dtype(), f);
}

Value compare(const char* op, detail::BinOp bop, const Value& a, const Value& b, bool (*f)(double, double)) {
  return binary(op, bop, a, b, DType::boolean, [f](double x, double y) { return f(x, y) ? 1.0 : 0.0; });
}

template <class F>
Value unary(const char* op, detail::UnOp uop, const Value& a, bool float_only, F f) {
  check_defined(op, a);
  TPU_CHECK(!float_only || is_float(a.dtype()), "kernel {}: needs an f32 or bf16 value, got {} {}", op,
            dtype_name(a.dtype()), shape_str(a.shape()));
  if (detail::Lowerer* L = detail::active_lowerer()) return L->unary(uop, a);
  Value out = make_value(a.shape(), a.dtype());
  auto& o = data_of(out);
  const auto& x = data_of(a);
  for (size_t i = 0; i < x.size(); ++i) o[i] = detail::round_to(a.dtype(), f(x[i]));
  return out;
}

// f32 arithmetic on float values (each operation rounds once); exact integers for i32.
double fadd(double x, double y) { return x + y; }
double fsub(double x, double y) { return x - y; }
double fmul(double x, double y) { return x * y; }
double fdiv(double x, double y) { return x / y; }
double fmax(double x, double y) { return std::isnan(x) || std::isnan(y) ? std::numeric_limits<double>::quiet_NaN() : std::max(x, y); }
double fmin(double x, double y) { return std::isnan(x) || std::isnan(y) ? std::numeric_limits<double>::quiet_NaN() : std::min(x, y); }

Value reduce(const char* op, detail::RedOp rop, const Value& a, int axis, bool keepdims) {
  const bool is_max = rop == detail::RedOp::max, is_min = rop == detail::RedOp::min;
  check_defined(op, a);
  const int r = a.rank();
  TPU_CHECK(r > 0 && axis >= -r && axis < r, "kernel {}: axis {} out of range for shape {}", op, axis, shape_str(a.shape()));
  if (axis < 0) axis += r;
  TPU_CHECK(a.dtype() != DType::boolean, "kernel {}: bool operand", op);
  const auto& s = a.shape();
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[static_cast<size_t>(d)];
  for (int d = axis + 1; d < r; ++d) inner *= s[static_cast<size_t>(d)];
  const int64_t len = s[static_cast<size_t>(axis)];
  TPU_CHECK(len > 0 || !(is_max || is_min), "kernel {}: reducing an empty axis", op);
  std::vector<int64_t> shape = s;
  if (keepdims) shape[static_cast<size_t>(axis)] = 1;
  else shape.erase(shape.begin() + axis);
  // Float sums accumulate in f32 (one rounding per addition), as the vector unit does.
  const DType acc = is_float(a.dtype()) ? DType::f32 : a.dtype();
  const DType out_dtype = a.dtype() == DType::bf16 && !(is_max || is_min) ? DType::f32 : a.dtype();
  if (detail::Lowerer* L = detail::active_lowerer()) return L->reduce(rop, a, axis, shape, out_dtype);
  Value out = make_value(shape, out_dtype);
  auto& o = data_of(out);
  const auto& x = data_of(a);
  for (int64_t i = 0; i < outer; ++i)
    for (int64_t j = 0; j < inner; ++j) {
      double v = is_max || is_min ? x[static_cast<size_t>(i * len * inner + j)] : 0.0;
      for (int64_t k = 0; k < len; ++k) {
        const double e = x[static_cast<size_t>((i * len + k) * inner + j)];
        if (is_max) v = fmax(v, e);
        else if (is_min) v = fmin(v, e);
        else v = detail::round_to(acc, v + e);
      }
      o[static_cast<size_t>(i * inner + j)] = detail::round_to(out.dtype(), v);
    }
  return out;
}

}  // namespace

Value operator+(const Value& a, const Value& b) { return arith("add", detail::BinOp::add, a, b, fadd); }
Value operator-(const Value& a, const Value& b) { return arith("sub", detail::BinOp::sub, a, b, fsub); }
Value operator*(const Value& a, const Value& b) { return arith("mul", detail::BinOp::mul, a, b, fmul); }
Value operator/(const Value& a, const Value& b) {
  check_defined("div", a);
  if (a.dtype() == DType::i32 && !detail::active_lowerer()) {
    check_defined("div", b);
    for (double y : data_of(b)) TPU_CHECK(y != 0, "kernel div: integer division by zero");
  }
  return arith("div", detail::BinOp::div, a, b, fdiv);
}
Value operator-(const Value& a) { return unary("neg", detail::UnOp::neg, a, false, [](double x) { return -x; }); }
Value operator+(const Value& a, double s) { return a + scalar_like(a, s); }
Value operator+(double s, const Value& a) { return scalar_like(a, s) + a; }
Value operator-(const Value& a, double s) { return a - scalar_like(a, s); }
Value operator-(double s, const Value& a) { return scalar_like(a, s) - a; }
Value operator*(const Value& a, double s) { return a * scalar_like(a, s); }
Value operator*(double s, const Value& a) { return scalar_like(a, s) * a; }
Value operator/(const Value& a, double s) { return a / scalar_like(a, s); }
Value operator/(double s, const Value& a) { return scalar_like(a, s) / a; }
Value maximum(const Value& a, const Value& b) { return arith("maximum", detail::BinOp::max, a, b, fmax); }
Value minimum(const Value& a, const Value& b) { return arith("minimum", detail::BinOp::min, a, b, fmin); }
Value maximum(const Value& a, double s) { return maximum(a, scalar_like(a, s)); }
Value minimum(const Value& a, double s) { return minimum(a, scalar_like(a, s)); }

Value lt(const Value& a, const Value& b) { return compare("lt", detail::BinOp::lt, a, b, [](double x, double y) { return x < y; }); }
Value le(const Value& a, const Value& b) { return compare("le", detail::BinOp::le, a, b, [](double x, double y) { return x <= y; }); }
Value gt(const Value& a, const Value& b) { return compare("gt", detail::BinOp::gt, a, b, [](double x, double y) { return x > y; }); }
Value ge(const Value& a, const Value& b) { return compare("ge", detail::BinOp::ge, a, b, [](double x, double y) { return x >= y; }); }
Value eq(const Value& a, const Value& b) { return compare("eq", detail::BinOp::eq, a, b, [](double x, double y) { return x == y; }); }
Value ne(const Value& a, const Value& b) { return compare("ne", detail::BinOp::ne, a, b, [](double x, double y) { return x != y; }); }
Value lt(const Value& a, double s) { return lt(a, scalar_like(a, s)); }
Value ge(const Value& a, double s) { return ge(a, scalar_like(a, s)); }
Value logical_and(const Value& a, const Value& b) {
  check_defined("logical_and", a);
  TPU_CHECK(a.dtype() == DType::boolean, "kernel logical_and: needs bool values, got {}", dtype_name(a.dtype()));
  return compare("logical_and", detail::BinOp::land, a, b, [](double x, double y) { return x != 0 && y != 0; });
}

Value where(const Value& cond, const Value& a, const Value& b) {
  check_defined("where", cond);
  check_defined("where", a);
  check_defined("where", b);
  TPU_CHECK(cond.dtype() == DType::boolean, "kernel where: the condition must be bool, got {} {}",
            dtype_name(cond.dtype()), shape_str(cond.shape()));
  TPU_CHECK(a.dtype() == b.dtype(), "kernel where: dtype mismatch: {} and {}", dtype_name(a.dtype()),
            dtype_name(b.dtype()));
  std::vector<int64_t> shape = broadcast_shape("where", broadcast_shape("where", cond.shape(), a.shape()), b.shape());
  if (detail::Lowerer* L = detail::active_lowerer()) return L->where(cond, a, b, shape);
  Value out = make_value(shape, a.dtype());
  auto& o = data_of(out);
  const auto &c = data_of(cond), &x = data_of(a), &y = data_of(b);
  for_each_bcast(shape, {cond.shape(), a.shape(), b.shape()}, [&](int64_t e, const std::vector<int64_t>& off) {
    o[static_cast<size_t>(e)] = c[static_cast<size_t>(off[0])] != 0 ? x[static_cast<size_t>(off[1])] : y[static_cast<size_t>(off[2])];
  });
  return out;
}
Value where(const Value& cond, const Value& a, double b) { return where(cond, a, scalar_like(a, b)); }

Value exp(const Value& a) { return unary("exp", detail::UnOp::exp, a, true, [](double x) { return std::exp(x); }); }
Value log(const Value& a) { return unary("log", detail::UnOp::log, a, true, [](double x) { return std::log(x); }); }
Value sqrt(const Value& a) { return unary("sqrt", detail::UnOp::sqrt, a, true, [](double x) { return std::sqrt(x); }); }
Value rsqrt(const Value& a) { return unary("rsqrt", detail::UnOp::rsqrt, a, true, [](double x) { return 1.0 / std::sqrt(x); }); }
Value tanh(const Value& a) { return unary("tanh", detail::UnOp::tanh, a, true, [](double x) { return std::tanh(x); }); }
Value sigmoid(const Value& a) { return unary("sigmoid", detail::UnOp::sigmoid, a, true, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }); }
Value reciprocal(const Value& a) { return unary("reciprocal", detail::UnOp::recip, a, true, [](double x) { return 1.0 / x; }); }
Value abs(const Value& a) { return unary("abs", detail::UnOp::abs, a, false, [](double x) { return std::abs(x); }); }
Value relu(const Value& a) {
  return unary("relu", detail::UnOp::relu, a, false, [](double x) { return std::isnan(x) ? x : std::max(x, 0.0); });
}

Value cast(const Value& a, DType dtype) {
  check_defined("cast", a);
  TPU_CHECK(detail::block_dtype_ok(dtype), "kernel cast: dtype {} is not a block dtype (f32, bf16, i32, i8, bool)",
            dtype_name(dtype));
  if (detail::Lowerer* L = detail::active_lowerer()) return L->cast(a, dtype);
  Value out = make_value(a.shape(), dtype);
  auto& o = data_of(out);
  const auto& x = data_of(a);
  for (size_t i = 0; i < x.size(); ++i) o[i] = detail::round_to(dtype, x[i]);
  return out;
}

Value sum(const Value& a, int axis, bool keepdims) { return reduce("sum", detail::RedOp::sum, a, axis, keepdims); }
Value max(const Value& a, int axis, bool keepdims) { return reduce("max", detail::RedOp::max, a, axis, keepdims); }
Value min(const Value& a, int axis, bool keepdims) { return reduce("min", detail::RedOp::min, a, axis, keepdims); }
Value row_sum(const Value& a) {
  check_defined("row_sum", a);
  TPU_CHECK(a.rank() == 2, "kernel row_sum: needs a 2-d value, got {}", shape_str(a.shape()));
  return sum(a, 1, true);
}
Value row_max(const Value& a) {
  check_defined("row_max", a);
  TPU_CHECK(a.rank() == 2, "kernel row_max: needs a 2-d value, got {}", shape_str(a.shape()));
  return max(a, 1, true);
}

Value broadcast_to(const Value& a, const std::vector<int64_t>& shape) {
  check_defined("broadcast_to", a);
  const std::vector<int64_t> s = broadcast_shape("broadcast_to", a.shape(), shape);
  TPU_CHECK(s == shape, "kernel broadcast_to: shape {} does not broadcast to {}", shape_str(a.shape()), shape_str(shape));
  if (detail::Lowerer* L = detail::active_lowerer()) return L->broadcast_to(a, shape);
  Value out = make_value(shape, a.dtype());
  auto& o = data_of(out);
  const auto& x = data_of(a);
  for_each_bcast(shape, {a.shape()}, [&](int64_t e, const std::vector<int64_t>& off) {
    o[static_cast<size_t>(e)] = x[static_cast<size_t>(off[0])];
  });
  return out;
}

Value transpose(const Value& a) {
  check_defined("transpose", a);
  TPU_CHECK(a.rank() == 2, "kernel transpose: needs a 2-d value, got {}", shape_str(a.shape()));
  if (detail::Lowerer* L = detail::active_lowerer()) return L->transpose(a);
  const int64_t m = a.shape()[0], n = a.shape()[1];
  Value out = make_value({n, m}, a.dtype());
  auto& o = data_of(out);
  const auto& x = data_of(a);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) o[static_cast<size_t>(j * m + i)] = x[static_cast<size_t>(i * n + j)];
  return out;
}

Value iota(const std::vector<int64_t>& shape, int axis, DType dtype) {
  const int r = static_cast<int>(shape.size());
  TPU_CHECK(r > 0 && axis >= -r && axis < r, "kernel iota: axis {} out of range for shape {}", axis, shape_str(shape));
  TPU_CHECK(dtype == DType::i32 || dtype == DType::f32, "kernel iota: dtype must be i32 or f32, got {}", dtype_name(dtype));
  for (int64_t d : shape) TPU_CHECK(d >= 0, "kernel iota: negative dim in shape {}", shape_str(shape));
  if (axis < 0) axis += r;
  if (detail::Lowerer* L = detail::active_lowerer()) return L->iota(shape, axis, dtype);
  Value out = make_value(shape, dtype);
  auto& o = data_of(out);
  int64_t inner = 1;
  for (int d = axis + 1; d < r; ++d) inner *= shape[static_cast<size_t>(d)];
  const int64_t len = shape[static_cast<size_t>(axis)];
  for (size_t e = 0; e < o.size(); ++e) o[e] = static_cast<double>((static_cast<int64_t>(e) / inner) % len);
  return out;
}

Value full(const std::vector<int64_t>& shape, double value, DType dtype) {
  TPU_CHECK(detail::block_dtype_ok(dtype), "kernel full: dtype {} is not a block dtype (f32, bf16, i32, i8, bool)",
            dtype_name(dtype));
  for (int64_t d : shape) TPU_CHECK(d >= 0, "kernel full: negative dim in shape {}", shape_str(shape));
  if (detail::Lowerer* L = detail::active_lowerer()) return L->full(shape, value, dtype);
  Value out = make_value(shape, dtype);
  const double v = detail::round_to(dtype, value);
  for (double& x : data_of(out)) x = v;
  return out;
}

Value dot(const Value& a, const Value& b, DotOptions opt) {
  check_defined("dot", a);
  check_defined("dot", b);
  TPU_CHECK(a.rank() == 2 && b.rank() == 2, "kernel dot: needs 2-d operands, got {} and {}", shape_str(a.shape()),
            shape_str(b.shape()));
  TPU_CHECK(a.dtype() == b.dtype(), "kernel dot: dtype mismatch: a is {} {}, b is {} {} (cast both to f32 or bf16)",
            dtype_name(a.dtype()), shape_str(a.shape()), dtype_name(b.dtype()), shape_str(b.shape()));
  TPU_CHECK(is_float(a.dtype()) || a.dtype() == DType::i8, "kernel dot: operands must be f32, bf16 or i8, got {}",
            dtype_name(a.dtype()));
  const int64_t m = opt.transpose_a ? a.shape()[1] : a.shape()[0];
  const int64_t k = opt.transpose_a ? a.shape()[0] : a.shape()[1];
  const int64_t kb = opt.transpose_b ? b.shape()[1] : b.shape()[0];
  const int64_t n = opt.transpose_b ? b.shape()[0] : b.shape()[1];
  TPU_CHECK(k == kb, "kernel dot: contraction sizes differ: a {}{} and b {}{}", shape_str(a.shape()),
            opt.transpose_a ? " (transposed)" : "", shape_str(b.shape()), opt.transpose_b ? " (transposed)" : "");
  if (detail::Lowerer* L = detail::active_lowerer()) return L->dot(a, b, opt, m, k, n);
  const bool int8 = a.dtype() == DType::i8;
  Value out = make_value({m, n}, int8 ? DType::i32 : DType::f32);
  auto& o = data_of(out);
  const auto &x = data_of(a), &y = data_of(b);
  const int64_t lda = a.shape()[1], ldb = b.shape()[1];
  if (int8) {  // exact integer products and sums (i32 accumulation; wraps past its range)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        int64_t acc = 0;
        for (int64_t p = 0; p < k; ++p)
          acc += static_cast<int64_t>(opt.transpose_a ? x[static_cast<size_t>(p * lda + i)] : x[static_cast<size_t>(i * lda + p)]) *
                 static_cast<int64_t>(opt.transpose_b ? y[static_cast<size_t>(j * ldb + p)] : y[static_cast<size_t>(p * ldb + j)]);
        o[static_cast<size_t>(i * n + j)] = static_cast<double>(static_cast<int32_t>(static_cast<uint32_t>(acc)));
      }
    return out;
  }
  std::vector<float> acc(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t p = 0; p < k; ++p) {
      const float av = static_cast<float>(opt.transpose_a ? x[static_cast<size_t>(p * lda + i)] : x[static_cast<size_t>(i * lda + p)]);
      for (int64_t j = 0; j < n; ++j) {
        const float bv = static_cast<float>(opt.transpose_b ? y[static_cast<size_t>(j * ldb + p)] : y[static_cast<size_t>(p * ldb + j)]);
        acc[static_cast<size_t>(j)] += av * bv;
      }
    }
    for (int64_t j = 0; j < n; ++j) o[static_cast<size_t>(i * n + j)] = acc[static_cast<size_t>(j)];
  }
  return out;
}

}  // namespace tpu::kernel
