// The mixture-of-experts ops on the chip, as data-driven programs: one program per shape that
// cannot change with the routing serves every routing, since the per-group row ranges and the
// token orders are i32 tables in HBM read with `sld` and the loops over row tiles and tokens
// are counted by registers (`loopr`). The token count is not part of any program either: a
// step with another number of tokens reuses the program.
//
//   grouped_matmul(x [T, K], w [E, K, N] or [E, N, K], group_sizes [E]) -> [T, N]
//     per (group, column panel of N; the whole width when it fits VMEM): the group's full row
//     tiles (tm rows, one DMA each, double-buffered: tile i + 1 loads while tile i multiplies)
//     times the panel of its weights (in VMEM, the next entry's loaded during this one), then
//     its tail rows (fewer than tm) by one DMA per row, so no row past the group's end is read
//     or written; the MXUs multiply only the tail's blocks of one MXU height, whose rows past
//     the tail are never stored. f32/bf16 on the MXUs with f32 accumulation (f32 at the
//     precision of set_float32_matmul_precision); results stored asynchronously from two buffers.
//   grouped_matmul_weight_grad(x, dy, group_sizes) -> [E, K, N] ([E, N, K] transposed)
//     per (group, column panel) an f32 accumulator [K, panel] in VMEM, += x_tile^T dy_tile over
//     the group's row tiles (the MXU streams x_tile^T as a strided operand); the tail tile is
//     zeroed before its rows come in, so rows past the group's end add nothing; an empty group
//     writes zeros.
//   moe_permute(x, order, k): out[i] = x[order[i] / k], one HBM-to-HBM row DMA per slot.
//   moe_unpermute(y, order, w, k): out[t] = sum_j w[t, j] y[row of slot t k + j], the k rows
//     gathered into VMEM (the next token's while this one is summed), summed in f32 in j order.
//
// The host reads the group sizes and the order (both small), checks them as the cpu kernels do
// (a bad routing is a tpu::Error, never a wrong read) and uploads the tables. Shapes whose
// narrowest panel does not fit VMEM, f16, strided inner dims and tables whose offsets pass 2^31
// elements take the counted host fallback.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <vector>

#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "codegen/precision.h"
#include "ops/fallback.h"
#include "ops/meta_util.h"
#include "sim/builder.h"
#include "tpucore/ops.h"

