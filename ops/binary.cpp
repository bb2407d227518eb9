// Elementwise binary arithmetic with broadcasting and PyTorch type promotion: add, sub
// (with alpha), mul, div (true division), pow, maximum, minimum, fmod; and wrap_scalar.
//
// Integer semantics (no traps, ever): + - * wrap around in two's complement; pow with a
// negative exponent gives 1 for base 1, +-1 for base -1 and 0 otherwise (as PyTorch does
// for tensor exponents); fmod by zero gives 0 (our definition; C++ would trap) and
// INT_MIN fmod -1 gives 0. div is true division: integer inputs compute in f32.
#include <cmath>

#include "ops/binary_common.h"

namespace tpu {
namespace {
using namespace ops;
using namespace ops::elementwise;

DType arith_type(const MetaArgs& a) { return result_type(a.inputs); }

Scalar alpha_of(const Attrs& attrs) {
  const AttrValue* v = attrs.find("alpha");
  return v ? std::get<Scalar>(*v) : Scalar(1);
}

void check_alpha(const MetaArgs& a, DType t) {
  const AttrValue* v = a.attrs.find("alpha");
  if (!v) return;
  const Scalar al = std::get<Scalar>(*v);
  TPU_CHECK(!al.is_bool() || t == DType::boolean, "{}: a bool alpha ({}) needs a bool result, got {}", a.op.name,
            al.str(), dtype_name(t));
  TPU_CHECK(is_floating(t) || !al.is_floating(), "{}: alpha must not be a floating point number ({}) for {} inputs",
            a.op.name, al.str(), dtype_name(t));
}

void add_meta(const MetaArgs& a, MetaResult& m) {
  const DType t = arith_type(a);
  check_alpha(a, t);
  broadcast_setup(a, m, t, t, 0b11);
}

void sub_meta(const MetaArgs& a, MetaResult& m) {
  const DType ta = a.inputs[0].dtype(), tb = a.inputs[1].dtype();
  TPU_CHECK(!(ta == DType::boolean && tb == DType::boolean),
            "sub: subtraction of two bool tensors ({} and {}) is not supported; use logical_xor",
            describe(a.inputs[0]), describe(a.inputs[1]));
  TPU_CHECK(ta != DType::boolean && tb != DType::boolean,
            "sub: subtraction with a bool tensor ({} and {}) is not supported; to invert a mask use logical_not",
            describe(a.inputs[0]), describe(a.inputs[1]));
  add_meta(a, m);
}

void plain_meta(const MetaArgs& a, MetaResult& m) {
  const DType t = arith_type(a);
  broadcast_setup(a, m, t, t, 0b11);
}

void div_meta(const MetaArgs& a, MetaResult& m) {
  DType t = arith_type(a);
  if (!is_floating(t)) t = DType::f32;  // true division
  broadcast_setup(a, m, t, t, 0b11);
}

void nobool_meta(const MetaArgs& a, MetaResult& m) {
  const DType t = arith_type(a);
  TPU_CHECK(t != DType::boolean, "{}: not supported for bool inputs ({} and {})", a.op.name, describe(a.inputs[0]),
            describe(a.inputs[1]));
  broadcast_setup(a, m, t, t, 0b11);
}

// ---- kernels ----

void add_cpu_impl(const KernelArgs& k, bool subtract) {
  const Scalar alpha = alpha_of(k.attrs);
  dispatch_dtype(k.outputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    using C = cpu::compute_t<T>;
    if constexpr (std::is_same_v<T, float>) {
      const float al = static_cast<float>(alpha.to_double());
      if (subtract)
        f32_binary(k, cpu::VecBinary::sub, al, false, [al](float x, float y) { return x - al * y; });
      else
        f32_binary(k, cpu::VecBinary::add, al, al == 1.0f, [al](float x, float y) { return x + al * y; });
    } else if constexpr (std::is_same_v<T, bool>) {
      const bool al = alpha.to_bool();
      map_binary<T, T>(k, [al](bool x, bool y) { return x || (al && y); });
    } else if constexpr (std::is_same_v<T, f16>) {
      const float al = scalar_as<float>(alpha);
      if (!subtract && al == 1.0f) f16_binary(k, cpu::VecBinary::add, 1.0f, [](float x, float y) { return x + y; });
      else if (subtract) map_binary<T, T>(k, [al](float x, float y) { return wrap_sub(x, wrap_mul(al, y)); });
      else map_binary<T, T>(k, [al](float x, float y) { return wrap_add(x, wrap_mul(al, y)); });
    } else {
      const C al = scalar_as<C>(alpha);
      if (subtract) map_binary<T, T>(k, [al](C x, C y) { return wrap_sub(x, wrap_mul(al, y)); });
      else map_binary<T, T>(k, [al](C x, C y) { return wrap_add(x, wrap_mul(al, y)); });
    }
  });
}
void add_cpu(const KernelArgs& k) { add_cpu_impl(k, false); }
void sub_cpu(const KernelArgs& k) { add_cpu_impl(k, true); }

void mul_cpu(const KernelArgs& k) {
  dispatch_dtype(k.outputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    using C = cpu::compute_t<T>;
    if constexpr (std::is_same_v<T, float>)
      f32_binary(k, cpu::VecBinary::mul, 1.0f, true, [](float x, float y) { return x * y; });
    else if constexpr (std::is_same_v<T, f16>)
      f16_binary(k, cpu::VecBinary::mul, 1.0f, [](float x, float y) { return x * y; });
    else if constexpr (std::is_same_v<T, bool>)
      map_binary<T, T>(k, [](bool x, bool y) { return x && y; });
    else
      map_binary<T, T>(k, [](C x, C y) { return wrap_mul(x, y); });
  });
}

