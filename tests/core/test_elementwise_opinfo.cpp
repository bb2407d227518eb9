// OpInfo entries for the elementwise ops: binary arithmetic, comparisons, logical ops, where,
// unary ops and clamp. References are naive double-precision formulas over the broadcast
// index space (ref_map), with store_as modelling integer wrap-around and f32 overflow.
#include <cmath>
#include <functional>

#include "test_elementwise_util.h"

namespace tpu::testing::elementwise {
namespace {

const std::vector<DType> kAll = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i8, DType::u8, DType::boolean};
const std::vector<DType> kNoBool = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i8, DType::u8};
const std::vector<DType> kFloatsAndSomeInts = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::u8, DType::boolean};

using BinT = std::function<Tensor(const Tensor&, const Tensor&)>;
using BinS = std::function<Tensor(const Tensor&, Scalar)>;
using BinRef = std::function<double(double, double)>;
using BinRefDt = std::function<double(double, double, DType)>;  // also sees the sample dtype

// out dtype of a same-dtype binary op: `dt`, or f32 for true division of integers.
void add_binary_dt(const std::string& name, std::vector<DType> dtypes, BinT fn, BinS fs, BinRefDt ref, Range ra = {},
                   Range rb = {}, bool int_valued = false, bool float_out = false, bool bool_out = false) {
  OpInfo info;
  info.op = name;
  info.dtypes = std::move(dtypes);
  info.samples = [=](DType dt, Generator& g) { return binary_samples(dt, g, ra, rb, int_valued); };
  info.run = [=](const std::vector<Tensor>& in) {
    if (has_scalar_marker(in)) return fs(in[0], in[1].item());
    return fn(in[0], in[1]);
  };
  info.reference = [=](const std::vector<Ref>& r, DType dt) {
    const DType out = bool_out ? DType::boolean : (float_out && !is_floating(dt)) ? DType::f32 : dt;
    return ref_map({r[0], r[1]}, [&](const std::vector<double>& v) { return store_as(out, ref(v[0], v[1], dt)); });
  };
  if (float_out) info.tol = float_result_tol;
  OpInfoRegistrar reg(std::move(info));
}
void add_binary(const std::string& name, std::vector<DType> dtypes, BinT fn, BinS fs, BinRef ref, Range ra = {},
                Range rb = {}, bool int_valued = false, bool float_out = false, bool bool_out = false) {
  add_binary_dt(name, std::move(dtypes), std::move(fn), std::move(fs),
                [ref](double x, double y, DType) { return ref(x, y); }, ra, rb, int_valued, float_out, bool_out);
}

using UnT = std::function<Tensor(const Tensor&)>;
using UnRef = std::function<double(double)>;
void add_unary(const std::string& name, std::vector<DType> dtypes, UnT fn, UnRef ref, Range r = {}, bool float_out = false,
               bool bool_out = false) {
  OpInfo info;
  info.op = name;
  info.dtypes = std::move(dtypes);
  info.samples = [=](DType dt, Generator& g) { return unary_samples(dt, g, r, true); };
  info.run = [=](const std::vector<Tensor>& in) { return fn(in[0]); };
  info.reference = [=](const std::vector<Ref>& rr, DType dt) {
    const DType out = bool_out ? DType::boolean : (float_out && !is_floating(dt)) ? DType::f32 : dt;
    return ref_map({rr[0]}, [&](const std::vector<double>& v) { return store_as(out, ref(v[0])); });
  };
  if (float_out) info.tol = float_result_tol;
  OpInfoRegistrar reg(std::move(info));
}

double ref_int_pow(double b, double e) {
  if (e < 0) {
    if (b == 1) return 1;
    if (b == -1) return std::fmod(std::fabs(e), 2.0) == 1.0 ? -1 : 1;
    return 0;
  }
  double r = 1;
  for (int i = 0; i < static_cast<int>(e); ++i) r *= b;
  return r;
}

double ref_round_half_even(double x) {
  if (!std::isfinite(x)) return x;
  const double f = std::floor(x), d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f == 0 && std::signbit(x) ? -0.0 : f;
  return std::fmod(f, 2.0) == 0 ? f : f + 1;
}

double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

