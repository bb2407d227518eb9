#include "sim/builder.h"

#include <fmt/format.h>

#include "sim/error.h"

namespace tpu::sim {

ProgramBuilder::ProgramBuilder(std::string name) { prog_.name = std::move(name); }

Addr ProgramBuilder::at(int64_t offset, std::initializer_list<AddrTerm> terms) {
  Addr a;
  a.offset = offset;
  if (terms.size() > a.terms.size()) throw SimError("an address may use at most 3 registers");
  size_t i = 0;
  for (const auto& t : terms) a.terms[i++] = t;
  return a;
}

Operand ProgramBuilder::vmem(Addr a, DType t, int64_t row_stride, int64_t col_stride) {
  Operand o;
  o.kind = Operand::Kind::mem;
  o.space = Space::vmem;
  o.dtype = t;
  o.addr = a;
  o.row_stride = row_stride;
  o.col_stride = col_stride;
  return o;
}
Operand ProgramBuilder::vmem_at(Addr a) { return vmem(a, DType::f32); }
Operand ProgramBuilder::hbm_at(Addr a) {
  Operand o = vmem(a, DType::f32);
  o.space = Space::hbm;
  return o;
}
Operand ProgramBuilder::imm(float v) {
  Operand o;
  o.kind = Operand::Kind::imm;
  o.imm = v;
  return o;
}

size_t ProgramBuilder::emit(const Instr& in) {
  prog_.code.push_back(in);
  prog_.finalized = false;
  return prog_.code.size() - 1;
}

namespace {
Instr make(Op op) {
  Instr in;
  in.op = op;
  return in;
}
}  // namespace

size_t ProgramBuilder::nop() { return emit(make(Op::nop)); }
size_t ProgramBuilder::halt() { return emit(make(Op::halt)); }
size_t ProgramBuilder::fence() { return emit(make(Op::fence)); }
size_t ProgramBuilder::end_loop() { return emit(make(Op::endloop)); }

size_t ProgramBuilder::sset(int reg, int64_t value) {
  Instr in = make(Op::sset);
  in.reg = reg;
  in.imm = value;
  return emit(in);
}
size_t ProgramBuilder::sadd(int reg, int src, int64_t value) {
  Instr in = make(Op::sadd);
  in.reg = reg;
  in.reg_a = src;
  in.imm = value;
  return emit(in);
}
size_t ProgramBuilder::smul(int reg, int src, int64_t value) {
  Instr in = make(Op::smul);
  in.reg = reg;
  in.reg_a = src;
  in.imm = value;
  return emit(in);
}
size_t ProgramBuilder::smod(int reg, int src, int64_t value) {
  Instr in = make(Op::smod);
  in.reg = reg;
  in.reg_a = src;
  in.imm = value;
  return emit(in);
}
size_t ProgramBuilder::loop(int reg, int64_t n) {
  Instr in = make(Op::loop);
  in.reg = reg;
  in.imm = n;
  return emit(in);
}
size_t ProgramBuilder::loop_reg(int reg, int count_reg) {
  Instr in = make(Op::loopr);
  in.reg = reg;
  in.reg_a = count_reg;
  return emit(in);
}
size_t ProgramBuilder::sload(int reg, const Operand& src) {
  Instr in = make(Op::sld);
  in.reg = reg;
  in.a = src;
  return emit(in);
}
size_t ProgramBuilder::wait(int sem, int64_t amount) {
  Instr in = make(Op::wait);
  in.sem = sem;
  in.imm = amount;
  return emit(in);
}
size_t ProgramBuilder::signal(int sem, int64_t amount) {
  Instr in = make(Op::signal);
  in.sem = sem;
  in.imm = amount;
  return emit(in);
}

size_t ProgramBuilder::dma(const Operand& dst, const Operand& src, const DmaShape& s, int queue, int sem) {
  Instr in = make(Op::dma);
  in.dst = dst;
  in.a = src;
  in.dst.row_stride = in.a.row_stride = -1;
  in.dst.col_stride = in.a.col_stride = 1;
  in.dst.dtype = in.a.dtype = DType::f32;
  in.dma_shape = {s.planes, s.rows, s.row_bytes};
  in.dst_stride = {s.dst_plane_stride, s.dst_row_stride};
  in.src_stride = {s.src_plane_stride, s.src_row_stride};
  in.unit = queue;
  in.sem = sem;
  return emit(in);
}

size_t ProgramBuilder::mxu_load_weights(int mxu, const Operand& w, int64_t k, int64_t n, MxuMode mode) {
  Instr in = make(Op::mxu_lw);
  in.unit = mxu;
  in.a = w;
  in.rows = k;
  in.cols = n;
  in.mode = mode;
  return emit(in);
}

size_t ProgramBuilder::mxu_matmul(int mxu, const Operand& out, const Operand& lhs, int64_t m, int64_t k, int64_t n,
                                  bool accumulate, MxuMode mode) {
  Instr in = make(Op::mxu_mm);
  in.unit = mxu;
  in.dst = out;
  in.a = lhs;
  in.rows = m;
  in.k = k;
  in.cols = n;
  in.acc = accumulate;
  in.mode = mode;
  return emit(in);
}

size_t ProgramBuilder::binary(Op op, const Operand& dst, const Operand& a, const Operand& b, int64_t rows,
                              int64_t cols) {
  if (op_info(op).format != Format::vbinary)
    throw SimError(fmt::format("ProgramBuilder::binary: '{}' is not a binary vector op", op_info(op).name));
  Instr in = make(op);
  in.dst = dst;
  in.a = a;
  in.b = b;
  in.rows = rows;
  in.cols = cols;
  return emit(in);
}

size_t ProgramBuilder::ternary(Op op, const Operand& dst, const Operand& a, const Operand& b, const Operand& c,
                               int64_t rows, int64_t cols) {
  if (op_info(op).format != Format::vternary)
    throw SimError(fmt::format("ProgramBuilder::ternary: '{}' is not a ternary vector op", op_info(op).name));
  Instr in = make(op);
  in.dst = dst;
  in.a = a;
  in.b = b;
  in.c = c;
  in.rows = rows;
  in.cols = cols;
  return emit(in);
}

size_t ProgramBuilder::unary(Op op, const Operand& dst, const Operand& a, int64_t rows, int64_t cols) {
  if (op_info(op).format != Format::vunary)
    throw SimError(fmt::format("ProgramBuilder::unary: '{}' is not a unary vector op", op_info(op).name));
  Instr in = make(op);
  in.dst = dst;
  in.a = a;
  in.rows = rows;
  in.cols = cols;
  return emit(in);
}

size_t ProgramBuilder::fill(const Operand& dst, float value, int64_t rows, int64_t cols) {
  Instr in = make(Op::vfill);
  in.dst = dst;
  in.fimm = value;
  in.rows = rows;
  in.cols = cols;
  return emit(in);
}

size_t ProgramBuilder::reduce(Op op, const Operand& dst, const Operand& a, int64_t rows, int64_t cols, int axis) {
  if (op_info(op).format != Format::xreduce)
    throw SimError(fmt::format("ProgramBuilder::reduce: '{}' is not a reduction", op_info(op).name));
  Instr in = make(op);
  in.dst = dst;
  in.a = a;
  in.rows = rows;
  in.cols = cols;
  in.axis = axis;
  return emit(in);
}

size_t ProgramBuilder::transpose(const Operand& dst, const Operand& a, int64_t rows, int64_t cols) {
  Instr in = make(Op::xtrans);
  in.dst = dst;
  in.a = a;
  in.rows = rows;
  in.cols = cols;
  return emit(in);
}

Program ProgramBuilder::finish() {
  prog_.finalize();
  return prog_;
}

}  // namespace tpu::sim