void div_cpu(const KernelArgs& k) {
  dispatch_dtype(k.outputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_same_v<T, float>)
      f32_binary(k, cpu::VecBinary::div, 1.0f, false, [](float x, float y) { return x / y; });
    else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
      map_binary<T, T>(k, [](float x, float y) { return x / y; });
    else
      fail("internal: div: integer output dtype {}", dtype_name(k.outputs[0].dtype()));
  });
}

template <class C>
C int_pow(C base, C e) {
  if (e < 0) {
    if (base == 1) return 1;
    if (base == -1) return (e & 1) ? C(-1) : C(1);
    return 0;
  }
  // Square-and-multiply unsigned: wraps on overflow instead of being undefined.
  using U = std::make_unsigned_t<C>;
  U result = 1, b = static_cast<U>(base);
  for (U ex = static_cast<U>(e); ex; ex >>= 1) {
    if (ex & 1u) result *= b;
    b *= b;
  }
  return static_cast<C>(result);
}

void pow_cpu(const KernelArgs& k) {
  dispatch_dtype(k.outputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    using C = cpu::compute_t<T>;
    if constexpr (std::is_same_v<C, float>)
      map_binary<T, T>(k, [](float x, float y) { return std::pow(x, y); });
    else if constexpr (std::is_same_v<C, int32_t> || std::is_same_v<C, int64_t>)
      map_binary<T, T>(k, [](C x, C y) { return int_pow(x, y); });
    else
      fail("internal: pow: bool output");
  });
}

void fmod_cpu(const KernelArgs& k) {
  dispatch_dtype(k.outputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    using C = cpu::compute_t<T>;
    if constexpr (std::is_same_v<C, float>)
      map_binary<T, T>(k, [](float x, float y) { return std::fmod(x, y); });
    else if constexpr (std::is_same_v<C, int32_t> || std::is_same_v<C, int64_t>)
      map_binary<T, T>(k, [](C x, C y) -> C { return (y == 0 || y == -1) ? C(0) : C(x % y); });
    else
      fail("internal: fmod: bool output");
  });
}

// maximum/minimum: NaN from either side wins, as PyTorch.
template <bool kMax>
void minmax_cpu(const KernelArgs& k) {
  dispatch_dtype(k.outputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    using C = cpu::compute_t<T>;
    auto pick = [](C x, C y) -> C {
      if constexpr (std::is_same_v<C, float>)
        if (x != x || y != y) return x + y;
      return kMax ? (x > y ? x : y) : (x < y ? x : y);
    };
    if constexpr (std::is_same_v<T, float>)
      f32_binary(k, kMax ? cpu::VecBinary::maximum : cpu::VecBinary::minimum, 1.0f, true, pick);
    else
      map_binary<T, T>(k, pick);
  });
}

TPU_DEFINE_OP(add_op, {.name = "add", .num_inputs = 2, .flags = kElementwise, .meta = &add_meta, .cpu = &add_cpu,
                       .doc = "a + alpha * b with broadcasting (alpha attr optional, default 1)"});
TPU_DEFINE_OP(sub_op, {.name = "sub", .num_inputs = 2, .flags = kElementwise, .meta = &sub_meta, .cpu = &sub_cpu,
                       .doc = "a - alpha * b with broadcasting (alpha attr optional, default 1)"});
