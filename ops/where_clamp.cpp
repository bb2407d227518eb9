// where(cond, a, b) with broadcasting over all three and promotion of a and b; and clamp
// with optional scalar bounds (promoting like PyTorch: an int tensor clamped to float
// bounds gives f32; integer bounds keep the integer dtype).
#include <cmath>
#include <limits>

#include "ops/binary_common.h"

namespace tpu {
namespace {
using namespace ops;
using namespace ops::elementwise;

void where_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& c = a.inputs[0];
  TPU_CHECK(c.dtype() == DType::boolean, "where: the condition must be a bool tensor, got {}", describe(c));
  const DType t = result_type(a.inputs.subspan(1));
  broadcast_setup(a, m, t, t, 0b110);
}

void where_cpu(const KernelArgs& k) {
  dispatch_dtype(k.outputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    cpu::ternary_map<T, bool, T, T>(k.outputs[0], k.inputs[0], k.inputs[1], k.inputs[2],
                                     [](bool c, T x, T y) { return c ? x : y; });
  });
}

TPU_DEFINE_OP(where_op, {.name = "where", .num_inputs = 3, .flags = kElementwise, .meta = &where_meta,
                         .cpu = &where_cpu, .doc = "cond ? a : b with broadcasting (cond must be bool)"});

const Scalar* bound(const Attrs& attrs, const char* name) {
  const AttrValue* v = attrs.find(name);
  return v ? &std::get<Scalar>(*v) : nullptr;
}

void clamp_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  const Scalar* lo = bound(a.attrs, "min");
  const Scalar* hi = bound(a.attrs, "max");
  TPU_CHECK(lo || hi, "clamp: at least one of min and max must be given (input {})", describe(x));
  ResultTypeState st;
  st.update(x.dtype(), x.dim() == 0, false);
  if (lo) st.update(lo->dtype(), true, true);
  if (hi) st.update(hi->dtype(), true, true);
  const DType t = st.result();
  TPU_CHECK(t != DType::boolean, "clamp: not supported for bool tensors (got {})", describe(x));
  m.out() = {x.shape(), t, x.device()};
  m.cast_mask = 1;
  m.cast_to = t;
}

void clamp_cpu(const KernelArgs& k) {
  const Scalar* lo_s = bound(k.attrs, "min");
  const Scalar* hi_s = bound(k.attrs, "max");
  dispatch_dtype(k.outputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    using C = cpu::compute_t<T>;
    if constexpr (!std::is_same_v<C, bool>) {
      if constexpr (std::is_same_v<C, float>) {
        // A NaN bound makes every element NaN (as PyTorch).
        if ((lo_s && std::isnan(lo_s->to_double())) || (hi_s && std::isnan(hi_s->to_double()))) {
          map_unary<T, T>(k.outputs[0], k.inputs[0], [](float) { return NAN; });
          return;
        }
      }
      // Integer bounds outside the integer type saturate to its range.
      auto as_c = [](const Scalar* s, C dflt) -> C {
        if (!s) return dflt;
        if constexpr (std::is_integral_v<C>) {
          const double v = s->to_double();
          if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) return static_cast<C>(std::numeric_limits<T>::lowest());
          if (v >= static_cast<double>(std::numeric_limits<T>::max())) return static_cast<C>(std::numeric_limits<T>::max());
          return static_cast<C>(s->to_int());
        } else {
          return static_cast<C>(s->to_double());
        }
      };
      const C lo = as_c(lo_s, std::numeric_limits<C>::lowest());
      const C hi = as_c(hi_s, std::numeric_limits<C>::max());
      const bool has_lo = lo_s != nullptr, has_hi = hi_s != nullptr;
      // NaN inputs stay NaN: both comparisons are false for them.
      map_unary<T, T>(k.outputs[0], k.inputs[0], [=](C v) {
        C r = (has_lo && v < lo) ? lo : v;
        return (has_hi && r > hi) ? hi : r;
      });
    }
  });
}

TPU_DEFINE_OP(clamp_op, {.name = "clamp", .num_inputs = 1, .flags = kElementwise, .meta = &clamp_meta,
                         .cpu = &clamp_cpu, .doc = "min(max(x, min), max) with optional scalar bounds"});

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) { return ops::call(where_op(), {cond, a, b}); }
Tensor where(const Tensor& cond, const Tensor& a, Scalar b) {
  return where(cond, a, wrapped_scalar_as(b, scalar_result_type(a, b)));
}
Tensor where(const Tensor& cond, Scalar a, const Tensor& b) {
  return where(cond, wrapped_scalar_as(a, scalar_result_type(b, a)), b);
}

Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  Attrs attrs;
  if (min) attrs.set("min", *min);
  if (max) attrs.set("max", *max);
  return ops::call(clamp_op(), {x}, attrs);
}

}  // namespace tpu