namespace tpu::codegen {
namespace {

using MoeB = sim::ProgramBuilder;

constexpr int kMoeSemW = 0, kMoeSemX = 1, kMoeSemTail = 2, kMoeSemOut = 3, kMoeSemTailOut = 4;
// Per (group, column panel) entry: row0, nfull, nfull - 1, has_full, tail_row0, ntail, has_tail,
// has_next, group, panel, and the element offsets of (row0, panel) and (tail_row0, panel) in the
// panelled matrix (the output of grouped_matmul, dy of the weight gradient), and the tail's
// blocks of one MXU height (the MXUs multiply only those rows of the tail tile).
constexpr int64_t kGroupWords = 13;

int64_t moe_align(int64_t v) { return (v + 63) / 64 * 64; }

sim::DType moe_sim_dtype(DType t) { return t == DType::bf16 ? sim::DType::bf16 : sim::DType::f32; }
sim::MxuMode moe_mode(DType t) { return t == DType::bf16 ? sim::MxuMode::bf16 : f32_matmul_mode(); }
bool moe_float(DType t) { return t == DType::f32 || t == DType::bf16; }
// The HBM address of a tensor, 0 for an empty one (never read).
int64_t moe_addr(const Tensor& t) { return t.numel() ? hbm_address(t) : 0; }

// Registers shared by the grouped programs: r0..r3 arguments, the rest the program's own.
enum GmmReg : int {
  gA = 0, gB, gOut, gTab,  // x (or L), w (or R), out, group table
  gE, gRow0, gNfullM1, gHasFull, gTailRow0, gNtail, gHasTail, gHasNext,
  gT, gJ, gH, gWP, gNWP, gXP, gNXP, gOC, gOP, gGrp, gPan, gOff, gTailOff, gNGrp, gNPan, gTailBlocks, gBlk
};

// Emits the skeleton over the table's entries (one per group and column panel; the entry's
// words in registers), with
// `group_begin` (weights), the double-buffered full tiles, the tail and `group_end` callbacks.
//   load(index_reg or -1, ahead, parity_reg): issue the DMAs of full tile index + ahead
//   compute(parity_reg, index_reg): full tile index (gT in the loop, gNfullM1 for the last)
//   tail_load(), tail_compute(): the tail rows
struct GroupedEmit {
  std::function<void()> group_begin, group_end;
  std::function<void(int, int64_t, int)> load;
  std::function<void(int, int)> compute;
  std::function<void()> tail_load, tail_compute;
  int64_t loads_per_tile = 1;
};

void emit_grouped(MoeB& b, int64_t entries, const GroupedEmit& g) {
  b.sset(gOC, 0);
  b.sset(gOP, 0);
  b.signal(kMoeSemOut, 2);  // two free output buffers
  b.loop(gE, entries);
  auto word = [&](int reg, int64_t w) { b.sload(reg, MoeB::hbm_at(MoeB::at(w * 4, {{gTab, 1}, {gE, kGroupWords * 4}}))); };
  word(gRow0, 0);
  word(gNfullM1, 2);
  word(gHasFull, 3);
  word(gTailRow0, 4);
  word(gNtail, 5);
  word(gHasTail, 6);
  word(gHasNext, 7);
  word(gGrp, 8);
  word(gPan, 9);
  word(gOff, 10);
  word(gTailOff, 11);
  word(gTailBlocks, 12);
  g.group_begin();
  g.tail_load();  // the tail's rows come in while the full tiles run
  b.loop_reg(gH, gHasFull);
  b.sset(gXP, 0);
  g.load(-1, 0, gXP);
  b.end_loop();
  b.loop_reg(gT, gNfullM1);
  b.smod(gXP, gT, 2);
  b.sadd(gNXP, gT, 1);
  b.smod(gNXP, gNXP, 2);
  g.load(gT, 1, gNXP);
  b.wait(kMoeSemX, g.loads_per_tile);
  g.compute(gXP, gT);
  b.end_loop();
  b.loop_reg(gH, gHasFull);
  b.smod(gXP, gNfullM1, 2);
  b.wait(kMoeSemX, g.loads_per_tile);
  g.compute(gXP, gNfullM1);
  b.end_loop();
  b.loop_reg(gH, gHasTail);
  g.tail_compute();
  b.end_loop();
  g.group_end();
  b.end_loop();
  b.wait(kMoeSemOut, 2);
  b.fence();
}

// Takes the next output buffer (waits for the store that used it two stores ago); advances.
void next_out_buffer(MoeB& b) { b.wait(kMoeSemOut); }
void advance_out_buffer(MoeB& b) {
  b.sadd(gOC, gOC, 1);
  b.smod(gOP, gOC, 2);
}

struct GmmSpec {
  int64_t E = 0, K = 0, N = 0, tm = 0, tn = 0;  // tn: the column panel (divides N)
  int64_t xs = 0, ws0 = 0, ws1 = 0;  // bytes: x row stride, w group and row strides
  bool tw = false;
  DType dt = DType::f32;
};

int64_t gmm_vmem(const GmmSpec& s, int64_t es) {
  return 2 * moe_align(s.K * s.tn * es) + 3 * moe_align(s.tm * s.K * es) + moe_align(s.tm * s.tn * 4) +
         3 * moe_align(s.tm * s.tn * es);
}

sim::Program make_gmm_program(const sim::ChipConfig& cfg, const GmmSpec& s) {
  const sim::DType dt = moe_sim_dtype(s.dt);
  const sim::MxuMode mode = moe_mode(s.dt);
  // N below is the panel's width: each table entry multiplies one column panel of one group.
  const int64_t es = sim::dtype_size(dt), K = s.K, N = s.tn, tm = s.tm, R = cfg.mxu.rows, C = cfg.mxu.cols;
  int64_t at = 0;
  auto take = [&](int64_t bytes) { const int64_t o = at; at += moe_align(bytes); return o; };
  const int64_t wb = take(K * N * es), wstep = take(K * N * es) - wb;
  const int64_t xb = take(tm * K * es), xstep = take(tm * K * es) - xb, xt = take(tm * K * es);
  const int64_t acc = take(tm * N * 4);
  const int64_t ob = take(tm * N * es), ostep = take(tm * N * es) - ob, ot = take(tm * N * es);
  const int64_t rb = K * es, orb = s.N * es, pstride = s.tw ? N * s.ws1 : N * es;
  MoeB b(fmt::format("grouped_matmul_{}x{}", K, N));
  const sim::DmaShape wshape = s.tw ? sim::DmaShape{.rows = N, .row_bytes = K * es, .src_row_stride = s.ws1}
                                    : sim::DmaShape{.rows = K, .row_bytes = N * es, .src_row_stride = s.ws1};
  // Entry 0's weights (group 0, panel 0) before the loop; each entry waits for its own and
  // starts the next one's.
  b.dma(MoeB::vmem_at(MoeB::at(wb)), MoeB::hbm_at(MoeB::at(0, {{gB, 1}})), wshape, 0, kMoeSemW);
  // `rows` rows of an x tile times the group's weights into acc (from row block gBlk when
  // `block`), on the MXUs by column chunks.
  // The K chunks are the outer loop: an accumulating product waits for the previous one into
  // the same columns to drain, so the column chunks of one K chunk run in between.
  auto multiply = [&](const std::function<sim::Addr(int64_t)>& xaddr, int64_t rows, bool block) {
    for (int64_t c = 0; c * R < K; ++c)
      for (int64_t j = 0; j * C < N; ++j) {
        const int64_t nn = std::min(C, N - j * C), kk = std::min(R, K - c * R);
        const int mxu = int(j % cfg.mxu.count);
        const sim::Operand wt =
            s.tw ? MoeB::vmem(MoeB::at(wb + (j * C * K + c * R) * es, {{gWP, wstep}}), dt, 1, K)
                 : MoeB::vmem(MoeB::at(wb + (c * R * N + j * C) * es, {{gWP, wstep}}), dt, N);
        b.mxu_load_weights(mxu, wt, kk, nn, mode);
        const sim::Addr out = block ? MoeB::at(acc + j * C * 4, {{gBlk, R * N * 4}}) : MoeB::at(acc + j * C * 4);
        b.mxu_matmul(mxu, MoeB::vmem(out, sim::DType::f32, N), MoeB::vmem(xaddr(c * R * es), dt, K), rows, kk, nn, c > 0,
                     mode);
      }
  };
  GroupedEmit g;
  g.group_begin = [&] {
    b.smod(gWP, gE, 2);
    b.wait(kMoeSemW);
    b.loop_reg(gH, gHasNext);
    b.sadd(gNWP, gE, 1);
    b.smod(gNWP, gNWP, 2);
    b.sload(gNGrp, MoeB::hbm_at(MoeB::at((kGroupWords + 8) * 4, {{gTab, 1}, {gE, kGroupWords * 4}})));
    b.sload(gNPan, MoeB::hbm_at(MoeB::at((kGroupWords + 9) * 4, {{gTab, 1}, {gE, kGroupWords * 4}})));
    b.dma(MoeB::vmem_at(MoeB::at(wb, {{gNWP, wstep}})),
          MoeB::hbm_at(MoeB::at(0, {{gB, 1}, {gNGrp, s.ws0}, {gNPan, pstride}})), wshape, 0, kMoeSemW);
    b.end_loop();
  };
  g.group_end = [] {};
  g.load = [&](int idx, int64_t ahead, int par) {
    sim::Addr src = idx >= 0 ? MoeB::at(ahead * tm * s.xs, {{gA, 1}, {gRow0, s.xs}, {int16_t(idx), tm * s.xs}})
                             : MoeB::at(ahead * tm * s.xs, {{gA, 1}, {gRow0, s.xs}});
    b.dma(MoeB::vmem_at(MoeB::at(xb, {{int16_t(par), xstep}})), MoeB::hbm_at(src),
          {.rows = tm, .row_bytes = rb, .src_row_stride = s.xs}, 1 % cfg.dma.engines, kMoeSemX);
  };
  // Full tile: multiply, round into the free output buffer, store asynchronously. The tile's
  // first row: row0 + index * tm (the loop's gT, or nfull - 1 for the last one, gNfullM1).
  auto store_full = [&](int idx_reg) {
    next_out_buffer(b);
    b.unary(sim::Op::vcast, MoeB::vmem(MoeB::at(ob, {{gOP, ostep}}), dt, N),
            MoeB::vmem(MoeB::at(acc), sim::DType::f32, N), tm, N);
    b.dma(MoeB::hbm_at(MoeB::at(0, {{gOut, 1}, {gOff, es}, {int16_t(idx_reg), tm * orb}})),
          MoeB::vmem_at(MoeB::at(ob, {{gOP, ostep}})), {.rows = tm, .row_bytes = N * es, .dst_row_stride = orb}, 0,
          kMoeSemOut);
    advance_out_buffer(b);
  };
  g.compute = [&](int par, int idx) {
    multiply([&](int64_t off) { return MoeB::at(xb + off, {{int16_t(par), xstep}}); }, tm, false);
    store_full(idx);
  };
  g.tail_load = [&] {
    b.loop_reg(gJ, gNtail);
    b.dma(MoeB::vmem_at(MoeB::at(xt, {{gJ, rb}})), MoeB::hbm_at(MoeB::at(0, {{gA, 1}, {gTailRow0, s.xs}, {gJ, s.xs}})),
          {.rows = 1, .row_bytes = rb}, 1 % cfg.dma.engines, kMoeSemTail);
    b.end_loop();
  };
  g.tail_compute = [&] {
    b.loop_reg(gJ, gNtail);
    b.wait(kMoeSemTail);
    b.end_loop();
    b.loop_reg(gBlk, gTailBlocks);
    multiply([&](int64_t off) { return MoeB::at(xt + off, {{gBlk, R * K * es}}); }, std::min(R, tm), true);
    b.end_loop();
    b.unary(sim::Op::vcast, MoeB::vmem(MoeB::at(ot), dt, N), MoeB::vmem(MoeB::at(acc), sim::DType::f32, N), tm, N);
    b.loop_reg(gJ, gNtail);
    b.dma(MoeB::hbm_at(MoeB::at(0, {{gOut, 1}, {gTailOff, es}, {gJ, orb}})),
          MoeB::vmem_at(MoeB::at(ot, {{gJ, N * es}})), {.rows = 1, .row_bytes = N * es}, 0, kMoeSemTailOut);
    b.end_loop();
    b.loop_reg(gJ, gNtail);
    b.wait(kMoeSemTailOut);
    b.end_loop();
  };
  emit_grouped(b, s.E * (s.N / s.tn), g);
  return b.finish();
}

struct WgSpec {
  int64_t E = 0, P = 0, Q = 0, tm = 0, tn = 0;  // out[e] [P, Q] = L_e^T R_e; tn: column panel of R (divides Q)
  int64_t ls = 0, rs = 0;               // bytes: row strides of L and R
  DType dt = DType::f32;
};

int64_t wg_vmem(const WgSpec& s, int64_t es) {
  return 3 * moe_align(s.tm * s.P * es) + 3 * moe_align(s.tm * s.tn * es) + moe_align(s.P * s.tn * 4) +
         2 * moe_align(s.P * s.tn * es);
}

sim::Program make_wg_program(const sim::ChipConfig& cfg, const WgSpec& s) {
  const sim::DType dt = moe_sim_dtype(s.dt);
  const sim::MxuMode mode = moe_mode(s.dt);
  // Q below is the panel's width: each table entry accumulates one column panel of one group.
  const int64_t es = sim::dtype_size(dt), P = s.P, Q = s.tn, tm = s.tm, R = cfg.mxu.rows, C = cfg.mxu.cols;
  int64_t at = 0;
  auto take = [&](int64_t bytes) { const int64_t o = at; at += moe_align(bytes); return o; };
  const int64_t lb = take(tm * P * es), lstep = take(tm * P * es) - lb, lt = take(tm * P * es);
  const int64_t rb = take(tm * Q * es), rstep = take(tm * Q * es) - rb, rt = take(tm * Q * es);
  const int64_t acc = take(P * Q * 4);
  const int64_t ob = take(P * Q * es), ostep = take(P * Q * es) - ob;
  MoeB b(fmt::format("grouped_matmul_weight_grad_{}x{}", P, Q));
  // acc += L_tile^T R_tile: R's rows (the group's tokens) in chunks of R as the weights, L_tile^T
  // streamed as a strided operand (rows: L's columns).
  auto multiply = [&](const std::function<sim::Addr(int64_t)>& laddr, const std::function<sim::Addr(int64_t)>& raddr) {
    for (int64_t j = 0; j * C < Q; ++j) {
      const int64_t nn = std::min(C, Q - j * C);
      const int mxu = int(j % cfg.mxu.count);
      for (int64_t c = 0; c * R < tm; ++c) {
        const int64_t kk = std::min(R, tm - c * R);
        b.mxu_load_weights(mxu, MoeB::vmem(raddr((c * R * Q + j * C) * es), dt, Q), kk, nn, mode);
        b.mxu_matmul(mxu, MoeB::vmem(MoeB::at(acc + j * C * 4), sim::DType::f32, Q),
                     MoeB::vmem(laddr(c * R * P * es), dt, 1, P), P, kk, nn, true, mode);
      }
    }
  };
  GroupedEmit g;
  g.loads_per_tile = 2;
  g.group_begin = [&] { b.fill(MoeB::vmem(MoeB::at(acc), sim::DType::f32, Q), 0, P, Q); };
  g.group_end = [&] {
    next_out_buffer(b);
    b.unary(sim::Op::vcast, MoeB::vmem(MoeB::at(ob, {{gOP, ostep}}), dt, Q), MoeB::vmem(MoeB::at(acc), sim::DType::f32, Q),
            P, Q);
    b.dma(MoeB::hbm_at(MoeB::at(0, {{gOut, 1}, {gGrp, P * s.Q * es}, {gPan, Q * es}})),
          MoeB::vmem_at(MoeB::at(ob, {{gOP, ostep}})), {.rows = P, .row_bytes = Q * es, .dst_row_stride = s.Q * es}, 0,
          kMoeSemOut);
    advance_out_buffer(b);
  };
  g.load = [&](int idx, int64_t ahead, int par) {
    for (int side = 0; side < 2; ++side) {
      const int64_t stride = side ? s.rs : s.ls, width = (side ? Q : P) * es;
      // L's rows from row0; R's panel from its element offset (row0, panel).
      const sim::AddrTerm first = side ? sim::AddrTerm{gOff, es} : sim::AddrTerm{gRow0, stride};
      const int16_t base = side ? gB : gA;
      sim::Addr src = idx >= 0 ? MoeB::at(ahead * tm * stride, {{base, 1}, first, {int16_t(idx), tm * stride}})
                               : MoeB::at(ahead * tm * stride, {{base, 1}, first});
      b.dma(MoeB::vmem_at(MoeB::at(side ? rb : lb, {{int16_t(par), side ? rstep : lstep}})), MoeB::hbm_at(src),
            {.rows = tm, .row_bytes = width, .src_row_stride = stride}, 1 % cfg.dma.engines, kMoeSemX);
    }
  };
  g.compute = [&](int par, int) {
    multiply([&](int64_t off) { return MoeB::at(lb + off, {{int16_t(par), lstep}}); },
             [&](int64_t off) { return MoeB::at(rb + off, {{int16_t(par), rstep}}); });
  };
  // The tail tile is zeroed first, so its rows past the group's end add nothing.
  g.tail_load = [&] {
    b.loop_reg(gH, gHasTail);
    b.fill(MoeB::vmem(MoeB::at(lt), dt, P), 0, tm, P);
    b.fill(MoeB::vmem(MoeB::at(rt), dt, Q), 0, tm, Q);
    b.end_loop();
    b.loop_reg(gJ, gNtail);
    b.dma(MoeB::vmem_at(MoeB::at(lt, {{gJ, P * es}})), MoeB::hbm_at(MoeB::at(0, {{gA, 1}, {gTailRow0, s.ls}, {gJ, s.ls}})),
          {.rows = 1, .row_bytes = P * es}, 0, kMoeSemTail);
    b.dma(MoeB::vmem_at(MoeB::at(rt, {{gJ, Q * es}})), MoeB::hbm_at(MoeB::at(0, {{gB, 1}, {gTailOff, es}, {gJ, s.rs}})),
          {.rows = 1, .row_bytes = Q * es}, 1 % cfg.dma.engines, kMoeSemTail);
    b.end_loop();
  };
  g.tail_compute = [&] {
    b.loop_reg(gJ, gNtail);
    b.wait(kMoeSemTail, 2);
    b.end_loop();
    // Only the tail's blocks of R rows (the last one zero-padded) go through the MXUs.
    b.loop_reg(gBlk, gTailBlocks);
    for (int64_t j = 0; j * C < Q; ++j) {
      const int64_t nn = std::min(C, Q - j * C), kk = std::min(R, tm);
      const int mxu = int(j % cfg.mxu.count);
      b.mxu_load_weights(mxu, MoeB::vmem(MoeB::at(rt + j * C * es, {{gBlk, R * Q * es}}), dt, Q), kk, nn, mode);
      b.mxu_matmul(mxu, MoeB::vmem(MoeB::at(acc + j * C * 4), sim::DType::f32, Q),
                   MoeB::vmem(MoeB::at(lt, {{gBlk, R * P * es}}), dt, 1, P), P, kk, nn, true, mode);
    }
    b.end_loop();
  };
  emit_grouped(b, s.E * (s.Q / s.tn), g);
  return b.finish();
}

// The group sizes read on the host and checked as the cpu kernel does.
std::vector<int64_t> moe_read_groups(const char* op, const Tensor& gs, int64_t rows) {
  const std::vector<int64_t> n = gs.to_vector<int64_t>();
  ops::check_group_counts(op, n, rows);
  return n;
}

// The table: kGroupWords i32 words per (group, panel) entry; the panelled matrix has `row_elems`
// elements between rows and `width` columns in panels of tn. Empty when an offset overflows i32.
std::vector<int32_t> group_table(const std::vector<int64_t>& n, int64_t tm, int64_t tn, int64_t width,
                                 int64_t row_elems, int64_t block) {
  const int64_t rows = std::accumulate(n.begin(), n.end(), int64_t{0}), panels = width / tn;
  if (rows * row_elems + width >= (int64_t{1} << 31)) return {};
  std::vector<int32_t> t;
  int64_t row = 0;
  for (size_t e = 0; e < n.size(); ++e) {
    const int64_t full = n[e] / tm, tail = n[e] % tm, tail0 = row + full * tm;
    for (int64_t p = 0; p < panels; ++p) {
      const bool next = e + 1 < n.size() || p + 1 < panels;
      for (int64_t v : {row, full, std::max<int64_t>(full - 1, 0), int64_t(full > 0), tail0, tail, int64_t(tail > 0),
                        int64_t(next), int64_t(e), p, row * row_elems + p * tn, tail0 * row_elems + p * tn,
                        (tail + block - 1) / block})
        t.push_back(int32_t(v));
    }
    row += n[e];
  }
  return t;
}

// The widest column panel (the width, halved while even) and for it the largest row tile (4, 2
// or 1 MXU heights) whose buffers fit 90% of VMEM; tm = 0 if none.
template <class Spec, class Fn>
void choose_tiles(const sim::ChipConfig& cfg, Spec& s, int64_t width, int64_t es, Fn vmem) {
  for (s.tn = width; s.tn > 0; s.tn = s.tn % 2 ? 0 : s.tn / 2)
    for (int64_t f : {4, 2, 1}) {
      s.tm = f * cfg.mxu.rows;
      if (vmem(s, es) <= int64_t(cfg.memory.vmem_bytes) * 9 / 10) return;
    }
  s.tm = 0;
}

bool grouped_matmul_chip(const ops::KernelArgs& a) {
  const Tensor &x = a.inputs[0], &w = a.inputs[1], &gs = a.inputs[2];
  const Tensor& out = a.outputs[0];
  const bool tw = a.attrs.get_bool("transpose_w");
  const DType dt = x.dtype();
  if (!moe_float(dt) || w.dtype() != dt || out.dtype() != dt || x.size(1) == 0 || (x.size(0) && x.strides()[1] != 1) ||
      w.strides()[2] != 1 || !out.is_contiguous() || w.size(0) == 0)
    return false;
  const std::vector<int64_t> n = moe_read_groups("grouped_matmul", gs, x.size(0));
  if (out.numel() == 0) return true;
  const Device dev = out.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  const int64_t es = int64_t(x.element_size());
  GmmSpec s{.E = w.size(0), .K = x.size(1), .N = out.size(1), .tm = 0, .tn = 0, .xs = x.strides()[0] * es,
            .ws0 = w.strides()[0] * es, .ws1 = w.strides()[1] * es, .tw = tw, .dt = dt};
  choose_tiles(cfg, s, s.N, es, gmm_vmem);
  if (s.tm == 0) return false;
  const std::vector<int32_t> table = group_table(n, s.tm, s.tn, s.N, s.N, cfg.mxu.rows);
  if (table.empty()) return false;
  const Tensor tab = from_vector(table, Shape{int64_t(table.size())}, TensorOptions(DType::i32, dev));
  const LoadedProgram lp = cached_program(
      dev, fmt::format("grouped_matmul:{}:{}x{}x{}:tm{}:tn{}:{}:{}:{}:{}:{}", s.E, s.K, s.N, tw, s.tm, s.tn, s.xs, s.ws0,
                       s.ws1, dtype_name(dt), sim::mxu_mode_name(moe_mode(dt))),
      [&] { return make_gmm_program(cfg, s); });
  launch(dev, lp, "grouped_matmul", {hbm_address(x), hbm_address(w), hbm_address(out), hbm_address(tab)});
  return true;
}

bool weight_grad_chip(const ops::KernelArgs& a) {
  const Tensor &x = a.inputs[0], &dy = a.inputs[1], &gs = a.inputs[2];
  const Tensor& out = a.outputs[0];
  const bool tw = a.attrs.get_bool("transpose_w");
  const DType dt = x.dtype();
  if (!moe_float(dt) || dy.dtype() != dt || out.dtype() != dt || !out.is_contiguous() || gs.size(0) == 0 ||
      x.size(1) == 0 || dy.size(1) == 0 || (x.size(0) && (x.strides()[1] != 1 || dy.strides()[1] != 1)))
    return false;
  const Tensor& L = tw ? dy : x;
  const Tensor& R = tw ? x : dy;
  const std::vector<int64_t> n = moe_read_groups("grouped_matmul_weight_grad", gs, x.size(0));
  const Device dev = out.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  const int64_t es = int64_t(x.element_size());
  WgSpec s{.E = gs.size(0), .P = L.size(1), .Q = R.size(1), .tm = 0, .tn = 0, .ls = L.strides()[0] * es,
           .rs = R.strides()[0] * es, .dt = dt};
  choose_tiles(cfg, s, s.Q, es, wg_vmem);
  if (s.tm == 0) return false;
  const std::vector<int32_t> table = group_table(n, s.tm, s.tn, s.Q, R.size(0) ? R.strides()[0] : s.Q, cfg.mxu.rows);
  if (table.empty()) return false;
  const Tensor tab = from_vector(table, Shape{int64_t(table.size())}, TensorOptions(DType::i32, dev));
  const LoadedProgram lp = cached_program(
      dev, fmt::format("grouped_matmul_weight_grad:{}:{}x{}:tm{}:tn{}:{}:{}:{}:{}", s.E, s.P, s.Q, s.tm, s.tn, s.ls,
                       s.rs, dtype_name(dt), sim::mxu_mode_name(moe_mode(dt))),
      [&] { return make_wg_program(cfg, s); });
  launch(dev, lp, "grouped_matmul_weight_grad", {moe_addr(L), moe_addr(R), hbm_address(out), hbm_address(tab)});
  return true;
}

// The order of a permute / unpermute, read and checked to be a permutation of [0, S).
std::vector<int32_t> moe_read_order(const char* op, const Tensor& order) {
  const std::vector<int64_t> v = order.to_vector<int64_t>();
  const auto s = int64_t(v.size());
  std::vector<uint8_t> seen(v.size(), 0);
  std::vector<int32_t> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    TPU_CHECK(v[i] >= 0 && v[i] < s, "{}: index {} is out of range for the order's own length {}", op, v[i], s);
    TPU_CHECK(!seen[size_t(v[i])], "{}: order holds {} twice; it must be a permutation of [0, {}) (as moe_sort makes it)",
              op, v[i], s);
    seen[size_t(v[i])] = 1;
    r[i] = int32_t(v[i]);
  }
  return r;
}

// out[i] = x[src[i]]: r0 x, r1 src table, r2 out, r3 rows.
sim::Program make_permute_program(int64_t rb, int64_t xs) {
  enum { rX = 0, rSrc, rOut, rN, rI, rRow };
  MoeB b(fmt::format("moe_permute_{}", rb));
  b.loop_reg(rI, rN);
  b.sload(rRow, MoeB::hbm_at(MoeB::at(0, {{rSrc, 1}, {rI, 4}})));
  b.dma(MoeB::hbm_at(MoeB::at(0, {{rOut, 1}, {rI, rb}})), MoeB::hbm_at(MoeB::at(0, {{rX, 1}, {rRow, xs}})),
        {.rows = 1, .row_bytes = rb}, 0, 0);
  b.end_loop();
  b.loop_reg(rI, rN);
  b.wait(0);
  b.end_loop();
  b.fence();
  return b.finish();
}

bool moe_permute_chip(const ops::KernelArgs& a) {
  const Tensor &x = a.inputs[0], &order = a.inputs[1];
  const Tensor& out = a.outputs[0];
  const int64_t k = a.attrs.get_int("top_k");
  if (!out.is_contiguous() || (x.numel() && x.strides()[1] != 1)) return false;
  const std::vector<int32_t> ord = moe_read_order("moe_permute", order);
  if (out.numel() == 0) return true;
  std::vector<int32_t> src(ord.size());
  for (size_t i = 0; i < ord.size(); ++i) src[i] = int32_t(ord[i] / k);
  const Device dev = out.device();
  const Tensor tab = from_vector(src, Shape{int64_t(src.size())}, TensorOptions(DType::i32, dev));
  const int64_t es = int64_t(x.element_size()), rb = x.size(1) * es, xs = x.strides()[0] * es;
  const LoadedProgram lp = cached_program(dev, fmt::format("moe_permute:{}:{}", rb, xs),
                                          [&] { return make_permute_program(rb, xs); });
  launch(dev, lp, "moe_permute", {hbm_address(x), hbm_address(tab), hbm_address(out), int64_t(src.size())});
  return true;
}

struct UnpermuteSpec {
  int64_t k = 1, H = 0, ys = 0, ws = 0;  // ys, ws: row strides in bytes
  DType ydt = DType::f32, wdt = DType::f32, odt = DType::f32;
  bool hw = false;
};

// out[t] = sum_j w[t, j] y[inv[t k + j]]: r0 y, r1 inv table, r2 w, r3 out, r4 tokens - 1,
// r5 (tokens > 0). Token t + 1's rows load while token t is summed.
sim::Program make_unpermute_program(const sim::ChipConfig& cfg, const UnpermuteSpec& s) {
  enum { rY = 0, rInv, rW, rOut, rNm1, rHas, rT, rH, rRow, rP, rNP, rOC, rOP };
  const sim::DType ydt = moe_sim_dtype(s.ydt), wdt = moe_sim_dtype(s.wdt), odt = moe_sim_dtype(s.odt);
  const int64_t ye = sim::dtype_size(ydt), oe = sim::dtype_size(odt), we = sim::dtype_size(wdt), H = s.H, k = s.k;
  int64_t at = 0;
  auto take = [&](int64_t bytes) { const int64_t o = at; at += moe_align(bytes); return o; };
  const int64_t yrow = moe_align(H * ye), yb = take(2 * k * yrow), ystep = k * yrow;
  const int64_t wb = take(2 * 64), wstep = 64, wf = take(k * 4);
  const int64_t acc = take(H * 4), tmp = take(H * 4);
  const int64_t ob = take(H * oe), ostep = take(H * oe) - ob;
  MoeB b(fmt::format("moe_unpermute_{}x{}", k, H));
  const int loads = int(k + (s.hw ? 1 : 0));
  auto load = [&](int idx, int64_t ahead, int par) {
    for (int64_t j = 0; j < k; ++j) {
      sim::Addr slot = idx >= 0 ? MoeB::at((ahead * k + j) * 4, {{rInv, 1}, {int16_t(idx), 4 * k}})
                                : MoeB::at((ahead * k + j) * 4, {{rInv, 1}});
      b.sload(rRow, MoeB::hbm_at(slot));
      b.dma(MoeB::vmem_at(MoeB::at(yb + j * yrow, {{int16_t(par), ystep}})), MoeB::hbm_at(MoeB::at(0, {{rY, 1}, {rRow, s.ys}})),
            {.rows = 1, .row_bytes = H * ye}, 1 % cfg.dma.engines, kMoeSemX);
    }
    if (s.hw) {
      sim::Addr src = idx >= 0 ? MoeB::at(ahead * s.ws, {{rW, 1}, {int16_t(idx), s.ws}}) : MoeB::at(ahead * s.ws, {{rW, 1}});
      b.dma(MoeB::vmem_at(MoeB::at(wb, {{int16_t(par), wstep}})), MoeB::hbm_at(src), {.rows = 1, .row_bytes = k * we},
            1 % cfg.dma.engines, kMoeSemX);
    }
  };
  auto compute = [&](int par, int tok) {
    b.wait(kMoeSemX, loads);
    auto y = [&](int64_t j) { return MoeB::vmem(MoeB::at(yb + j * yrow, {{int16_t(par), ystep}}), ydt); };
    const sim::Operand A = MoeB::vmem(MoeB::at(acc), sim::DType::f32), Tm = MoeB::vmem(MoeB::at(tmp), sim::DType::f32);
    if (s.hw) b.unary(sim::Op::vcast, MoeB::vmem(MoeB::at(wf), sim::DType::f32), MoeB::vmem(MoeB::at(wb, {{int16_t(par), wstep}}), wdt), 1, k);
    auto wj = [&](int64_t j) { return MoeB::vmem(MoeB::at(wf + j * 4), sim::DType::f32, 0, 0); };
    // In the cpu kernel's order: acc = 0 + w_0 y_0, then acc += w_j y_j.
    if (s.hw) b.binary(sim::Op::vmul, A, y(0), wj(0), 1, H);
    else b.unary(sim::Op::vcast, A, y(0), 1, H);
    for (int64_t j = 1; j < k; ++j) {
      if (s.hw) {
        b.binary(sim::Op::vmul, Tm, y(j), wj(j), 1, H);
        b.binary(sim::Op::vadd, A, A, Tm, 1, H);
      } else {
        b.binary(sim::Op::vadd, A, A, y(j), 1, H);
      }
    }
    b.wait(kMoeSemOut);
    b.unary(sim::Op::vcast, MoeB::vmem(MoeB::at(ob, {{rOP, ostep}}), odt), A, 1, H);
    b.dma(MoeB::hbm_at(MoeB::at(0, {{rOut, 1}, {int16_t(tok), H * oe}})), MoeB::vmem_at(MoeB::at(ob, {{rOP, ostep}})),
          {.rows = 1, .row_bytes = H * oe}, 0, kMoeSemOut);
    b.sadd(rOC, rOC, 1);
    b.smod(rOP, rOC, 2);
  };
  b.sset(rOC, 0);
  b.sset(rOP, 0);
  b.signal(kMoeSemOut, 2);
  b.loop_reg(rH, rHas);
  b.sset(rP, 0);
  load(-1, 0, rP);
  b.end_loop();
  b.loop_reg(rT, rNm1);
  b.smod(rP, rT, 2);
  b.sadd(rNP, rT, 1);
  b.smod(rNP, rNP, 2);
  load(rT, 1, rNP);
  compute(rP, rT);
  b.end_loop();
  b.loop_reg(rH, rHas);
  b.smod(rP, rNm1, 2);
  compute(rP, rNm1);
  b.end_loop();
  b.wait(kMoeSemOut, 2);
  b.fence();
  return b.finish();
}

bool moe_unpermute_chip(const ops::KernelArgs& a) {
  const Tensor &y = a.inputs[0], &order = a.inputs[1], &w = a.inputs[2];
  const Tensor& out = a.outputs[0];
  UnpermuteSpec s;
  s.k = a.attrs.get_int("top_k");
  s.hw = a.attrs.get_bool("has_weights");
  s.ydt = y.dtype();
  s.wdt = s.hw ? w.dtype() : DType::f32;
  s.odt = out.dtype();
  if (!moe_float(s.ydt) || !moe_float(s.wdt) || !moe_float(s.odt) || !out.is_contiguous() ||
      (y.numel() && y.strides()[1] != 1) || (s.hw && w.numel() && w.strides()[1] != 1) || s.k * 4 > 64)
    return false;
  const std::vector<int32_t> ord = moe_read_order("moe_unpermute", order);
  if (out.numel() == 0) return true;
  std::vector<int32_t> inv(ord.size());  // the row of y holding slot t * k + j
  for (size_t i = 0; i < ord.size(); ++i) inv[size_t(ord[i])] = int32_t(i);
  const Device dev = out.device();
  const int64_t T = out.size(0);
  s.H = y.size(1);
  s.ys = y.strides()[0] * int64_t(y.element_size());
  s.ws = s.hw ? w.strides()[0] * int64_t(w.element_size()) : 0;
  const Tensor tab = from_vector(inv, Shape{int64_t(inv.size())}, TensorOptions(DType::i32, dev));
  const LoadedProgram lp = cached_program(
      dev, fmt::format("moe_unpermute:{}:{}:{}:{}:{}:{}:{}:{}", s.k, s.H, s.ys, s.ws, s.hw, dtype_name(s.ydt),
                       dtype_name(s.wdt), dtype_name(s.odt)),
      [&] { return make_unpermute_program(chip_config(dev), s); });
  launch(dev, lp, "moe_unpermute",
         {hbm_address(y), hbm_address(tab), s.hw ? hbm_address(w) : 0, hbm_address(out), T - 1, int64_t(T > 0)});
  return true;
}

const Lowering kGroupedMatmulRule{.eager = &grouped_matmul_chip};
const Lowering kWeightGradRule{.eager = &weight_grad_chip};
const Lowering kPermuteRule{.eager = &moe_permute_chip};
const Lowering kUnpermuteRule{.eager = &moe_unpermute_chip};

[[maybe_unused]] const bool g_moe_registered = [] {
  install_lowering("grouped_matmul", &kGroupedMatmulRule);
  install_lowering("grouped_matmul_weight_grad", &kWeightGradRule);
  install_lowering("moe_permute", &kPermuteRule);
  install_lowering("moe_unpermute", &kUnpermuteRule);
  return true;
}();

}  // namespace
}  // namespace tpu::codegen