TPU_DEFINE_OP(mul_op, {.name = "mul", .num_inputs = 2, .flags = kElementwise, .meta = &plain_meta, .cpu = &mul_cpu,
                       .doc = "a * b with broadcasting (bool: logical and)"});
TPU_DEFINE_OP(div_op, {.name = "div", .num_inputs = 2, .flags = kElementwise, .meta = &div_meta, .cpu = &div_cpu,
                       .doc = "true division a / b (integer inputs compute in f32)"});
TPU_DEFINE_OP(pow_op, {.name = "pow", .num_inputs = 2, .flags = kElementwise, .meta = &nobool_meta, .cpu = &pow_cpu,
                       .doc = "a ** b (integers: exact with wrap-around; negative exponents as PyTorch)"});
TPU_DEFINE_OP(maximum_op, {.name = "maximum", .num_inputs = 2, .flags = kElementwise, .meta = &plain_meta,
                           .cpu = &minmax_cpu<true>, .doc = "elementwise max, NaN-propagating"});
TPU_DEFINE_OP(minimum_op, {.name = "minimum", .num_inputs = 2, .flags = kElementwise, .meta = &plain_meta,
                           .cpu = &minmax_cpu<false>, .doc = "elementwise min, NaN-propagating"});
TPU_DEFINE_OP(fmod_op, {.name = "fmod", .num_inputs = 2, .flags = kElementwise, .meta = &nobool_meta, .cpu = &fmod_cpu,
                        .doc = "remainder with the sign of the dividend (C fmod); integer x fmod 0 = 0"});

Attrs alpha_attrs(Scalar alpha) {
  // The common alpha == 1 carries no attribute (keeps the tiny-op path allocation-free).
  if (!alpha.is_floating() && alpha.to_int() == 1 && !alpha.is_bool()) return {};
  return Attrs{{"alpha", alpha}};
}

Tensor scalar_rhs(const Tensor& a, Scalar b) { return wrapped_scalar_as(b, scalar_result_type(a, b)); }

}  // namespace

namespace ops::elementwise {
Tensor wrapped_scalar_as(Scalar s, DType dtype) {
  Tensor t = ops::empty_tensor(Shape{}, dtype, Device());
  dispatch_dtype(dtype, [&](auto z) {
    using T = decltype(z);
    *static_cast<T*>(t.raw_data()) = scalar_as<T>(s);
  });
  t.impl().wrapped_number = true;
  return t;
}
}  // namespace ops::elementwise

Tensor wrap_scalar(Scalar s) { return wrapped_scalar_as(s, s.dtype()); }

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) { return ops::call(add_op(), {a, b}, alpha_attrs(alpha)); }
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) { return ops::call(sub_op(), {a, b}, alpha_attrs(alpha)); }
Tensor mul(const Tensor& a, const Tensor& b) { return ops::call(mul_op(), {a, b}); }
Tensor div(const Tensor& a, const Tensor& b) { return ops::call(div_op(), {a, b}); }
Tensor pow(const Tensor& a, const Tensor& b) { return ops::call(pow_op(), {a, b}); }
Tensor maximum(const Tensor& a, const Tensor& b) { return ops::call(maximum_op(), {a, b}); }
Tensor minimum(const Tensor& a, const Tensor& b) { return ops::call(minimum_op(), {a, b}); }
Tensor fmod(const Tensor& a, const Tensor& b) { return ops::call(fmod_op(), {a, b}); }

Tensor add(const Tensor& a, Scalar b) { return add(a, scalar_rhs(a, b)); }
Tensor sub(const Tensor& a, Scalar b) { return sub(a, scalar_rhs(a, b)); }
Tensor mul(const Tensor& a, Scalar b) { return mul(a, scalar_rhs(a, b)); }
Tensor div(const Tensor& a, Scalar b) { return div(a, scalar_rhs(a, b)); }
Tensor pow(const Tensor& a, Scalar b) { return pow(a, scalar_rhs(a, b)); }
Tensor maximum(const Tensor& a, Scalar b) { return maximum(a, scalar_rhs(a, b)); }
Tensor minimum(const Tensor& a, Scalar b) { return minimum(a, scalar_rhs(a, b)); }
Tensor fmod(const Tensor& a, Scalar b) { return fmod(a, scalar_rhs(a, b)); }

}  // namespace tpu
