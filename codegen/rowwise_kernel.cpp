#include "codegen/rowwise_kernel.h"

#include <algorithm>

#include <fmt/format.h>

#include "codegen/megacore.h"
#include "codegen/tile_loops.h"
#include "sim/builder.h"
#include "tpucore/core/error.h"

namespace tpu::codegen {

using B = sim::ProgramBuilder;
using sim::Op;
using sim::DType;

namespace {
constexpr int kTemps = 2;  // f32 tile temporaries
// Up to this many row tiles are emitted statically with double-buffered inputs and outputs (the
// next tile loads while this one computes and the previous one stores); more run in a loop.
constexpr int64_t kMaxPipelinedTiles = 512;
// Rows are summed in chunks of this many columns, then the partial sums (the XLU adds
// sequentially in f32; chunking keeps long rows accurate, as a lane-parallel tree would).
constexpr int64_t kSumChunk = 512;
int64_t sum_chunks(int64_t cols) { return (cols + kSumChunk - 1) / kSumChunk; }
}  // namespace

bool is_reduction(RowOp op) {
  return op == RowOp::sum || op == RowOp::mean || op == RowOp::max || op == RowOp::min || op == RowOp::logsumexp;
}

int fused_slots(const VecExpr& e, const std::vector<EwInput>& ins, bool y_first) {
  std::vector<DType> d;
  if (y_first) d.push_back(DType::f32);
  for (const EwInput& i : ins) d.push_back(i.dtype);
  return vec_temp_slots(e, d);
}

std::string rowwise_key(const RowwiseSpec& s) {
  std::string k = fmt::format("row:{}:{}x{}:{}>{}:w{}b{}:{}:{:a}:{:a}:p{}e{}:", int(s.op), s.rows, s.cols,
                              sim::dtype_name(s.in_dtype), sim::dtype_name(s.out_dtype), s.has_weight, s.has_bias,
                              sim::dtype_name(s.param_dtype), s.eps, s.scale, s.has_prologue, s.has_epilogue);
  for (const EwInput& in : s.pro_inputs) k += fmt::format("{}{},", int(in.layout), sim::dtype_name(in.dtype));
  if (s.has_prologue) k += s.prologue.key() + "|";
  for (const EwInput& in : s.epi_inputs) k += fmt::format("{}{},", int(in.layout), sim::dtype_name(in.dtype));
  if (s.has_epilogue) k += s.epilogue.key();
  return k;
}

int64_t rowwise_tile_rows(const sim::ChipConfig& cfg, const RowwiseSpec& s) {
  const int64_t budget = int64_t(cfg.memory.vmem_bytes) * 3 / 4;
  const int64_t params = 2 * align64(s.cols * 4);
  const int64_t out_cols = is_reduction(s.op) ? 1 : s.cols;
  // x and the output are double-buffered (see kMaxPipelinedTiles).
  int64_t per_row = 2 * s.cols * sim::dtype_size(s.in_dtype) + 2 * out_cols * sim::dtype_size(s.out_dtype) +
                          kTemps * s.cols * 4 + 4 * 4 + sum_chunks(s.cols) * 4 + 64 * 5;
  int64_t fused = 0;
  if (s.has_prologue) {
    fused += 4 * s.cols * (1 + fused_slots(s.prologue, s.pro_inputs, false));
    for (const EwInput& in : s.pro_inputs) fused += 2 * (ew_tile_bytes(in, 1, s.cols) + 64);
  }
  if (s.has_epilogue) {
    fused += 4 * out_cols * (1 + fused_slots(s.epilogue, s.epi_inputs, true));
    for (const EwInput& in : s.epi_inputs) fused += 2 * (ew_tile_bytes(in, 1, out_cols) + 64);
  }
  per_row += fused;
  if (budget - params < per_row) return 0;
  // At most ~256K elements per tile, so large inputs take several tiles and load / compute /
  // store overlap (the first load and the last compute and store do not: an RMSNorm over
  // [1024, 4096] bf16 on v6e takes 24.2K cycles in tiles of 64 rows, 26.9K in tiles of 256).
  const int64_t cap = std::max<int64_t>(8, (int64_t(1) << 18) / std::max<int64_t>(1, s.cols));
  return std::max<int64_t>(1, std::min<int64_t>({s.rows, (budget - params) / per_row, int64_t(1) << 16, cap}));
}

int rowwise_registers(const RowwiseSpec& s) {
  const int operands = (s.has_prologue ? int(s.pro_inputs.size()) : 1) + s.has_weight + s.has_bias +
                       (s.has_epilogue ? int(s.epi_inputs.size()) : 0);
  return operands + 3;  // + the output, row and column counters (see make_rowwise_program)
}

namespace {

sim::Program make_rowwise_part(const sim::ChipConfig& cfg, const RowwiseSpec& s) {
  const int64_t tr = rowwise_tile_rows(cfg, s);
  TPU_CHECK(tr > 0, "internal: codegen: a row of {} elements does not fit in VMEM", s.cols);
  const int64_t C = s.cols;
  const bool red = is_reduction(s.op);
  const int64_t out_cols = red ? 1 : C;
  const int x_reg = 0;
  int nargs = s.has_prologue ? int(s.pro_inputs.size()) : 1;
  const int w_reg = s.has_weight ? nargs++ : -1;
  const int b_reg = s.has_bias ? nargs++ : -1;
  const int epi_reg = nargs;
  if (s.has_epilogue) nargs += int(s.epi_inputs.size());
  const int out_reg = nargs++;
  const int row_reg = nargs, col_reg = nargs + 1;
  TPU_CHECK(rowwise_registers(s) == col_reg + 1 && col_reg < cfg.scalar.registers,
            "internal: codegen: a row-wise program with {} operands exceeds the chip's registers", nargs);
  const int64_t esi = sim::dtype_size(s.in_dtype), eso = sim::dtype_size(s.out_dtype), esp = sim::dtype_size(s.param_dtype);

  // VMEM: weight, bias (once), x tile, output tile, temporaries, per-row columns.
  int64_t at = 0;
  const int64_t w_buf = at;
  at = align64(at + C * esp);
  const int64_t b_buf = at;
  at = align64(at + C * esp);
  int64_t x_bufs[2], o_bufs[2];  // double-buffered (a single-tile or looped program uses [0])
  for (int64_t& x : x_bufs) {
    x = at;
    at = align64(at + tr * C * esi);
  }
  for (int64_t& o : o_bufs) {
    o = at;
    at = align64(at + tr * out_cols * eso);
  }
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
  // Fused prologue / epilogue: input tiles, temporaries, x and y tiles.
  std::vector<int64_t> pro_bufs[2], epi_bufs[2];
  for (int par = 0; par < 2; ++par) {
    for (const EwInput& in : s.pro_inputs) {
      pro_bufs[par].push_back(at);
      at = align64(at + ew_tile_bytes(in, tr, C));
    }
    for (const EwInput& in : s.epi_inputs) {
      epi_bufs[par].push_back(at);
      at = align64(at + ew_tile_bytes(in, tr, out_cols));
    }
  }
  const int pro_slots = s.has_prologue ? fused_slots(s.prologue, s.pro_inputs, false) : 0;
  const int epi_slots = s.has_epilogue ? fused_slots(s.epilogue, s.epi_inputs, true) : 0;
  const TempArena pro_arena{at, align64(tr * C * 4), C, pro_slots};
  at += pro_arena.slot_bytes * pro_slots;
  const TempArena epi_arena{at, align64(tr * out_cols * 4), out_cols, epi_slots};
  at += epi_arena.slot_bytes * epi_slots;
  const int64_t xt = at;
  at = align64(at + (s.has_prologue ? tr * C * 4 : 0));
  const int64_t yt = at;
  at = align64(at + (s.has_epilogue ? tr * out_cols * 4 : 0));
  TPU_CHECK(uint64_t(at) <= cfg.memory.vmem_bytes, "internal: codegen: rowwise plan needs {} bytes of VMEM", at);

  const int sem_in = 0, sem_out = 1, sem_in_par[2] = {2, 3};
  const int64_t ntiles = (s.rows + tr - 1) / tr;
  const bool pipelined = ntiles >= 2 && ntiles <= kMaxPipelinedTiles;
  const int nq = cfg.dma.engines;
  B b(fmt::format("rowwise_{}", int(s.op)));
  b.signal(sem_out, 1);
  int pre = 0;
  if (s.has_weight) b.dma(B::vmem_at(B::at(w_buf)), B::hbm_at(B::at(0, {{int16_t(w_reg), 1}})), {.row_bytes = C * esp}, (pre++) % nq, sem_in);
  if (s.has_bias) b.dma(B::vmem_at(B::at(b_buf)), B::hbm_at(B::at(0, {{int16_t(b_reg), 1}})), {.row_bytes = C * esp}, (pre++) % nq, sem_in);
  if (pre) b.wait(sem_in, pre);

  auto tile = [&](int64_t ld, int64_t base, DType t) { return B::vmem(B::at(base), t, ld); };
  auto col = [&](int64_t base) { return B::vmem(B::at(base), DType::f32, 1, 0); };  // per-row value, broadcast along the row
  auto Xof = [&](int par) { return s.has_prologue ? tile(C, xt, DType::f32) : tile(C, x_bufs[par], s.in_dtype); };
  const sim::Operand T0 = tile(C, t0, DType::f32), T1 = tile(C, t1, DType::f32);
  const sim::Operand W = B::vmem(B::at(w_buf), s.param_dtype, 0), Bb = B::vmem(B::at(b_buf), s.param_dtype, 0);
  const sim::Operand C0 = tile(1, c0, DType::f32), C1 = tile(1, c1, DType::f32);
  auto Oof = [&](int par) {
    return s.has_epilogue ? tile(out_cols, yt, DType::f32) : tile(out_cols, o_bufs[par], s.out_dtype);
  };
  // DMAs the tile of each fused input into its buffer; returns their operands.
  auto load_fused = [&](const std::vector<EwInput>& ins, const std::vector<int64_t>& bufs, int reg0, int64_t cols,
                        const TilePos& p, int& loads, int sem_in) {
    std::vector<sim::Operand> ops;
    for (size_t i = 0; i < ins.size(); ++i) {
      const EwInput& in = ins[i];
      const int64_t es = sim::dtype_size(in.dtype);
      const int16_t reg = int16_t(reg0 + int(i));
      const int q = (loads + 1) % nq;
      switch (in.layout) {
        case EwLayout::full:
          b.dma(B::vmem_at(B::at(bufs[i])), B::hbm_at(p.addr(reg, 0, cols, es)), {.rows = 1, .row_bytes = p.rows * cols * es}, q, sem_in);
          ops.push_back(B::vmem(B::at(bufs[i]), in.dtype, cols));
          break;
        case EwLayout::row:
          b.dma(B::vmem_at(B::at(bufs[i])), B::hbm_at(B::at(0, {{reg, 1}})), {.row_bytes = cols * es}, q, sem_in);
          ops.push_back(B::vmem(B::at(bufs[i]), in.dtype, 0));
          break;
        case EwLayout::col:
          b.dma(B::vmem_at(B::at(bufs[i])), B::hbm_at(p.addr(reg, 0, 1, es, true, false)), {.row_bytes = p.rows * es}, q, sem_in);
          ops.push_back(B::vmem(B::at(bufs[i]), in.dtype, 1, 0));
          break;
        case EwLayout::scalar:
          b.dma(B::vmem_at(B::at(bufs[i])), B::hbm_at(B::at(0, {{reg, 1}})), {.row_bytes = es}, q, sem_in);
          ops.push_back(B::vmem(B::at(bufs[i]), in.dtype, 0, 0));
          break;
      }
      ++loads;
    }
    return ops;
  };
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

  // In-place op on the r per-row values at `buf` (with immediates), as dense vregs: a column of
  // r values would cost r / sublanes vregs, the same values as rows of lanes cost r / 1024.
  auto col_op = [&](Op op, int64_t buf, int64_t r, const std::vector<sim::Operand>& imms) {
    const int64_t L = cfg.vpu.lanes, full = r / L, rem = r % L;
    auto one = [&](int64_t off, int64_t rows, int64_t cols) {
      const sim::Operand d = B::vmem(B::at(buf + off * 4), DType::f32, cols);
      if (imms.empty()) b.unary(op, d, d, rows, cols);
      else if (imms.size() == 1) b.binary(op, d, d, imms[0], rows, cols);
      else b.ternary(op, d, d, imms[0], imms[1], rows, cols);
    };
    if (full > 0) one(0, full, L);
    if (rem > 0) one(full * L, 1, rem);
  };
  // DMAs tile p's inputs into the buffers of parity par; returns how many signals `sem` gets.
  struct TileOps {
    std::vector<sim::Operand> pro, epi;
  };
  auto issue_loads = [&](const TilePos& p, int par, int sem, TileOps& t) {
    int loads = 0;
    if (s.has_prologue) {
      t.pro = load_fused(s.pro_inputs, pro_bufs[par], 0, C, p, loads, sem);
    } else {
      b.dma(B::vmem_at(B::at(x_bufs[par])), B::hbm_at(p.addr(x_reg, 0, C, esi)), {.rows = p.rows, .row_bytes = C * esi},
            0, sem);
      ++loads;
    }
    if (s.has_epilogue) {
      t.epi.push_back(Oof(par));
      std::vector<sim::Operand> more = load_fused(s.epi_inputs, epi_bufs[par], epi_reg, out_cols, p, loads, sem);
      t.epi.insert(t.epi.end(), more.begin(), more.end());
    }
    return loads;
  };
  // Computes tile p from the buffers of parity par and stores it.
  auto compute_store = [&](const TilePos& p, int par, const TileOps& t) {
    const int64_t r = p.rows;
    const sim::Operand X = Xof(par), O = Oof(par), Ofinal = tile(out_cols, o_bufs[par], s.out_dtype);
    if (s.has_prologue) emit_vec_expr(b, s.prologue, t.pro, X, pro_arena, r, C);
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
      case RowOp::logsumexp:
        // m + log(sum(exp(x - m))), m the row max clamped to finite (an all -inf row gives
        // -inf, a +inf gives +inf, not NaN).
        b.reduce(Op::xmax, C0, X, r, C);
        col_op(Op::vmax, c0, r, {B::imm(-3.4028235e38f)});
        col_op(Op::vmin, c0, r, {B::imm(3.4028235e38f)});
        b.binary(Op::vsub, T0, X, col(c0), r, C);
        b.unary(Op::vexp, T1, T0, r, C);
        row_sum(C1, T1, r);
        col_op(Op::vlog, c1, r, {});
        b.binary(Op::vadd, O, C1, C0, r, 1);
        break;
      case RowOp::softmax:
      case RowOp::log_softmax:
        b.reduce(Op::xmax, C0, X, r, C);
        b.binary(Op::vsub, T0, X, col(c0), r, C);
        b.unary(Op::vexp, T1, T0, r, C);
        row_sum(C1, T1, r);
        if (s.op == RowOp::softmax) {
          col_op(Op::vrecip, c1, r, {});
          b.binary(Op::vmul, O, T1, col(c1), r, C);
        } else {
          col_op(Op::vlog, c1, r, {});
          b.binary(Op::vsub, O, T0, col(c1), r, C);
        }
        break;
      case RowOp::layer_norm:
      case RowOp::rms_norm: {
        sim::Operand src = X;
        if (s.op == RowOp::layer_norm) {
          // Corrected two-pass variance (Chan, Golub and LeVeque): the f32 mean of large values
          // is off by rounding that grows with |mean|; the mean of the centred row measures that
          // error and a second subtraction removes it, so the variance sees centred values.
          row_sum(C0, X, r);
          col_op(Op::vmul, c0, r, {B::imm(inv_c)});
          b.binary(Op::vsub, T0, X, col(c0), r, C);
          row_sum(C0, T0, r);
          col_op(Op::vmul, c0, r, {B::imm(inv_c)});
          b.binary(Op::vsub, T0, T0, col(c0), r, C);
          src = T0;
        }
        b.binary(Op::vmul, T1, src, src, r, C);
        row_sum(C1, T1, r);
        if (s.op == RowOp::rms_norm && s.has_weight) {
          // x w on the vector unit while the cross-lane unit sums the squares, then one scale
          // by the row's 1 / rms (instead of x / rms, then times w, both after the sum).
          b.binary(Op::vmul, T0, src, W, r, C);
          col_op(Op::vfma, c1, r, {B::imm(inv_c), B::imm(s.eps)});
          col_op(Op::vrsqrt, c1, r, {});
          b.binary(Op::vmul, s.has_bias ? T1 : O, T0, col(c1), r, C);
          if (s.has_bias) b.binary(Op::vadd, O, T1, Bb, r, C);
          break;
        }
        col_op(Op::vfma, c1, r, {B::imm(inv_c), B::imm(s.eps)});
        col_op(Op::vrsqrt, c1, r, {});
        const bool last_mul = !s.has_weight && !s.has_bias;
        b.binary(Op::vmul, last_mul ? O : T1, src, col(c1), r, C);
        if (s.has_weight) b.binary(Op::vmul, s.has_bias ? T1 : O, T1, W, r, C);
        if (s.has_bias) b.binary(Op::vadd, O, T1, Bb, r, C);
        break;
      }
    }
    if (s.has_epilogue) emit_vec_expr(b, s.epilogue, t.epi, Ofinal, epi_arena, r, out_cols);
    b.dma(B::hbm_at(p.addr(out_reg, 0, out_cols, eso)), B::vmem_at(B::at(o_bufs[par])),
          {.rows = 1, .row_bytes = r * out_cols * eso}, 1 % nq, sem_out);
  };
  if (pipelined) {
    // Static tiles: tile t + 1 loads while tile t computes and tile t - 1 stores.
    b.signal(sem_out, 1);  // with the first one: both output buffers start free
    auto pos = [&](int64_t t) {
      TilePos p;
      p.rows = std::min(tr, s.rows - t * tr);
      p.cols = C;
      p.row0 = t * tr;
      p.tile_rows = tr;
      p.tile_cols = C;
      return p;
    };
    TileOps ops[2];
    int pending[2] = {0, 0};
    pending[0] = issue_loads(pos(0), 0, sem_in_par[0], ops[0]);
    for (int64_t t = 0; t < ntiles; ++t) {
      const int par = int(t % 2), nxt = 1 - par;
      if (t + 1 < ntiles) {
        ops[nxt] = {};
        pending[nxt] = issue_loads(pos(t + 1), nxt, sem_in_par[nxt], ops[nxt]);
      }
      if (pending[par]) b.wait(sem_in_par[par], pending[par]);
      compute_store(pos(t), par, ops[par]);
    }
    b.wait(sem_out, 2);
  } else {
    emit_tile_loops(b, s.rows, C, tr, C, row_reg, col_reg, [&](const TilePos& p) {
      TileOps ops;
      const int loads = issue_loads(p, 0, sem_in, ops);
      if (loads) b.wait(sem_in, loads);
      compute_store(p, 0, ops);
    });
    b.wait(sem_out);
  }
  b.fence();
  return b.finish();
}

}  // namespace

