// Lowering rules of the elementwise ops: each appends the op to a VecExpr in terms of the
// chip's vector and transcendental operations. Ops without a rule here (pow, fmod, sign,
// floor/ceil/round, sin/cos, log1p/expm1, integer arithmetic) run through the host fallback.
//
// The cast of a contiguous i64 tensor to f32 (top-k's expert ids turned into float weights'
// operands) has its own program: the i64 words come in as pairs of i32 (low, high), and the
// value is (high + [low < 0]) * 2^32 + low in one fused multiply-add, so every value of i32's
// range is converted exactly as the host does (one rounding); beyond it the low word's own
// rounding to f32 makes a second one (within one f32 ulp of the host's result). The cast of f32
// to i32 (truncation toward zero, the chip's vcast rounds to nearest) has one too, and so has
// i64 to i32 (the low words: the host's conversion wraps the same way).
#include <fmt/format.h>

#include <cmath>

#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "sim/builder.h"

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
// expm1 without the cancellation of exp(x) - 1 near 0 (Kahan's form): where |x| < 0.5,
// (u - 1) x / log(u) with u = exp(x) (x itself where u rounds to 1); elsewhere u - 1, whose
// relative error is a few ulps there (and which gives inf, -1 and NaN at the ends).
bool expm1_rule(VecExpr& e, Ins in, const ops::Attrs&, DType, VecRef& out) {
  const VecRef x = in[0];
  const VecRef u = e.op(Op::vexp, x);
  const VecRef um1 = e.op(Op::vsub, u, VecExpr::imm(1.0f));
  const VecRef kahan = e.op(Op::vmul, um1, e.op(Op::vdiv, x, e.op(Op::vlog, u)));
  const VecRef near = e.op(Op::vsel, e.op(Op::vcmpeq, u, VecExpr::imm(1.0f)), x, kahan);
  out = e.op(Op::vsel, e.op(Op::vcmplt, e.op(Op::vabs, x), VecExpr::imm(0.5f)), near, um1);
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

// The cast programs share one frame: r0 in, r1 out, r2 full tiles of kCastRows x kCastCols, r3
// rows of kCastCols after them, r4 single elements after those. Each chunk of `in_bytes`-wide
// values is copied to VMEM address 0, converted by `convert(b, rows, cols)` (which returns the
// VMEM address of its 4-byte results) and copied out.
constexpr int64_t kCastRows = 16, kCastCols = 128;
constexpr int64_t kCastTile = kCastRows * kCastCols;

template <class Convert>
sim::Program make_cast_program(const char* name, int64_t in_bytes, Convert convert) {
  using B = sim::ProgramBuilder;
  enum { rIn = 0, rOut, rTiles, rRows, rElems, rI, rOffIn, rOffOut };
  B b(name);
  auto chunk = [&](int64_t rows, int64_t cols) {
    b.dma(B::vmem_at(B::at(0)), B::hbm_at(B::at(0, {{rIn, 1}, {rOffIn, 1}})),
          {.rows = 1, .row_bytes = rows * cols * in_bytes}, 0, 0);
    b.wait(0);
    const int64_t result = convert(b, rows, cols);
    b.dma(B::hbm_at(B::at(0, {{rOut, 1}, {rOffOut, 1}})), B::vmem_at(B::at(result)),
          {.rows = 1, .row_bytes = rows * cols * 4}, 0, 0);
    b.wait(0);
  };
  auto run = [&](int count_reg, int64_t rows, int64_t cols) {
    b.loop_reg(rI, count_reg);
    chunk(rows, cols);
    b.sadd(rOffIn, rOffIn, rows * cols * in_bytes);
    b.sadd(rOffOut, rOffOut, rows * cols * 4);
    b.end_loop();
  };
  b.sset(rOffIn, 0);
  b.sset(rOffOut, 0);
  run(rTiles, kCastRows, kCastCols);
  run(rRows, 1, kCastCols);
  run(rElems, 1, 1);
  b.fence();
  return b.finish();
}

// i64 -> f32: the low word (as unsigned: plus 2^32 where it reads negative) plus 2^32 times the
// high word.
sim::Program make_i64_cast_program() {
  using B = sim::ProgramBuilder;
  const int64_t lo = kCastTile * 8, hi = lo + kCastTile * 4, neg = hi + kCastTile * 4;
  return make_cast_program("cast_i64_f32", 8, [&](B& b, int64_t rows, int64_t cols) {
    const auto f = [&](int64_t a) { return B::vmem(B::at(a), sim::DType::f32, cols); };
    b.unary(sim::Op::vcast, f(lo), B::vmem(B::at(0), sim::DType::i32, 2 * cols, 2), rows, cols);
    b.unary(sim::Op::vcast, f(hi), B::vmem(B::at(4), sim::DType::i32, 2 * cols, 2), rows, cols);
    b.binary(sim::Op::vcmplt, f(neg), f(lo), B::imm(0.0f), rows, cols);
    b.binary(sim::Op::vadd, f(hi), f(hi), f(neg), rows, cols);
    b.ternary(sim::Op::vfma, f(lo), f(hi), B::imm(4294967296.0f), f(lo), rows, cols);
    return lo;
  });
}

// f32 -> i32 (C++ and PyTorch truncate toward zero; the chip's vcast rounds to nearest even):
// r = vcast(vcast(x)) is x rounded to an integer in f32, and where |r| > |x| it went one away
// from zero, so r - sign(r) is the truncation. Beyond i32's range vcast saturates.
sim::Program make_f32_i32_cast_program() {
  using B = sim::ProgramBuilder;
  using sim::Op;
  const int64_t x = 0, ri = kCastTile * 4, r = 2 * kCastTile * 4, c = 3 * kCastTile * 4, p = 4 * kCastTile * 4,
                q = 5 * kCastTile * 4;
  return make_cast_program("cast_f32_i32", 4, [&](B& b, int64_t rows, int64_t cols) {
    const auto f = [&](int64_t a) { return B::vmem(B::at(a), sim::DType::f32, cols); };
    const auto i = B::vmem(B::at(ri), sim::DType::i32, cols);
    b.unary(Op::vcast, i, f(x), rows, cols);                     // round to nearest even (saturating)
    b.unary(Op::vcast, f(r), i, rows, cols);                     // back to f32: exact
    b.unary(Op::vabs, f(c), f(x), rows, cols);
    b.unary(Op::vabs, f(p), f(r), rows, cols);
    b.binary(Op::vcmplt, f(c), f(c), f(p), rows, cols);          // 1 where |x| < |r|
    b.binary(Op::vcmplt, f(p), B::imm(0.0f), f(r), rows, cols);  // r > 0
    b.binary(Op::vcmplt, f(q), f(r), B::imm(0.0f), rows, cols);  // r < 0
    b.binary(Op::vsub, f(p), f(p), f(q), rows, cols);            // sign(r)
    b.binary(Op::vmul, f(c), f(c), f(p), rows, cols);
    b.binary(Op::vsub, f(r), f(r), f(c), rows, cols);            // toward zero by one where rounded away
    b.unary(Op::vcast, i, f(r), rows, cols);                     // an integer: exact
    return ri;
  });
}

// i64 -> i32 (the low words, as the host's conversion wraps): the words at even positions moved
// to a dense buffer by one vcast (i32 to i32: exact).
sim::Program make_i64_i32_cast_program() {
  using B = sim::ProgramBuilder;
  const int64_t lo = kCastTile * 8;
  return make_cast_program("cast_i64_i32", 8, [&](B& b, int64_t rows, int64_t cols) {
    b.unary(sim::Op::vcast, B::vmem(B::at(lo), sim::DType::i32, cols), B::vmem(B::at(0), sim::DType::i32, 2 * cols, 2),
            rows, cols);
    return lo;
  });
}

bool cast_rule(VecExpr& e, Ins in, const ops::Attrs& a, DType from, VecRef& out);
const Lowering& cast_lowering();

// Runs one of the cast programs over contiguous x into contiguous out.
void launch_cast(const Tensor& x, const Tensor& out, const char* name, sim::Program (*make)()) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const Device dev = out.device();
  const LoadedProgram& p = cached_program(dev, fmt::format("{}:{}x{}", name, kCastRows, kCastCols), make);
  launch(dev, p, "to_dtype", {hbm_address(x), hbm_address(out), n / kCastTile, (n % kCastTile) / kCastCols,
                              n % kCastCols});
}

