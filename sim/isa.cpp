#include "sim/isa.h"

#include <cstring>

namespace tpu::sim {
namespace {

using U = UnitKind;
using F = Format;

constexpr OpInfo kOps[] = {
    {"nop", U::scalar, F::none},       {"halt", U::scalar, F::none},
    {"sset", U::scalar, F::sset},      {"sadd", U::scalar, F::sadd},
    {"smul", U::scalar, F::sadd},      {"smod", U::scalar, F::sadd},
    {"loop", U::scalar, F::loop},      {"endloop", U::scalar, F::none},
    {"wait", U::scalar, F::sem},       {"signal", U::scalar, F::sem},
    {"fence", U::scalar, F::none},     {"dma", U::dma, F::dma},
    {"mxu.lw", U::mxu_weights, F::mxu_lw}, {"mxu.mm", U::mxu, F::mxu_mm},
    {"vadd", U::vpu, F::vbinary},      {"vsub", U::vpu, F::vbinary},
    {"vmul", U::vpu, F::vbinary},      {"vdiv", U::vpu, F::vbinary},
    {"vmax", U::vpu, F::vbinary},      {"vmin", U::vpu, F::vbinary},
    {"vcmplt", U::vpu, F::vbinary},    {"vcmple", U::vpu, F::vbinary},
    {"vcmpeq", U::vpu, F::vbinary},    {"vfma", U::vpu, F::vternary},
    {"vsel", U::vpu, F::vternary},     {"vmov", U::vpu, F::vunary},
    {"vneg", U::vpu, F::vunary},       {"vabs", U::vpu, F::vunary},
    {"vfill", U::vpu, F::vfill},       {"vcast", U::vpu, F::vunary},
    {"vexp", U::eup, F::vunary},       {"vlog", U::eup, F::vunary},
    {"vtanh", U::eup, F::vunary},      {"vrsqrt", U::eup, F::vunary},
    {"vrecip", U::eup, F::vunary},     {"verf", U::eup, F::vunary},
    {"vsqrt", U::eup, F::vunary},      {"xsum", U::xlu, F::xreduce},
    {"xmax", U::xlu, F::xreduce},      {"xtrans", U::xlu, F::xtrans},
    {"sld", U::scalar, F::sld},        {"loopr", U::scalar, F::loopr},
    {"vand", U::vpu, F::vbinary},      {"vor", U::vpu, F::vbinary},
    {"vxor", U::vpu, F::vbinary},      {"vshl", U::vpu, F::vbinary},
    {"vshrl", U::vpu, F::vbinary},     {"vshra", U::vpu, F::vbinary},
};
static_assert(sizeof(kOps) / sizeof(kOps[0]) == size_t(Op::count_), "op table out of sync with Op");

bool float_bits_equal(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

bool is_int_vector_op(Op op) {
  switch (op) {
    case Op::vand: case Op::vor: case Op::vxor: case Op::vshl: case Op::vshrl: case Op::vshra: return true;
    default: return false;
  }
}

const OpInfo& op_info(Op op) { return kOps[size_t(op) < size_t(Op::count_) ? size_t(op) : 0]; }

std::optional<Op> op_from_name(std::string_view name) {
  for (size_t i = 0; i < size_t(Op::count_); ++i)
    if (kOps[i].name == name) return Op(i);
  return std::nullopt;
}

std::string_view mxu_mode_name(MxuMode m) {
  switch (m) {
    case MxuMode::bf16: return "bf16";
    case MxuMode::f32: return "f32";
    case MxuMode::i8: return "i8";
    case MxuMode::bf16x3: return "bf16x3";
    case MxuMode::fp8: return "fp8";
  }
  return "?";
}
std::optional<MxuMode> parse_mxu_mode(std::string_view s) {
  if (s == "bf16") return MxuMode::bf16;
  if (s == "f32") return MxuMode::f32;
  if (s == "i8") return MxuMode::i8;
  if (s == "bf16x3") return MxuMode::bf16x3;
  if (s == "fp8") return MxuMode::fp8;
  return std::nullopt;
}

bool Operand::operator==(const Operand& o) const {
  if (kind != o.kind) return false;
  if (kind == Kind::none) return true;
  if (kind == Kind::imm) return float_bits_equal(imm, o.imm);
  return space == o.space && dtype == o.dtype && addr == o.addr && row_stride == o.row_stride &&
         col_stride == o.col_stride;
}

bool Instr::operator==(const Instr& o) const {
  return op == o.op && unit == o.unit && sem == o.sem && reg == o.reg && reg_a == o.reg_a && imm == o.imm &&
         float_bits_equal(fimm, o.fimm) && dst == o.dst && a == o.a && b == o.b && c == o.c && rows == o.rows &&
         cols == o.cols && k == o.k && axis == o.axis && mode == o.mode && acc == o.acc &&
         dma_shape == o.dma_shape && dst_stride == o.dst_stride && src_stride == o.src_stride;
}

std::array<int64_t, 2> operand_shape(const Instr& in, Role r) {
  const Format f = op_info(in.op).format;
  switch (f) {
    case Format::mxu_lw:
      return r == Role::a ? std::array<int64_t, 2>{in.rows, in.cols} : std::array<int64_t, 2>{0, 0};
    case Format::mxu_mm:
      if (r == Role::a) return {in.rows, in.k};
      if (r == Role::dst) return {in.rows, in.cols};
      return {0, 0};
    case Format::vbinary:
      return r == Role::c ? std::array<int64_t, 2>{0, 0} : std::array<int64_t, 2>{in.rows, in.cols};
    case Format::vternary:
      return {in.rows, in.cols};
    case Format::vunary:
    case Format::vfill:
      return (r == Role::dst || (r == Role::a && f == Format::vunary)) ? std::array<int64_t, 2>{in.rows, in.cols}
                                                                        : std::array<int64_t, 2>{0, 0};
    case Format::xreduce:
      if (r == Role::a) return {in.rows, in.cols};
      if (r == Role::dst) return in.axis == 1 ? std::array<int64_t, 2>{in.rows, 1} : std::array<int64_t, 2>{1, in.cols};
      return {0, 0};
    case Format::xtrans:
      if (r == Role::a) return {in.rows, in.cols};
      if (r == Role::dst) return {in.cols, in.rows};
      return {0, 0};
    default:
      return {0, 0};
  }
}

}  // namespace tpu::sim
