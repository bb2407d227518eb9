#include "sim/program.h"

#include <cmath>

#include <fmt/format.h>

#include "sim/assembly.h"
#include "sim/config.h"
#include "sim/error.h"

namespace tpu::sim {
namespace {

constexpr int kMaxRegs = 256;
constexpr int64_t kMaxDim = int64_t(1) << 31;

[[noreturn]] void fail(const Program& p, size_t i, const std::string& why) {
  throw SimError(fmt::format("{}: {}", describe_instr(p, i), why), long(i));
}

bool is_float_storage(DType t) { return t == DType::f32 || t == DType::bf16; }
// The MXU input dtypes of each mode (isa.h, MxuMode): f32 mode takes f32 only; the others take
// f32 / bf16 (converted on the way in) and their own narrow type; bf16 modes widen i8 and e4m3.
bool mxu_input_fits(MxuMode m, DType t) {
  switch (m) {
    case MxuMode::f32: return t == DType::f32;
    case MxuMode::i8: return t == DType::i8 || is_float_storage(t);
    case MxuMode::fp8: return t == DType::f8e4m3 || is_float_storage(t);
    case MxuMode::bf16:
    case MxuMode::bf16x3: return t == DType::i8 || t == DType::f8e4m3 || is_float_storage(t);
  }
  return false;
}

void check_addr(const Program& p, size_t i, const Addr& a, const char* role) {
  for (const auto& t : a.terms)
    if (t.reg < -1 || t.reg >= kMaxRegs) fail(p, i, fmt::format("operand '{}' uses an invalid register r{}", role, t.reg));
}

// Checks a memory operand and fills its default row stride.
void check_mem(const Program& p, size_t i, Operand& o, Role role, const char* name, bool vmem_only, bool allow_imm) {
  const Instr& in = p.code[i];
  if (o.kind == Operand::Kind::none) fail(p, i, fmt::format("missing operand '{}'", name));
  if (o.kind == Operand::Kind::imm) {
    if (!allow_imm) fail(p, i, fmt::format("operand '{}' must be a memory operand, not an immediate", name));
    return;
  }
  if (vmem_only && o.space != Space::vmem) fail(p, i, fmt::format("operand '{}' must be in vmem", name));
  check_addr(p, i, o.addr, name);
  auto shape = operand_shape(in, role);
  if (o.row_stride == -1) o.row_stride = shape[1];
  if (o.row_stride < 0 || o.col_stride < 0)
    fail(p, i, fmt::format("operand '{}' has a negative stride", name));
}

void check_shape(const Program& p, size_t i, int64_t r, int64_t c) {
  if (r < 1 || c < 1 || r > kMaxDim || c > kMaxDim || r * c > (int64_t(1) << 40))
    fail(p, i, fmt::format("invalid shape [{}, {}]", r, c));
}

void check_one(Program& p, size_t i) {
  Instr& in = p.code[i];
  const OpInfo& info = op_info(in.op);
  if (size_t(in.op) >= size_t(Op::count_)) fail(p, i, "invalid opcode");
  switch (info.format) {
    case Format::none:
      break;
    case Format::sset:
      if (in.reg < 0 || in.reg >= kMaxRegs) fail(p, i, "invalid destination register");
      break;
    case Format::sadd:
      if (in.reg < 0 || in.reg >= kMaxRegs || in.reg_a < 0 || in.reg_a >= kMaxRegs) fail(p, i, "invalid register");
      if (in.op == Op::smod && in.imm <= 0) fail(p, i, "smod needs a positive modulus");
      break;
    case Format::loop:
      if (in.reg < 0 || in.reg >= kMaxRegs) fail(p, i, "invalid loop register");
      if (in.imm < 0) fail(p, i, "loop trip count must be >= 0");
      break;
    case Format::loopr:
      if (in.reg < 0 || in.reg >= kMaxRegs || in.reg_a < 0 || in.reg_a >= kMaxRegs || in.reg == in.reg_a)
        fail(p, i, "loopr needs a loop register and a different trip-count register");
      break;
    case Format::sld:
      if (in.reg < 0 || in.reg >= kMaxRegs) fail(p, i, "invalid destination register");
      if (in.a.kind != Operand::Kind::mem) fail(p, i, "sld needs a memory operand src");
      check_addr(p, i, in.a.addr, "src");
      break;
    case Format::sem:
      if (in.sem < 0) fail(p, i, "missing semaphore");
      if (in.imm < 1) fail(p, i, "semaphore amount must be >= 1");
      break;
    case Format::dma: {
      if (in.dst.kind != Operand::Kind::mem || in.a.kind != Operand::Kind::mem)
        fail(p, i, "dma needs memory operands dst and src");
      check_addr(p, i, in.dst.addr, "dst");
      check_addr(p, i, in.a.addr, "src");
      for (auto d : in.dma_shape)
        if (d < 1 || d > kMaxDim) fail(p, i, fmt::format("invalid dma shape entry {}", d));
      auto fill = [&](std::array<int64_t, 2>& s) {
        if (s[1] == -1) s[1] = in.dma_shape[2];
        if (s[0] == -1) s[0] = in.dma_shape[1] * s[1];
        if (s[0] < 0 || s[1] < 0) fail(p, i, "negative dma stride");
      };
      fill(in.dst_stride);
      fill(in.src_stride);
      if (in.unit < 0) fail(p, i, "invalid dma queue");
      if (in.sem < -1) fail(p, i, "invalid semaphore");
      break;
    }
    case Format::mxu_lw: {
      check_shape(p, i, in.rows, in.cols);
      check_mem(p, i, in.a, Role::a, "w", true, false);
      if (!mxu_input_fits(in.mode, in.a.dtype))
        fail(p, i, fmt::format("weights of dtype {} do not fit mode {}", dtype_name(in.a.dtype), mxu_mode_name(in.mode)));
      if (in.unit < 0) fail(p, i, "invalid mxu index");
      break;
    }
    case Format::mxu_mm: {
      check_shape(p, i, in.rows, in.cols);
      check_shape(p, i, in.k, 1);
      check_mem(p, i, in.a, Role::a, "lhs", true, false);
      check_mem(p, i, in.dst, Role::dst, "out", true, false);
      if (!mxu_input_fits(in.mode, in.a.dtype))
        fail(p, i, fmt::format("lhs of dtype {} does not fit mode {}", dtype_name(in.a.dtype), mxu_mode_name(in.mode)));
      const bool out_ok = in.dst.dtype == DType::f32 || (in.mode == MxuMode::i8 && in.dst.dtype == DType::i32);
      if (!out_ok)
        fail(p, i, fmt::format("out must be {} in mode {}", in.mode == MxuMode::i8 ? "i32 or f32" : "f32", mxu_mode_name(in.mode)));
      if (in.unit < 0) fail(p, i, "invalid mxu index");
      break;
    }
    case Format::vbinary:
    case Format::vternary:
    case Format::vunary:
    case Format::vfill: {
      check_shape(p, i, in.rows, in.cols);
      check_mem(p, i, in.dst, Role::dst, "dst", true, false);
      if (info.format != Format::vfill) check_mem(p, i, in.a, Role::a, "a", true, true);
      if (info.format == Format::vbinary || info.format == Format::vternary) check_mem(p, i, in.b, Role::b, "b", true, true);
      if (info.format == Format::vternary) check_mem(p, i, in.c, Role::c, "c", true, true);
      if (is_int_vector_op(in.op)) {
        for (const Operand* o : {&in.dst, &in.a, &in.b})
          if (o->kind == Operand::Kind::mem && o->dtype != DType::i32)
            fail(p, i, "integer vector ops work on i32 operands");
        const bool shift = in.op == Op::vshl || in.op == Op::vshrl || in.op == Op::vshra;
        for (const Operand* o : {&in.a, &in.b}) {
          if (o->kind != Operand::Kind::imm) continue;
          const double v = o->imm;
          if (!(v >= -2147483648.0 && v < 2147483648.0) || v != std::trunc(v))
            fail(p, i, fmt::format("integer vector op immediate {} is not a 32-bit integer", o->imm));
          if (shift && o == &in.b && (v < 0 || v > 31))
            fail(p, i, fmt::format("shift count {} is outside 0..31", o->imm));
        }
      } else if (in.op != Op::vcast) {
        for (const Operand* o : {&in.dst, &in.a, &in.b, &in.c})
          if (o->kind == Operand::Kind::mem && !is_float_storage(o->dtype))
            fail(p, i, "vector arithmetic works on f32 or bf16 operands (use vcast for integers)");
      }
      break;
    }
    case Format::xreduce:
    case Format::xtrans: {
      check_shape(p, i, in.rows, in.cols);
      if (info.format == Format::xreduce && in.axis != 0 && in.axis != 1) fail(p, i, "axis must be 0 or 1");
      check_mem(p, i, in.a, Role::a, "a", true, false);
      check_mem(p, i, in.dst, Role::dst, "dst", true, false);
      for (const Operand* o : {&in.dst, &in.a})
        if (!is_float_storage(o->dtype) && !(info.format == Format::xtrans && o->dtype == in.a.dtype))
          fail(p, i, "cross-lane ops work on f32 or bf16 operands");
      break;
    }
  }
}

}  // namespace

std::string describe_instr(const Program& p, size_t index) {
  if (index >= p.code.size()) return fmt::format("instruction #{}", index);
  return fmt::format("instruction #{} ({})", index, format_instr(p.code[index]));
}

void Program::finalize() {
  if (!cores.empty()) {
    if (!code.empty())
      throw SimError(fmt::format("program '{}' has both code ({} instructions) and {} megacore parts: a megacore "
                                 "program keeps its code in its parts", name, code.size(), cores.size()));
    for (size_t c = 0; c < cores.size(); ++c) {
      if (cores[c].megacore()) throw SimError(fmt::format("program '{}': megacore part {} has parts of its own", name, c));
      try {
        cores[c].finalize();
      } catch (const SimError& e) {
        throw SimError(fmt::format("program '{}', core {}: {}", name, c, e.what()), e.instr_index());
      }
    }
    finalized = true;
    return;
  }
  std::vector<size_t> open;
  for (size_t i = 0; i < code.size(); ++i) {
    check_one(*this, i);
    if (code[i].op == Op::loop || code[i].op == Op::loopr) {
      open.push_back(i);
    } else if (code[i].op == Op::endloop) {
      if (open.empty()) fail(*this, i, "endloop without a matching loop");
      code[i].match = int32_t(open.back());
      code[open.back()].match = int32_t(i);
      open.pop_back();
    }
  }
  if (!open.empty()) fail(*this, open.back(), "loop without a matching endloop");
  finalized = true;
}

void Program::check_against(const ChipConfig& cfg) const {
  if (!cores.empty()) {
    if (int(cores.size()) > cfg.timing.megacore)
      throw SimError(fmt::format("program '{}' has parts for {} TensorCores but chip '{}' drives {} as one device "
                                 "(timing.megacore)", name, cores.size(), cfg.name, cfg.timing.megacore));
    for (size_t c = 0; c < cores.size(); ++c) {
      try {
        cores[c].check_against(cfg);
      } catch (const SimError& e) {
        throw SimError(fmt::format("program '{}', core {}: {}", name, c, e.what()), e.instr_index());
      }
    }
    return;
  }
  auto reg_ok = [&](int r) { return r < cfg.scalar.registers; };
  for (size_t i = 0; i < code.size(); ++i) {
    const Instr& in = code[i];
    if (in.reg >= 0 && !reg_ok(in.reg)) fail(*this, i, fmt::format("register r{} >= {} registers", in.reg, cfg.scalar.registers));
    if (in.reg_a >= 0 && !reg_ok(in.reg_a)) fail(*this, i, fmt::format("register r{} >= {} registers", in.reg_a, cfg.scalar.registers));
    for (const Operand* o : {&in.dst, &in.a, &in.b, &in.c})
      if (o->kind == Operand::Kind::mem)
        for (const auto& t : o->addr.terms)
          if (t.reg >= 0 && !reg_ok(t.reg)) fail(*this, i, fmt::format("register r{} >= {} registers", t.reg, cfg.scalar.registers));
    if (in.sem >= cfg.scalar.semaphores) fail(*this, i, fmt::format("semaphore {} >= {} semaphores", in.sem, cfg.scalar.semaphores));
    const Format f = op_info(in.op).format;
    if (f == Format::dma && in.unit >= cfg.dma.engines) fail(*this, i, fmt::format("dma queue {} >= {} engines", in.unit, cfg.dma.engines));
    if (f == Format::mxu_lw || f == Format::mxu_mm) {
      if (in.unit >= cfg.mxu.count) fail(*this, i, fmt::format("mxu {} >= {} MXUs", in.unit, cfg.mxu.count));
      int64_t kk = f == Format::mxu_lw ? in.rows : in.k;
      if (kk > cfg.mxu.rows) fail(*this, i, fmt::format("k={} exceeds the MXU's {} rows", kk, cfg.mxu.rows));
      if (in.cols > cfg.mxu.cols) fail(*this, i, fmt::format("n={} exceeds the MXU's {} columns", in.cols, cfg.mxu.cols));
    }
  }
}

}  // namespace tpu::sim
