#include "codegen/rowwise_kernel.h"

#include <algorithm>

#include <fmt/format.h>

#include "codegen/tile_loops.h"
#include "sim/builder.h"
#include "tpucore/error.h"

namespace tpu::codegen {

using B = sim::ProgramBuilder;
using sim::Op;
using sim::DType;

namespace {
int64_t align64(int64_t v) { return (v + 63) / 64 * 64; }
constexpr int kTemps = 2;  // f32 tile temporaries
// Rows are summed in chunks of this many columns, then the partial sums (the XLU adds
// sequentially in f32; chunking keeps long rows accurate, as a lane-parallel tree would).
constexpr int64_t kSumChunk = 512;
int64_t sum_chunks(int64_t cols) { return (cols + kSumChunk - 1) / kSumChunk; }
}  // namespace

bool is_reduction(RowOp op) { return op == RowOp::sum || op == RowOp::mean || op == RowOp::max || op == RowOp::min; }

std::string rowwise_key(const RowwiseSpec& s) {
  return fmt::format("row:{}:{}x{}:{}>{}:w{}b{}:{}:{:a}:{:a}", int(s.op), s.rows, s.cols, sim::dtype_name(s.in_dtype),
                     sim::dtype_name(s.out_dtype), s.has_weight, s.has_bias, sim::dtype_name(s.param_dtype), s.eps,
                     s.scale);
}

int64_t rowwise_tile_rows(const sim::ChipConfig& cfg, const RowwiseSpec& s) {
  const int64_t budget = int64_t(cfg.memory.vmem_bytes) * 3 / 4;
  const int64_t params = 2 * align64(s.cols * 4);
  const int64_t out_cols = is_reduction(s.op) ? 1 : s.cols;
  const int64_t per_row = s.cols * sim::dtype_size(s.in_dtype) + out_cols * sim::dtype_size(s.out_dtype) +
                          kTemps * s.cols * 4 + 4 * 4 + sum_chunks(s.cols) * 4 + 64 * 3;
  if (budget - params < per_row) return 0;
  return std::max<int64_t>(1, std::min<int64_t>({s.rows, (budget - params) / per_row, int64_t(1) << 16}));
}

sim::Program make_rowwise_program(const sim::ChipConfig& cfg, const RowwiseSpec& s) {
  const int64_t tr = rowwise_tile_rows(cfg, s);
  TPU_CHECK(tr > 0, "internal: codegen: a row of {} elements does not fit in VMEM", s.cols);
  const int64_t C = s.cols;
  const bool red = is_reduction(s.op);
  const int64_t out_cols = red ? 1 : C;
  const int x_reg = 0;
  int nargs = 1;
  const int w_reg = s.has_weight ? nargs++ : -1;
  const int b_reg = s.has_bias ? nargs++ : -1;
  const int out_reg = nargs++;
  const int row_reg = nargs, col_reg = nargs + 1;
  const int64_t esi = sim::dtype_size(s.in_dtype), eso = sim::dtype_size(s.out_dtype), esp = sim::dtype_size(s.param_dtype);

  // VMEM: weight, bias (once), x tile, output tile, temporaries, per-row columns.
  int64_t at = 0;
  const int64_t w_buf = at;
  at = align64(at + C * esp);
  const int64_t b_buf = at;
  at = align64(at + C * esp);
  const int64_t x_buf = at;
  at = align64(at + tr * C * esi);
  const int64_t o_buf = at;
  at = align64(at + tr * out_cols * eso);
  const int64_t t0 = at;
  at = align64(at + tr * C * 4);
  const int64_t t1 = at;
  at = align64(at + tr * C * 4);
  const int64_t c0 = at;
  at = align64(at + tr * 4);
  const int64_t c1 = at;
  at = align64(at + tr * 4);
  const int64_t nchunk = sum_chunks(C);
  const int64_t part = at;
  at = align64(at + tr * nchunk * 4);
  TPU_CHECK(uint64_t(at) <= cfg.memory.vmem_bytes, "internal: codegen: rowwise plan needs {} bytes of VMEM", at);

  const int sem_in = 0, sem_out = 1;
  const int nq = cfg.dma.engines;
  B b(fmt::format("rowwise_{}", int(s.op)));
  b.signal(sem_out, 1);
  int pre = 0;
  if (s.has_weight) b.dma(B::vmem_at(B::at(w_buf)), B::hbm_at(B::at(0, {{int16_t(w_reg), 1}})), {.row_bytes = C * esp}, (pre++) % nq, sem_in);
  if (s.has_bias) b.dma(B::vmem_at(B::at(b_buf)), B::hbm_at(B::at(0, {{int16_t(b_reg), 1}})), {.row_bytes = C * esp}, (pre++) % nq, sem_in);
  if (pre) b.wait(sem_in, pre);

  auto tile = [&](int64_t ld, int64_t base, DType t) { return B::vmem(B::at(base), t, ld); };
  auto col = [&](int64_t base) { return B::vmem(B::at(base), DType::f32, 1, 0); };  // per-row value, broadcast along the row
  const sim::Operand X = tile(C, x_buf, s.in_dtype), T0 = tile(C, t0, DType::f32), T1 = tile(C, t1, DType::f32);
  const sim::Operand W = B::vmem(B::at(w_buf), s.param_dtype, 0), Bb = B::vmem(B::at(b_buf), s.param_dtype, 0);
  const sim::Operand C0 = tile(1, c0, DType::f32), C1 = tile(1, c1, DType::f32);
  const sim::Operand O = tile(out_cols, o_buf, s.out_dtype);
  const float inv_c = 1.0f / float(C);
  // dst (r x 1) = sum of each row of src (r x C).
  auto row_sum = [&](const sim::Operand& dst, const sim::Operand& src, int64_t r) {
    if (nchunk == 1) {
      b.reduce(Op::xsum, dst, src, r, C);
      return;
    }
    for (int64_t j = 0; j < nchunk; ++j) {
      sim::Operand piece = src;
      piece.addr.offset += j * kSumChunk * sim::dtype_size(src.dtype);
      b.reduce(Op::xsum, B::vmem(B::at(part + j * 4), DType::f32, nchunk), piece, r, std::min(kSumChunk, C - j * kSumChunk));
    }
    b.reduce(Op::xsum, dst, B::vmem(B::at(part), DType::f32, nchunk), r, nchunk);
  };

  emit_tile_loops(b, s.rows, C, tr, C, row_reg, col_reg, [&](const TilePos& p) {
    const int64_t r = p.rows;
    b.dma(B::vmem_at(B::at(x_buf)), B::hbm_at(p.addr(x_reg, 0, C, esi)), {.rows = r, .row_bytes = C * esi}, 0, sem_in);
    b.wait(sem_in);
    b.wait(sem_out);
    switch (s.op) {
      case RowOp::sum:
      case RowOp::mean:
        row_sum(C0, X, r);
        b.binary(Op::vmul, O, C0, B::imm(s.op == RowOp::mean ? s.scale : 1.0f), r, 1);
        break;
      case RowOp::max:
        b.reduce(Op::xmax, C0, X, r, C);
        b.unary(Op::vmov, O, C0, r, 1);
        break;
      case RowOp::min:
        b.unary(Op::vneg, T0, X, r, C);
        b.reduce(Op::xmax, C0, T0, r, C);
        b.unary(Op::vneg, O, C0, r, 1);
        break;
      case RowOp::softmax:
      case RowOp::log_softmax:
        b.reduce(Op::xmax, C0, X, r, C);
        b.binary(Op::vsub, T0, X, col(c0), r, C);
        b.unary(Op::vexp, T1, T0, r, C);
        row_sum(C1, T1, r);
        if (s.op == RowOp::softmax) {
          b.unary(Op::vrecip, C1, C1, r, 1);
          b.binary(Op::vmul, O, T1, col(c1), r, C);
        } else {
          b.unary(Op::vlog, C1, C1, r, 1);
          b.binary(Op::vsub, O, T0, col(c1), r, C);
        }
        break;
      case RowOp::layer_norm:
      case RowOp::rms_norm: {
        sim::Operand src = X;
        if (s.op == RowOp::layer_norm) {
          row_sum(C0, X, r);
          b.binary(Op::vmul, C0, C0, B::imm(inv_c), r, 1);
          b.binary(Op::vsub, T0, X, col(c0), r, C);
          src = T0;
        }
        b.binary(Op::vmul, T1, src, src, r, C);
        row_sum(C1, T1, r);
        b.ternary(Op::vfma, C1, C1, B::imm(inv_c), B::imm(s.eps), r, 1);
        b.unary(Op::vrsqrt, C1, C1, r, 1);
        const bool last_mul = !s.has_weight && !s.has_bias;
        b.binary(Op::vmul, last_mul ? O : T1, src, col(c1), r, C);
        if (s.has_weight) b.binary(Op::vmul, s.has_bias ? T1 : O, T1, W, r, C);
        if (s.has_bias) b.binary(Op::vadd, O, T1, Bb, r, C);
        break;
      }
    }
    b.dma(B::hbm_at(p.addr(out_reg, 0, out_cols, eso)), B::vmem_at(B::at(o_buf)), {.rows = 1, .row_bytes = r * out_cols * eso},
          1 % nq, sem_out);
  });
  b.wait(sem_out);
  b.fence();
  return b.finish();
}

}  // namespace tpu::codegen
