// Ops with bool outputs: comparisons eq, ne, lt, le, gt, ge (computed in the promoted dtype
// of both inputs, as PyTorch), logical_and/or/xor/not (any input dtype; nonzero is true,
// NaN is true), and isnan.
#include "ops/binary_common.h"

namespace tpu {
namespace {
using namespace ops;
using namespace ops::elementwise;

void compare_meta(const MetaArgs& a, MetaResult& m) {
  broadcast_setup(a, m, result_type(a.inputs), DType::boolean, 0b11);
}

template <class Cmp>
void compare_cpu(const KernelArgs& k) {
  dispatch_dtype(k.inputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    map_binary<T, bool>(k, [](auto x, auto y) { return Cmp{}(x, y); });
  });
}

struct Eq { template <class C> bool operator()(C x, C y) const { return x == y; } };
struct Ne { template <class C> bool operator()(C x, C y) const { return x != y; } };
struct Lt { template <class C> bool operator()(C x, C y) const { return x < y; } };
struct Le { template <class C> bool operator()(C x, C y) const { return x <= y; } };
struct Gt { template <class C> bool operator()(C x, C y) const { return x > y; } };
struct Ge { template <class C> bool operator()(C x, C y) const { return x >= y; } };

void logical_meta(const MetaArgs& a, MetaResult& m) {
  // Every dtype is accepted: the front half converts non-bool inputs to bool (x != 0).
  broadcast_setup(a, m, DType::boolean, DType::boolean, 0b11);
}

template <class F>
void logical_cpu_impl(const KernelArgs& k, F f) {
  cpu::binary_map<bool, bool, bool>(k.outputs[0], k.inputs[0], k.inputs[1], f);
}
void and_cpu(const KernelArgs& k) { logical_cpu_impl(k, [](bool x, bool y) { return x && y; }); }
void or_cpu(const KernelArgs& k) { logical_cpu_impl(k, [](bool x, bool y) { return x || y; }); }
void xor_cpu(const KernelArgs& k) { logical_cpu_impl(k, [](bool x, bool y) { return x != y; }); }

void logical_not_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  m.out() = {x.shape(), DType::boolean, x.device()};
  m.cast_mask = 1;
  m.cast_to = DType::boolean;
}
void logical_not_cpu(const KernelArgs& k) {
  cpu::unary_map<bool, bool>(k.outputs[0], k.inputs[0], [](bool v) { return !v; });
}

void isnan_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  m.out() = {x.shape(), DType::boolean, x.device()};
}
void isnan_cpu(const KernelArgs& k) {
  dispatch_dtype(k.inputs[0].dtype(), [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_same_v<cpu::compute_t<T>, float>)
      map_unary<T, bool>(k.outputs[0], k.inputs[0], [](float v) { return v != v; });
    else
      cpu::unary_map<bool, T>(k.outputs[0], k.inputs[0], [](T) { return false; });
  });
}

#define TPU_COMPARE_OP(var, opname, cmp, what)                                                           \
  TPU_DEFINE_OP(var, {.name = opname, .num_inputs = 2, .flags = kElementwise | kNonDifferentiable,      \
                      .meta = &compare_meta, .cpu = &compare_cpu<cmp>, .doc = what})
TPU_COMPARE_OP(eq_op, "eq", Eq, "a == b (bool), compared in the promoted dtype");
TPU_COMPARE_OP(ne_op, "ne", Ne, "a != b (bool), compared in the promoted dtype");
TPU_COMPARE_OP(lt_op, "lt", Lt, "a < b (bool), compared in the promoted dtype");
TPU_COMPARE_OP(le_op, "le", Le, "a <= b (bool), compared in the promoted dtype");
TPU_COMPARE_OP(gt_op, "gt", Gt, "a > b (bool), compared in the promoted dtype");
TPU_COMPARE_OP(ge_op, "ge", Ge, "a >= b (bool), compared in the promoted dtype");

TPU_DEFINE_OP(logical_and_op, {.name = "logical_and", .num_inputs = 2, .flags = kElementwise | kNonDifferentiable,
                               .meta = &logical_meta, .cpu = &and_cpu, .doc = "a && b (nonzero is true)"});
TPU_DEFINE_OP(logical_or_op, {.name = "logical_or", .num_inputs = 2, .flags = kElementwise | kNonDifferentiable,
                              .meta = &logical_meta, .cpu = &or_cpu, .doc = "a || b (nonzero is true)"});
TPU_DEFINE_OP(logical_xor_op, {.name = "logical_xor", .num_inputs = 2, .flags = kElementwise | kNonDifferentiable,
                               .meta = &logical_meta, .cpu = &xor_cpu, .doc = "a != b as truth values"});
TPU_DEFINE_OP(logical_not_op, {.name = "logical_not", .num_inputs = 1, .flags = kElementwise | kNonDifferentiable,
                               .meta = &logical_not_meta, .cpu = &logical_not_cpu, .doc = "!x (nonzero is true)"});
TPU_DEFINE_OP(isnan_op, {.name = "isnan", .num_inputs = 1, .flags = kElementwise | kNonDifferentiable,
                         .meta = &isnan_meta, .cpu = &isnan_cpu, .doc = "x != x (false for integers)"});

Tensor rhs(const Tensor& a, Scalar b) { return wrapped_scalar_as(b, scalar_result_type(a, b)); }

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return ops::call(eq_op(), {a, b}); }
Tensor ne(const Tensor& a, const Tensor& b) { return ops::call(ne_op(), {a, b}); }
Tensor lt(const Tensor& a, const Tensor& b) { return ops::call(lt_op(), {a, b}); }
Tensor le(const Tensor& a, const Tensor& b) { return ops::call(le_op(), {a, b}); }
Tensor gt(const Tensor& a, const Tensor& b) { return ops::call(gt_op(), {a, b}); }
Tensor ge(const Tensor& a, const Tensor& b) { return ops::call(ge_op(), {a, b}); }
Tensor eq(const Tensor& a, Scalar b) { return eq(a, rhs(a, b)); }
Tensor ne(const Tensor& a, Scalar b) { return ne(a, rhs(a, b)); }
Tensor lt(const Tensor& a, Scalar b) { return lt(a, rhs(a, b)); }
Tensor le(const Tensor& a, Scalar b) { return le(a, rhs(a, b)); }
Tensor gt(const Tensor& a, Scalar b) { return gt(a, rhs(a, b)); }
Tensor ge(const Tensor& a, Scalar b) { return ge(a, rhs(a, b)); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return ops::call(logical_and_op(), {a, b}); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return ops::call(logical_or_op(), {a, b}); }
Tensor logical_xor(const Tensor& a, const Tensor& b) { return ops::call(logical_xor_op(), {a, b}); }
Tensor logical_not(const Tensor& x) { return ops::call(logical_not_op(), {x}); }
Tensor isnan(const Tensor& x) { return ops::call(isnan_op(), {x}); }

}  // namespace tpu
