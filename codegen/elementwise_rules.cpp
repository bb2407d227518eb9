// Lowering rules of the elementwise ops: each appends the op to a VecExpr in terms of the
// chip's vector and transcendental operations. Ops without a rule here (pow, fmod, sign,
// floor/ceil/round, sin/cos, log1p/expm1, integer arithmetic) run through the host fallback.
#include <cmath>

#include "codegen/lowering.h"

namespace tpu::codegen {
namespace {

using sim::Op;
using K = VecRef::Kind;
using Ins = std::span<const VecRef>;

bool alpha_of(const ops::Attrs& a, double& alpha) {
  alpha = 1.0;
  if (const ops::AttrValue* v = a.find("alpha")) alpha = std::get<Scalar>(*v).to_double();
  return true;
}

template <Op O>
bool unary(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = e.op(O, in[0]);
  return true;
}
template <Op O>
bool binary(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = e.op(O, in[0], in[1]);
  return true;
}
// a OP b with the operands swapped (gt, ge from lt, le).
template <Op O>
bool binary_swapped(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = e.op(O, in[1], in[0]);
  return true;
}

bool add_rule(VecExpr& e, Ins in, const ops::Attrs& a, DType, VecRef& out) {
  double al;
  alpha_of(a, al);
  out = al == 1.0 ? e.op(Op::vadd, in[0], in[1]) : e.op(Op::vfma, in[1], VecExpr::imm(float(al)), in[0]);
  return true;
}
bool sub_rule(VecExpr& e, Ins in, const ops::Attrs& a, DType, VecRef& out) {
  double al;
  alpha_of(a, al);
  out = al == 1.0 ? e.op(Op::vsub, in[0], in[1]) : e.op(Op::vfma, in[1], VecExpr::imm(float(-al)), in[0]);
  return true;
}
bool relu_rule(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = e.op(Op::vmax, in[0], VecExpr::imm(0.0f));
  return true;
}
bool sigmoid_rule(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = vec_sigmoid(e, in[0]);
  return true;
}
bool silu_rule(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = vec_silu(e, in[0]);
  return true;
}
bool gelu_rule(VecExpr& e, Ins in, const ops::Attrs& a, DType, VecRef& out) {
  out = vec_gelu(e, in[0], a.get_bool("tanh_approx", false));
  return true;
}
bool ne_rule(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = vec_not(e, e.op(Op::vcmpeq, in[0], in[1]));
  return true;
}
bool isnan_rule(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = vec_not(e, e.op(Op::vcmpeq, in[0], in[0]));
  return true;
}
VecRef nonzero(VecExpr& e, VecRef x) { return vec_not(e, e.op(Op::vcmpeq, x, VecExpr::imm(0.0f))); }
bool logical_not_rule(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = e.op(Op::vcmpeq, in[0], VecExpr::imm(0.0f));
  return true;
}
bool logical_and_rule(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = e.op(Op::vmul, nonzero(e, in[0]), nonzero(e, in[1]));
  return true;
}
bool logical_or_rule(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = e.op(Op::vmax, nonzero(e, in[0]), nonzero(e, in[1]));
  return true;
}
bool logical_xor_rule(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = e.op(Op::vabs, e.op(Op::vsub, nonzero(e, in[0]), nonzero(e, in[1])));
  return true;
}
bool where_rule(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  out = e.op(Op::vsel, in[0], in[1], in[2]);
  return true;
}
bool clamp_rule(VecExpr& e, Ins in, const ops::Attrs& a, DType t, VecRef& out) {
  if (!is_floating(t)) return false;
  VecRef r = in[0];
  for (const char* name : {"min", "max"}) {
    const ops::AttrValue* v = a.find(name);
    if (!v || std::holds_alternative<std::monostate>(*v)) continue;
    const double b = std::get<Scalar>(*v).to_double();
    if (std::isnan(b)) return false;
    r = e.op(name[1] == 'i' ? Op::vmax : Op::vmin, r, VecExpr::imm(float(b)));
  }
  out = r;
  return true;
}
// A cast the user wrote rounds as in eager, even inside a fused kernel: to bf16, and from a
// bf16 value (which, computed in the kernel, may still carry f32 bits: a matmul accumulator).
// A bf16 input read from memory is exact already.
bool cast_rule(VecExpr& e, Ins in, const ops::Attrs& a, DType from, VecRef& out) {
  const DType to = a.get_dtype("dtype");
  if (to == DType::boolean) out = nonzero(e, in[0]);
  else if (to == DType::bf16 || (to == DType::f32 && from == DType::bf16 && in[0].kind == K::temp))
    out = e.round_bf16(in[0]);
  else if (to == DType::f32) out = in[0];
  else return false;
  return true;
}

template <auto F>
const Lowering* ew(bool ints = false) {
  static const Lowering l{.elementwise = F, .int_inputs_ok = ints};
  return &l;
}

void install_elementwise_rules() {
  install_lowering("add", ew<&add_rule>());
  install_lowering("sub", ew<&sub_rule>());
  install_lowering("mul", ew<&binary<Op::vmul>>());
  install_lowering("div", ew<&binary<Op::vdiv>>());
  install_lowering("maximum", ew<&binary<Op::vmax>>());
  install_lowering("minimum", ew<&binary<Op::vmin>>());
  install_lowering("neg", ew<&unary<Op::vneg>>());
  install_lowering("abs", ew<&unary<Op::vabs>>());
  install_lowering("relu", ew<&relu_rule>());
  install_lowering("exp", ew<&unary<Op::vexp>>());
  install_lowering("log", ew<&unary<Op::vlog>>());
  install_lowering("tanh", ew<&unary<Op::vtanh>>());
  install_lowering("erf", ew<&unary<Op::verf>>());
  install_lowering("sqrt", ew<&unary<Op::vsqrt>>());
  install_lowering("rsqrt", ew<&unary<Op::vrsqrt>>());
  install_lowering("reciprocal", ew<&unary<Op::vrecip>>());
  install_lowering("sigmoid", ew<&sigmoid_rule>());
  install_lowering("silu", ew<&silu_rule>());
  install_lowering("gelu", ew<&gelu_rule>());
  install_lowering("eq", ew<&binary<Op::vcmpeq>>());
  install_lowering("ne", ew<&ne_rule>());
  install_lowering("lt", ew<&binary<Op::vcmplt>>());
  install_lowering("le", ew<&binary<Op::vcmple>>());
  install_lowering("gt", ew<&binary_swapped<Op::vcmplt>>());
  install_lowering("ge", ew<&binary_swapped<Op::vcmple>>());
  install_lowering("isnan", ew<&isnan_rule>());
  install_lowering("logical_not", ew<&logical_not_rule>());
  install_lowering("logical_and", ew<&logical_and_rule>());
  install_lowering("logical_or", ew<&logical_or_rule>());
  install_lowering("logical_xor", ew<&logical_xor_rule>());
  install_lowering("where", ew<&where_rule>());
  install_lowering("clamp", ew<&clamp_rule>());
  install_lowering("to_dtype", ew<&cast_rule>(true));
}

[[maybe_unused]] const bool g_elementwise_rules_installed = (install_elementwise_rules(), true);

}  // namespace
}  // namespace tpu::codegen