sim::Program make_rowwise_program(const sim::ChipConfig& cfg, const RowwiseSpec& s) {
  // Megacore: rows split between the cores when the kernel is big enough (one core's estimate:
  // its HBM traffic at one core's bandwidth). Operand registers as in make_rowwise_part.
  std::vector<RowOperand> ops;
  int reg = 0;
  auto laid_out = [&](const std::vector<EwInput>& ins) {
    for (const EwInput& in : ins)
      ops.push_back({reg++, ew_tile_bytes(in, 1, s.cols) * (in.layout == EwLayout::full || in.layout == EwLayout::col)});
  };
  if (s.has_prologue) laid_out(s.pro_inputs);
  else ops.push_back({reg++, s.cols * sim::dtype_size(s.in_dtype)});
  reg += s.has_weight + s.has_bias;  // one row vector each: the same for every core
  if (s.has_epilogue) laid_out(s.epi_inputs);
  ops.push_back({reg, (is_reduction(s.op) ? 1 : s.cols) * sim::dtype_size(s.out_dtype)});
  double bytes = 0;
  for (const RowOperand& o : ops) bytes += double(o.bytes_per_row) * double(s.rows);
  const int cores = megacore_cores(cfg, bytes / cfg.hbm_bytes_per_cycle());
  return split_rows(fmt::format("rowwise_{}", int(s.op)), cores, s.rows, cfg.vpu.sublanes, ops, [&](int64_t rows) {
    RowwiseSpec part = s;
    part.rows = rows;
    return make_rowwise_part(cfg, part);
  });
}

}  // namespace tpu::codegen