const bool registered = [] {
  // ---- arithmetic ----
  add_binary("add", kAll, [](const Tensor& a, const Tensor& b) { return add(a, b); },
             [](const Tensor& a, Scalar b) { return add(a, b); }, [](double x, double y) { return x + y; });
  add_binary("sub", kNoBool, [](const Tensor& a, const Tensor& b) { return sub(a, b, 2); },
             // the scalar form has no alpha: a - b - b matches the same reference
             [](const Tensor& a, Scalar b) { return sub(sub(a, b), b); }, [](double x, double y) { return x - 2 * y; });
  add_binary("mul", kAll, [](const Tensor& a, const Tensor& b) { return mul(a, b); },
             [](const Tensor& a, Scalar b) { return mul(a, b); }, [](double x, double y) { return x * y; });
  add_binary("div", kAll, [](const Tensor& a, const Tensor& b) { return div(a, b); },
             [](const Tensor& a, Scalar b) { return div(a, b); }, [](double x, double y) { return x / y; }, {}, {},
             false, true);
  add_binary_dt("pow", kNoBool, [](const Tensor& a, const Tensor& b) { return pow(a, b); },
             [](const Tensor& a, Scalar b) { return pow(a, b); },
             [](double x, double y, DType dt) { return is_floating(dt) ? std::pow(x, y) : ref_int_pow(x, y); },
             {0.1, 2.0}, {-1.0, 1.0});
  add_binary("maximum", kAll, [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
             [](const Tensor& a, Scalar b) { return maximum(a, b); }, [](double x, double y) { return std::max(x, y); });
  add_binary("minimum", kAll, [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
             [](const Tensor& a, Scalar b) { return minimum(a, b); }, [](double x, double y) { return std::min(x, y); });
  add_binary_dt("fmod", kNoBool, [](const Tensor& a, const Tensor& b) { return fmod(a, b); },
             [](const Tensor& a, Scalar b) { return fmod(a, b); },
             [](double x, double y, DType dt) { return !is_floating(dt) && y == 0 ? 0.0 : std::fmod(x, y); },
             {-3.0, 3.0}, {-2.0, 2.0});
  // ---- comparisons (integer-valued inputs so that ties occur) ----
  auto cmp = [](const std::string& n, BinT f, BinS fs, BinRef r) {
    add_binary(n, kAll, f, fs, r, {-2, 3}, {-2, 3}, true, false, true);
  };
  cmp("eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }, [](const Tensor& a, Scalar b) { return eq(a, b); },
      [](double x, double y) { return double(x == y); });
  cmp("ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }, [](const Tensor& a, Scalar b) { return ne(a, b); },
      [](double x, double y) { return double(x != y); });
  cmp("lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }, [](const Tensor& a, Scalar b) { return lt(a, b); },
      [](double x, double y) { return double(x < y); });
  cmp("le", [](const Tensor& a, const Tensor& b) { return le(a, b); }, [](const Tensor& a, Scalar b) { return le(a, b); },
      [](double x, double y) { return double(x <= y); });
  cmp("gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }, [](const Tensor& a, Scalar b) { return gt(a, b); },
      [](double x, double y) { return double(x > y); });
  cmp("ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }, [](const Tensor& a, Scalar b) { return ge(a, b); },
      [](double x, double y) { return double(x >= y); });
  // ---- logical (the scalar form goes through wrap_scalar) ----
  auto lg = [](const std::string& n, BinT f, BinRef r) {
    add_binary(n, kAll, f, [f](const Tensor& a, Scalar b) { return f(a, wrap_scalar(b)); }, r, {-1, 2}, {-1, 2}, true,
               false, true);
  };
  lg("logical_and", [](const Tensor& a, const Tensor& b) { return logical_and(a, b); },
     [](double x, double y) { return double(x != 0 && y != 0); });
  lg("logical_or", [](const Tensor& a, const Tensor& b) { return logical_or(a, b); },
     [](double x, double y) { return double(x != 0 || y != 0); });
  lg("logical_xor", [](const Tensor& a, const Tensor& b) { return logical_xor(a, b); },
     [](double x, double y) { return double((x != 0) != (y != 0)); });

  // ---- unary ----
  const Range pos{0.01, 4.0};
  add_unary("neg", kNoBool, [](const Tensor& x) { return neg(x); }, [](double x) { return -x; });
  add_unary("abs", kAll, [](const Tensor& x) { return abs(x); }, [](double x) { return std::fabs(x); });
  add_unary("sign", kAll, [](const Tensor& x) { return sign(x); },
            [](double x) { return std::isnan(x) ? x : double((x > 0) - (x < 0)); });
  add_unary("relu", kNoBool, [](const Tensor& x) { return relu(x); }, [](double x) { return std::isnan(x) ? x : x < 0 ? 0 : x; });
  add_unary("floor", kAll, [](const Tensor& x) { return floor(x); }, [](double x) { return std::floor(x); });
  add_unary("ceil", kAll, [](const Tensor& x) { return ceil(x); }, [](double x) { return std::ceil(x); });
  add_unary("round", kAll, [](const Tensor& x) { return round(x); }, ref_round_half_even, {-4.0, 4.0});
  auto fl = [&](const std::string& n, UnT f, UnRef r, Range rg = {}) { add_unary(n, kFloatsAndSomeInts, f, r, rg, true); };
  fl("exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); });
  fl("log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, pos);
  fl("log1p", [](const Tensor& x) { return log1p(x); }, [](double x) { return std::log1p(x); }, {-0.9, 3.0});
  fl("expm1", [](const Tensor& x) { return expm1(x); }, [](double x) { return std::expm1(x); });
  fl("sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, pos);
  fl("rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1.0 / std::sqrt(x); }, pos);
  fl("reciprocal", [](const Tensor& x) { return reciprocal(x); }, [](double x) { return 1.0 / x; }, {0.2, 3.0});
  fl("sin", [](const Tensor& x) { return sin(x); }, [](double x) { return std::sin(x); }, {-4.0, 4.0});
  fl("cos", [](const Tensor& x) { return cos(x); }, [](double x) { return std::cos(x); }, {-4.0, 4.0});
  fl("tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, {-4.0, 4.0});
  fl("sigmoid", [](const Tensor& x) { return sigmoid(x); }, ref_sigmoid, {-6.0, 6.0});
  fl("silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x * ref_sigmoid(x); }, {-6.0, 6.0});
  fl("erf", [](const Tensor& x) { return erf(x); }, [](double x) { return std::erf(x); }, {-3.0, 3.0});
  // gelu's tanh form is checked against its closed form in test_elementwise.cpp.
  fl("gelu", [](const Tensor& x) { return gelu(x); }, [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); },
     {-5.0, 5.0});
  add_unary("logical_not", kAll, [](const Tensor& x) { return logical_not(x); }, [](double x) { return double(x == 0); },
            {}, false, true);
  add_unary("isnan", kAll, [](const Tensor& x) { return isnan(x); }, [](double x) { return double(std::isnan(x)); }, {},
            false, true);

  // ---- clamp: bounds -1 and 1 (integers, so integer inputs keep their dtype) ----
  add_unary("clamp", kNoBool, [](const Tensor& x) { return clamp(x, -1, 1); },
            [](double x) { return std::isnan(x) ? x : std::min(std::max(x, -1.0), 1.0); }, {-3.0, 3.0});

  // ---- where: bool condition broadcast against both branches ----
  {
    OpInfo info;
    info.op = "where";
    info.dtypes = kAll;
    info.samples = [](DType dt, Generator& g) {
      using L = Layout;
      Range q = int_range(dt, {});
      auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l, q.lo, q.hi); };
      auto cond = [&](const Shape& s, L l) { return make_input(g, s, DType::boolean, l); };
      std::vector<OpSample> v;
      v.push_back({"same [3,4]", {cond({3, 4}, L::contiguous), mk({3, 4}, L::contiguous), mk({3, 4}, L::contiguous)}});
      v.push_back({"broadcast cond [3,1] a [4] b [3,4]", {cond({3, 1}, L::contiguous), mk({4}, L::contiguous), mk({3, 4}, L::transposed)}});
      v.push_back({"sliced / expanded", {cond({2, 5}, L::sliced), mk({2, 5}, L::expanded), mk({5}, L::contiguous)}});
      v.push_back({"0-d branches", {cond({4}, L::contiguous), mk({}, L::contiguous), mk({}, L::contiguous)}});
      v.push_back({"zero-size", {cond({0, 2}, L::contiguous), mk({2}, L::contiguous), mk({1, 2}, L::contiguous)}});
      v.push_back({"scalar b", {cond({2, 3}, L::contiguous), mk({2, 3}, L::contiguous), mk({}, L::contiguous), scalar_marker()}});
      return v;
    };
    info.run = [](const std::vector<Tensor>& in) {
      if (in.size() == 4) return where(in[0], in[1], in[2].item());
      return where(in[0], in[1], in[2]);
    };
    info.reference = [](const std::vector<Ref>& r, DType) {
      return ref_map({r[0], r[1], r[2]}, [](const std::vector<double>& v) { return v[0] != 0 ? v[1] : v[2]; });
    };
    OpInfoRegistrar reg(std::move(info));
  }
  return true;
}();

}  // namespace
}  // namespace tpu::testing::elementwise
