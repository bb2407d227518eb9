#include "codegen/tile_loops.h"

namespace tpu::codegen {

sim::Addr TilePos::addr(int base_reg, int64_t offset, int64_t ld, int64_t es, bool use_rows, bool use_cols) const {
  sim::Addr a;
  a.offset = offset + ((use_rows ? row0 * ld : 0) + (use_cols ? col0 : 0)) * es;
  int t = 0;
  if (base_reg >= 0) a.terms[size_t(t++)] = {int16_t(base_reg), 1};
  if (use_rows && row_reg >= 0) a.terms[size_t(t++)] = {int16_t(row_reg), tile_rows * ld * es};
  if (use_cols && col_reg >= 0) a.terms[size_t(t++)] = {int16_t(col_reg), tile_cols * es};
  return a;
}

void emit_tile_loops(sim::ProgramBuilder& b, int64_t rows, int64_t cols, int64_t tr, int64_t tc, int row_reg,
                     int col_reg, const std::function<void(const TilePos&)>& body) {
  const int64_t nr = rows / tr, rr = rows % tr, nc = cols / tc, rc = cols % tc;
  auto col_part = [&](TilePos p) {
    p.tile_cols = tc;
    if (nc > 0) {
      TilePos q = p;
      q.cols = tc;
      if (nc > 1) {
        b.loop(col_reg, nc);
        q.col_reg = col_reg;
        body(q);
        b.end_loop();
      } else {
        body(q);
      }
    }
    if (rc > 0) {
      TilePos q = p;
      q.cols = rc;
      q.col0 = nc * tc;
      body(q);
    }
  };
  TilePos p;
  p.tile_rows = tr;
  if (nr > 0) {
    TilePos q = p;
    q.rows = tr;
    if (nr > 1) {
      b.loop(row_reg, nr);
      q.row_reg = row_reg;
      col_part(q);
      b.end_loop();
    } else {
      col_part(q);
    }
  }
  if (rr > 0) {
    TilePos q = p;
    q.rows = rr;
    q.row0 = nr * tr;
    col_part(q);
  }
}

void emit_dense_vec(sim::ProgramBuilder& b, int64_t lanes, sim::Op op, int64_t dst, const std::vector<sim::Operand>& src,
                    int64_t n) {
  const int64_t full = n / lanes, rem = n % lanes;
  auto emit = [&](int64_t off, int64_t r, int64_t c) {
    std::vector<sim::Operand> ops;
    for (sim::Operand o : src) {
      if (o.kind == sim::Operand::Kind::mem && !(o.row_stride == 0 && o.col_stride == 0)) {
        o.addr.offset += off * 4;
        o.row_stride = c;
      }
      ops.push_back(o);
    }
    const sim::Operand d = sim::ProgramBuilder::vmem(sim::ProgramBuilder::at(dst + off * 4), sim::DType::f32, c, 1);
    if (ops.size() == 1) b.unary(op, d, ops[0], r, c);
    else if (ops.size() == 2) b.binary(op, d, ops[0], ops[1], r, c);
    else b.ternary(op, d, ops[0], ops[1], ops[2], r, c);
  };
  if (full > 0) emit(0, full, lanes);
  if (rem > 0) emit(full * lanes, 1, rem);
}

void emit_row_reduce(sim::ProgramBuilder& b, int64_t lanes, sim::Op xop, sim::Op vop, int64_t dst, int64_t src,
                     int64_t ld, int64_t fold, int64_t rows, int64_t cols) {
  using B = sim::ProgramBuilder;
  auto vm = [](int64_t addr, int64_t rs) { return B::vmem(B::at(addr), sim::DType::f32, rs, 1); };
  if (cols <= lanes) {
    b.reduce(xop, vm(dst, -1), vm(src, ld), rows, cols, 1);
    return;
  }
  const int64_t full = cols / lanes, rem = cols % lanes;
  auto chunk = [&](int64_t c) { return vm(src + c * lanes * 4, ld); };
  const sim::Operand f = vm(fold, lanes);
  if (full >= 2) {
    b.binary(vop, f, chunk(0), chunk(1), rows, lanes);
    for (int64_t c = 2; c < full; ++c) b.binary(vop, f, f, chunk(c), rows, lanes);
  } else {
    b.unary(sim::Op::vmov, f, chunk(0), rows, lanes);
  }
  if (rem > 0) b.binary(vop, f, f, chunk(full), rows, rem);
  b.reduce(xop, vm(dst, -1), f, rows, lanes, 1);
}

void emit_dense_fill(sim::ProgramBuilder& b, int64_t lanes, int64_t dst, float value, int64_t n) {
  using B = sim::ProgramBuilder;
  const int64_t full = n / lanes, rem = n % lanes;
  if (full > 0) b.fill(B::vmem(B::at(dst), sim::DType::f32, lanes, 1), value, full, lanes);
  if (rem > 0) b.fill(B::vmem(B::at(dst + full * lanes * 4), sim::DType::f32, -1, 1), value, 1, rem);
}

}  // namespace tpu::codegen