bool cast_eager(const ops::KernelArgs& k) {
  const Tensor& x = k.inputs[0];
  const Tensor& out = k.outputs[0];
  if (x.dtype() == DType::f32 && out.dtype() == DType::i32) {
    // The integer indices an f32 index computation ends in; a view is gathered on the device first.
    if (!out.is_contiguous()) return false;
    launch_cast(x.contiguous(), out, "cast_f32_i32", &make_f32_i32_cast_program);
    return true;
  }
  if (x.dtype() != DType::i64) return eager_elementwise(k, cast_lowering());
  const bool to_i32 = out.dtype() == DType::i32;
  if ((out.dtype() != DType::f32 && !to_i32) || !x.is_contiguous() || !out.is_contiguous()) return false;
  if (to_i32) launch_cast(x, out, "cast_i64_i32", &make_i64_i32_cast_program);
  else launch_cast(x, out, "cast_i64_f32", &make_i64_cast_program);
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
  install_lowering("expm1", ew<&expm1_rule>());
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
  install_lowering("to_dtype", &cast_lowering());
}

const Lowering& cast_lowering() {
  static const Lowering l{.elementwise = &cast_rule, .int_inputs_ok = true, .eager = &cast_eager};
  return l;
}

[[maybe_unused]] const bool g_elementwise_rules_installed = (install_elementwise_rules(), true);

}  // namespace
}  // namespace tpu::codegen
