// The fused mixture-of-experts layer moe_ffn(x [T, H], ids [T, k], w [T, k], gate_up [E, 2F, H],
// down [E, O, F]) -> [T, O] (graph pass fuse_moe) as one chip program over all experts:
//
//   out[t] = sum over j, in expert order, of w[t, j] down[e] (silu(g) * u),
//            g = gate_up[e][:F] x[t], u = gate_up[e][F:] x[t], e = ids[t, j]
//
// as the cpu kernel of fuse_moe.cpp computes it (f32 products and accumulation, silu(g) * u
// rounded to the dtype before the down product). The routing is data: the host reads the ids
// (small), checks them as the cpu kernel does, sorts the slots by expert (moe_sort's stable
// order) and uploads one i32 table: per entry (one expert's row tile of up to tm slots; empty
// experts have none) the expert, its slots' first position, row count and MXU blocks; per
// position the token and the slot. The program walks the entries with `loopr` and reads the
// words with `sld`, so one program per shape serves every routing and every token count.
//
// Per entry: its tokens' rows of x are gathered by row DMAs into a VMEM tile (the next entry's
// while this one computes); the intermediate width F is walked in chunks of th columns whose
// gate, up and down weights are double-buffered (the next chunk's, or the next entry's first,
// load while this one multiplies); per block of one MXU height the MXUs compute
// [gate | up] = x_tile [g_c; u_c]^T in f32, the vector unit silu(g) * u, and the MXUs add
// act down[e][:, chunk]^T into the tile's f32 result y. Then each row of y, times its slot's
// routing weight, is added into the token's row of an f32 accumulator of the output in VMEM
// (one vfma per row). At the end the accumulator is cast and stored. No [T k, H] or [T k, F]
// array exists in HBM: HBM traffic is x's gathered rows, the weights of the experts that have
// tokens (once per row tile) and the output.
//
// The accumulator holds up to `tcap` tokens (from the VMEM left after the other buffers); a
// larger T runs the same program once per chunk of tcap tokens. f32 (MXU mode from
// set_float32_matmul_precision) and bf16; anything else (f16, strided inner dims, shapes whose
// buffers do not fit VMEM) runs the chain op by op (counted: moe_ffn_chain_fallbacks()).
#include "codegen/moe_ffn_kernel.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "codegen/precision.h"
#include "codegen/vector_expr.h"
#include "graph/passes/moe_ffn.h"
#include "sim/builder.h"
#include "tpucore/core/log.h"
#include "tpucore/ops.h"

namespace tpu::codegen {
namespace {

using FfnB = sim::ProgramBuilder;

std::atomic<uint64_t> g_chain_fallbacks{0};

int64_t ffn_align(int64_t v) { return (v + 63) / 64 * 64; }

// Table layout (i32 words). Header: entries, T, blocks of the accumulator (ceil(T / R)), full
// output blocks (T / R), tail rows (T % R), has a tail, the tail's first row, has entries.
constexpr int64_t kHeaderWords = 8;
// Per entry: expert, byte offset of its first position (from the table's start), rows, MXU
// blocks, has a next entry; padding. One zero entry follows the last (read as "next").
constexpr int64_t kEntryWords = 8;
// Per position (slots in expert order): token, slot (t k + j).
constexpr int64_t kPosWords = 2;

enum FfnReg : int {
  rX = 0, rW, rW1, rW2, rOut, rTab,  // arguments
  rI, rE, rPB, rNR, rNB, rHN, rNE, rNPB, rNNR, rC, rBlk, rJ, rTok, rSlot, rStep, rPar, rNPar, rXP, rNXP, rH, rCnt, rCnt2,
  kFfnRegs
};
enum FfnSem : int { sX = 0, sW1, sW2, sWr, sOut, sTail, kFfnSems };

struct FfnSpec {
  int64_t H = 0, F = 0, O = 0, k = 0;  // input width, intermediate width, output width, top-k
  int64_t tm = 0, th = 0, tcap = 0;    // slots per entry, intermediate columns per chunk, tokens per launch
  int64_t xs = 0, ws = 0, g0 = 0, g1 = 0, d0 = 0, d1 = 0;  // bytes: row strides of x, w; gate_up, down dims 0, 1
  DType dt = DType::f32;
};

struct FfnVmem {
  int64_t xt = 0, xstep = 0, w1 = 0, w1step = 0, w2 = 0, w2step = 0, h = 0, act = 0, y = 0, ystep = 0, acc = 0,
          wraw = 0, ob = 0, ostep = 0, ot = 0, total = 0;
  TempArena arena;
};

// silu(g) * u: the activation between the two products.
VecExpr ffn_activation() {
  VecExpr e;
  const VecRef g = e.input(0), u = e.input(1);
  e.result = e.op(sim::Op::vmul, vec_silu(e, g), u);
  return e;
}

FfnVmem ffn_plan(const sim::ChipConfig& cfg, const FfnSpec& s) {
  const int64_t es = s.dt == DType::bf16 ? 2 : 4, R = cfg.mxu.rows;
  FfnVmem v;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t o = at;
    at += ffn_align(bytes);
    return o;
  };
  v.xt = take(s.tm * s.H * es);
  v.xstep = take(s.tm * s.H * es) - v.xt;
  v.w1 = take(2 * s.th * s.H * es);
  v.w1step = take(2 * s.th * s.H * es) - v.w1;
  v.w2 = take(s.O * s.th * es);
  v.w2step = take(s.O * s.th * es) - v.w2;
  v.h = take(s.tm * 2 * s.th * 4);
  v.act = take(s.tm * s.th * es);
  v.y = take(s.tm * s.O * 4);
  v.ystep = take(s.tm * s.O * 4) - v.y;
  v.ob = take(R * s.O * es);
  v.ostep = take(R * s.O * es) - v.ob;
  v.ot = take(R * s.O * es);
  const sim::DType f32 = sim::DType::f32;
  const int slots = vec_temp_slots(ffn_activation(), {f32, f32});
  v.arena = {at, ffn_align(R * s.th * 4), s.th, slots};
  at += v.arena.slot_bytes * slots;
  v.wraw = take(s.tcap * s.k * es);
  v.acc = take(s.tcap * s.O * 4);
  v.total = at;
  return v;
}

// Tokens per launch worth preferring a narrower chunk or tile for (a prefill's weights are read
// once per launch).
constexpr int64_t kFfnPreferTokens = 1024, kFfnMaxTokens = 8192;

// The widest chunk (F, halved while even) and for it the largest tile (4, 2 or 1 MXU heights)
// whose buffers leave room for kFfnPreferTokens tokens in 90% of VMEM, else for one block of
// R tokens; tm = 0 if none. tcap: as many tokens as the rest holds (at most kFfnMaxTokens).
void ffn_choose_tiles(const sim::ChipConfig& cfg, FfnSpec& s) {
  const int64_t budget = int64_t(cfg.memory.vmem_bytes) * 9 / 10, R = cfg.mxu.rows;
  const int64_t es = s.dt == DType::bf16 ? 2 : 4, per_token = s.O * 4 + s.k * es;
  for (int64_t want : {kFfnPreferTokens, R})
    for (s.th = s.F; s.th > 0; s.th = s.th % 2 ? 0 : s.th / 2)
      for (int64_t f : {4, 2, 1}) {
        s.tm = f * R;
        s.tcap = 0;
        const int64_t fixed = ffn_plan(cfg, s).total + 128;  // + the alignment of the two token buffers
        s.tcap = std::min(kFfnMaxTokens, std::max<int64_t>(budget - fixed, 0) / per_token) / R * R;
        if (s.tcap >= std::max(want / R * R, R) && ffn_plan(cfg, s).total <= budget) return;
      }
  s.tm = s.th = s.tcap = 0;
}

sim::Program make_ffn_program(const sim::ChipConfig& cfg, const FfnSpec& s) {
  const FfnVmem v = ffn_plan(cfg, s);
  const sim::DType dt = s.dt == DType::bf16 ? sim::DType::bf16 : sim::DType::f32, f32 = sim::DType::f32;
  const sim::MxuMode mode = s.dt == DType::bf16 ? sim::MxuMode::bf16 : f32_matmul_mode();
  const int64_t es = sim::dtype_size(dt), R = cfg.mxu.rows, C = cfg.mxu.cols, H = s.H, O = s.O, th = s.th;
  const int64_t NC = s.F / th;
  const int nq = cfg.dma.engines, qW = 0, qX = 1 % nq, qW2 = 2 % nq, qOut = 3 % nq;
  // A row of the output as a [rr, cc] matrix of whole vector rows when it divides (one vfma or
  // cast per row then fills the sublanes).
  const int64_t lanes = cfg.vpu.lanes, cc = O % lanes == 0 ? lanes : O, rr = O / cc;
  auto word = [](int64_t w) { return w * 4; };
  auto hdr = [&](int64_t w) { return FfnB::hbm_at(FfnB::at(word(w), {{rTab, 1}})); };
  // Word w of entry I (+ ahead).
  auto entry = [&](int64_t ahead, int64_t w) {
    return FfnB::hbm_at(FfnB::at(word(kHeaderWords + ahead * kEntryWords + w), {{rTab, 1}, {rI, word(kEntryWords)}}));
  };
  FfnB b(fmt::format("moe_ffn_{}x{}x{}", H, s.F, O));

  // Gathers the rows of an entry (first position's byte offset in pb, count in nr) into x
  // buffer `par`.
  auto gather = [&](int pb, int nr, int par) {
    b.loop_reg(rJ, nr);
    b.sload(rTok, FfnB::hbm_at(FfnB::at(0, {{rTab, 1}, {int16_t(pb), 1}, {rJ, word(kPosWords)}})));
    b.dma(FfnB::vmem_at(FfnB::at(v.xt, {{int16_t(par), v.xstep}, {rJ, H * es}})),
          FfnB::hbm_at(FfnB::at(0, {{rX, 1}, {rTok, s.xs}})), {.rows = 1, .row_bytes = H * es}, qX, sX);
    b.end_loop();
  };
  // Loads chunk (creg + ahead, or `ahead` when creg < 0) of expert `e`'s weights into buffer `par`:
  // the gate rows and the up rows of gate_up ([th, H] each, stacked), the down columns ([O, th]).
  auto load_weights = [&](int e, int creg, int64_t ahead, int par) {
    auto src = [&](int base, int64_t off, int64_t scale, int64_t e_stride) {
      return creg >= 0 ? FfnB::at(off + ahead * scale, {{int16_t(base), 1}, {int16_t(e), e_stride}, {int16_t(creg), scale}})
                       : FfnB::at(off + ahead * scale, {{int16_t(base), 1}, {int16_t(e), e_stride}});
    };
    const sim::DmaShape gshape{.rows = th, .row_bytes = H * es, .src_row_stride = s.g1};
    b.dma(FfnB::vmem_at(FfnB::at(v.w1, {{int16_t(par), v.w1step}})), FfnB::hbm_at(src(rW1, 0, th * s.g1, s.g0)), gshape,
          qW, sW1);
    b.dma(FfnB::vmem_at(FfnB::at(v.w1 + th * H * es, {{int16_t(par), v.w1step}})),
          FfnB::hbm_at(src(rW1, s.F * s.g1, th * s.g1, s.g0)), gshape, qW, sW1);
    b.dma(FfnB::vmem_at(FfnB::at(v.w2, {{int16_t(par), v.w2step}})), FfnB::hbm_at(src(rW2, 0, th * es, s.d0)),
          {.rows = O, .row_bytes = th * es, .src_row_stride = s.d1}, qW2, sW2);
  };
  // One block of R rows (rBlk) of the entry's tile through the chunk in weight buffer rPar.
  const VecExpr activation = ffn_activation();
  auto block = [&] {
    // [gate | up] = x_blk [g; u]^T: K (H) chunks outer, so the column chunks of one K chunk run
    // between two accumulating products into the same columns.
    for (int64_t c = 0; c * R < H; ++c)
      for (int64_t j = 0; j * C < 2 * th; ++j) {
        const int64_t kk = std::min(R, H - c * R), nn = std::min(C, 2 * th - j * C);
        const int mxu = int(j % cfg.mxu.count);
        b.mxu_load_weights(mxu, FfnB::vmem(FfnB::at(v.w1 + (j * C * H + c * R) * es, {{rPar, v.w1step}}), dt, 1, H), kk,
                           nn, mode);
        b.mxu_matmul(mxu, FfnB::vmem(FfnB::at(v.h + j * C * 4, {{rBlk, R * 2 * th * 4}}), f32, 2 * th),
                     FfnB::vmem(FfnB::at(v.xt + c * R * es, {{rXP, v.xstep}, {rBlk, R * H * es}}), dt, H), R, kk, nn,
                     c > 0, mode);
      }
    emit_vec_expr(b, activation,
                  {FfnB::vmem(FfnB::at(v.h, {{rBlk, R * 2 * th * 4}}), f32, 2 * th),
                   FfnB::vmem(FfnB::at(v.h + th * 4, {{rBlk, R * 2 * th * 4}}), f32, 2 * th)},
                  FfnB::vmem(FfnB::at(v.act, {{rBlk, R * th * es}}), dt, th), v.arena, R, th);
    // y_blk += act_blk down[:, chunk]^T
    for (int64_t c = 0; c * R < th; ++c)
      for (int64_t j = 0; j * C < O; ++j) {
        const int64_t kk = std::min(R, th - c * R), nn = std::min(C, O - j * C);
        const int mxu = int(j % cfg.mxu.count);
        b.mxu_load_weights(mxu, FfnB::vmem(FfnB::at(v.w2 + (j * C * th + c * R) * es, {{rPar, v.w2step}}), dt, 1, th),
                           kk, nn, mode);
        b.mxu_matmul(mxu, FfnB::vmem(FfnB::at(v.y + j * C * 4, {{rXP, v.ystep}, {rBlk, R * O * 4}}), f32, O),
                     FfnB::vmem(FfnB::at(v.act + c * R * es, {{rBlk, R * th * es}}), dt, th), R, kk, nn, true, mode);
      }
  };
  // One chunk step: its weights arrived; the next step's weights start (the next chunk of this
  // expert, or for the last chunk the next entry's first); the entry's blocks go through it.
  auto chunk = [&](bool last) {
    b.smod(rPar, rStep, 2);
    b.sadd(rNPar, rStep, 1);
    b.smod(rNPar, rNPar, 2);
    b.wait(sW1, 2);
    b.wait(sW2);
    if (!last) {
      load_weights(rE, rC, 1, rNPar);
    } else {
      b.loop_reg(rH, rHN);
      load_weights(rNE, -1, 0, rNPar);
      b.end_loop();
    }
    b.loop_reg(rBlk, rNB);
    block();
    b.end_loop();
    b.sadd(rStep, rStep, 1);
  };

  b.signal(sOut, 2);
  // The routing weights of the launch's tokens, raw, one row of k per token.
  b.sload(rCnt, hdr(1));
  b.loop_reg(rJ, rCnt);
  b.dma(FfnB::vmem_at(FfnB::at(v.wraw, {{rJ, s.k * es}})), FfnB::hbm_at(FfnB::at(0, {{rW, 1}, {rJ, s.ws}})),
        {.rows = 1, .row_bytes = s.k * es}, qX, sWr);
  b.end_loop();
  // The accumulator's blocks that hold tokens, zeroed.
  b.sload(rCnt2, hdr(2));
  b.loop_reg(rBlk, rCnt2);
  b.fill(FfnB::vmem(FfnB::at(v.acc, {{rBlk, R * O * 4}}), f32, O), 0, R, O);
  b.end_loop();
  // Entry 0's rows and first weights.
  b.sset(rI, 0);
  b.sset(rStep, 0);
  b.sload(rH, hdr(7));
  b.loop_reg(rC, rH);
  b.sload(rE, entry(0, 0));
  b.sload(rPB, entry(0, 1));
  b.sload(rNR, entry(0, 2));
  b.sset(rXP, 0);
  gather(rPB, rNR, rXP);
  b.sset(rPar, 0);
  load_weights(rE, -1, 0, rPar);
  b.end_loop();
  b.loop_reg(rJ, rCnt);
  b.wait(sWr);
  b.end_loop();

  b.sload(rCnt, hdr(0));
  b.loop_reg(rI, rCnt);
  b.sload(rE, entry(0, 0));
  b.sload(rPB, entry(0, 1));
  b.sload(rNR, entry(0, 2));
  b.sload(rNB, entry(0, 3));
  b.sload(rHN, entry(0, 4));
  b.sload(rNE, entry(1, 0));
  b.sload(rNPB, entry(1, 1));
  b.sload(rNNR, entry(1, 2));
  b.smod(rXP, rI, 2);
  b.sadd(rNXP, rI, 1);
  b.smod(rNXP, rNXP, 2);
  b.loop_reg(rJ, rNR);
  b.wait(sX);
  b.end_loop();
  b.loop_reg(rH, rHN);
  gather(rNPB, rNNR, rNXP);
  b.end_loop();
  b.loop_reg(rBlk, rNB);
  b.fill(FfnB::vmem(FfnB::at(v.y, {{rXP, v.ystep}, {rBlk, R * O * 4}}), f32, O), 0, R, O);
  b.end_loop();
  if (NC > 1) {
    b.loop(rC, NC - 1);
    chunk(false);
    b.end_loop();
  }
  chunk(true);
  // acc[token] += w[slot] y[row], row by row in slot order.
  b.loop_reg(rJ, rNR);
  b.sload(rTok, FfnB::hbm_at(FfnB::at(0, {{rTab, 1}, {rPB, 1}, {rJ, word(kPosWords)}})));
  b.sload(rSlot, FfnB::hbm_at(FfnB::at(4, {{rTab, 1}, {rPB, 1}, {rJ, word(kPosWords)}})));
  const sim::Operand acc_row = FfnB::vmem(FfnB::at(v.acc, {{rTok, O * 4}}), f32, cc);
  b.ternary(sim::Op::vfma, acc_row, FfnB::vmem(FfnB::at(v.y, {{rXP, v.ystep}, {rJ, O * 4}}), f32, cc),
            FfnB::vmem(FfnB::at(v.wraw, {{rSlot, es}}), dt, 0, 0), acc_row, rr, cc);
  b.end_loop();
  b.end_loop();

  // The output: full blocks of R rows (one DMA each, from two buffers), then the tail rows.
  b.sset(rStep, 0);
  b.sload(rCnt, hdr(3));
  b.loop_reg(rBlk, rCnt);
  b.wait(sOut);
  b.smod(rPar, rStep, 2);
  b.unary(sim::Op::vcast, FfnB::vmem(FfnB::at(v.ob, {{rPar, v.ostep}}), dt, O),
          FfnB::vmem(FfnB::at(v.acc, {{rBlk, R * O * 4}}), f32, O), R, O);
  b.dma(FfnB::hbm_at(FfnB::at(0, {{rOut, 1}, {rBlk, R * O * es}})), FfnB::vmem_at(FfnB::at(v.ob, {{rPar, v.ostep}})),
        {.rows = 1, .row_bytes = R * O * es}, qOut, sOut);
  b.sadd(rStep, rStep, 1);
  b.end_loop();
  b.sload(rCnt, hdr(4));
  b.sload(rCnt2, hdr(5));
  b.sload(rTok, hdr(6));
  b.loop_reg(rH, rCnt2);
  b.unary(sim::Op::vcast, FfnB::vmem(FfnB::at(v.ot), dt, O), FfnB::vmem(FfnB::at(v.acc, {{rTok, O * 4}}), f32, O), R, O);
  b.loop_reg(rJ, rCnt);
  b.dma(FfnB::hbm_at(FfnB::at(0, {{rOut, 1}, {rTok, O * es}, {rJ, O * es}})), FfnB::vmem_at(FfnB::at(v.ot, {{rJ, O * es}})),
        {.rows = 1, .row_bytes = O * es}, qOut, sTail);
  b.end_loop();
  b.loop_reg(rJ, rCnt);
  b.wait(sTail);
  b.end_loop();
  b.end_loop();
  b.wait(sOut, 2);
  b.fence();
  return b.finish();
}

// The table of one launch (tokens [t0, t0 + n)): the header, the entries of the experts with
// slots there (in expert order, tiles of tm slots in slot order), a zero entry, the positions.
std::vector<int32_t> ffn_table(const std::vector<int32_t>& ids, int64_t experts, int64_t k, int64_t t0, int64_t n,
                               int64_t tm, int64_t R) {
  const int64_t s0 = t0 * k, S = n * k;
  std::vector<int64_t> count(size_t(experts) + 1, 0);
  for (int64_t s = s0; s < s0 + S; ++s) ++count[size_t(ids[size_t(s)]) + 1];
  std::vector<int64_t> start(count.size(), 0);
  for (size_t e = 1; e < start.size(); ++e) start[e] = start[e - 1] + count[e];
  int64_t entries = 0;
  for (int64_t e = 0; e < experts; ++e) entries += (count[size_t(e) + 1] + tm - 1) / tm;
  const int64_t pos_word = kHeaderWords + (entries + 1) * kEntryWords;
  std::vector<int32_t> t(size_t(pos_word + S * kPosWords), 0);
  const int64_t nfull = n / R, tail = n % R;
  const int64_t head[kHeaderWords] = {entries, n, (n + R - 1) / R, nfull, tail, int64_t(tail > 0), nfull * R,
                                      int64_t(entries > 0)};
  for (int64_t i = 0; i < kHeaderWords; ++i) t[size_t(i)] = int32_t(head[i]);
  // Positions: slots stably sorted by expert.
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t s = s0; s < s0 + S; ++s) {
    const int64_t p = next[size_t(ids[size_t(s)])]++;
    t[size_t(pos_word + p * kPosWords)] = int32_t(s / k - t0);
    t[size_t(pos_word + p * kPosWords + 1)] = int32_t(s - s0);
  }
  int64_t i = 0;
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = start[size_t(e)]; r < start[size_t(e) + 1]; r += tm, ++i) {
      const int64_t rows = std::min(tm, start[size_t(e) + 1] - r);
      int32_t* w = t.data() + kHeaderWords + i * kEntryWords;
      w[0] = int32_t(e);
      w[1] = int32_t((pos_word + r * kPosWords) * 4);
      w[2] = int32_t(rows);
      w[3] = int32_t((rows + R - 1) / R);
      w[4] = int32_t(i + 1 < entries);
    }
  return t;
}

// The expert ids [T, k] read on the host, in slot order, each checked to lie in [0, experts).
std::vector<int32_t> ffn_read_ids(const Tensor& ids, int64_t experts) {
  TPU_CHECK(is_integral(ids.dtype()), "moe_ffn: expert ids must be an integer tensor, got {}", ids.dtype());
  const std::vector<int64_t> v = ids.to_vector<int64_t>();  // any layout, read on the host
  std::vector<int32_t> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    TPU_CHECK(v[i] >= 0 && v[i] < experts, "moe_ffn: expert id {} (slot {}) is out of range for {} experts", v[i], i,
              experts);
    r[i] = int32_t(v[i]);
  }
  return r;
}

bool moe_ffn_chip(const ops::KernelArgs& a) {
  const Tensor &x = a.inputs[0], &ids = a.inputs[1], &w = a.inputs[2], &w1 = a.inputs[3], &w2 = a.inputs[4];
  const Tensor& out = a.outputs[0];
  const DType dt = x.dtype();
  const int64_t experts = a.attrs.get_int("num_experts"), k = a.attrs.get_int("top_k");
  if ((dt != DType::f32 && dt != DType::bf16) || w.dtype() != dt || w1.dtype() != dt || w2.dtype() != dt ||
      out.dtype() != dt || !out.is_contiguous())
    return false;
  const int64_t T = x.size(0), H = x.size(1), F = w2.size(2), O = w2.size(1);
  if (H == 0 || F == 0 || O == 0 || k == 0 || experts == 0) return false;  // nothing to multiply: the chain
  if ((T > 0 && (x.strides()[1] != 1 || w.strides()[1] != 1)) || w1.strides()[2] != 1 || w2.strides()[2] != 1)
    return false;
  const std::vector<int32_t> id = ffn_read_ids(ids, experts);
  if (T == 0) return true;
  const Device dev = out.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  if (cfg.scalar.registers < kFfnRegs || cfg.scalar.semaphores < kFfnSems) return false;
  const int64_t es = int64_t(x.element_size());
  FfnSpec s{.H = H, .F = F, .O = O, .k = k, .tm = 0, .th = 0, .tcap = 0, .xs = x.strides()[0] * es,
            .ws = w.strides()[0] * es, .g0 = w1.strides()[0] * es, .g1 = w1.strides()[1] * es,
            .d0 = w2.strides()[0] * es, .d1 = w2.strides()[1] * es, .dt = dt};
  ffn_choose_tiles(cfg, s);
  if (s.tm == 0) return false;
  const int64_t R = cfg.mxu.rows;
  // Every table word and offset is an i32.
  if (T * k * kPosWords * 4 + (T * k + experts) * kEntryWords * 4 >= (int64_t{1} << 31)) return false;
  const LoadedProgram lp = cached_program(
      dev,
      fmt::format("moe_ffn:{}x{}x{}:k{}:tm{}:th{}:tc{}:{}:{}:{}:{}:{}:{}:{}:{}", H, F, O, k, s.tm, s.th, s.tcap, s.xs,
                  s.ws, s.g0, s.g1, s.d0, s.d1, dtype_name(dt),
                  sim::mxu_mode_name(dt == DType::bf16 ? sim::MxuMode::bf16 : f32_matmul_mode())),
      [&] { return make_ffn_program(cfg, s); });
  for (int64_t t0 = 0; t0 < T; t0 += s.tcap) {
    const int64_t n = std::min(s.tcap, T - t0);
    const std::vector<int32_t> table = ffn_table(id, experts, k, t0, n, s.tm, R);
    const Tensor tab = from_vector(table, Shape{int64_t(table.size())}, TensorOptions(DType::i32, dev));
    launch(dev, lp, "moe_ffn",
           {hbm_address(x) + t0 * s.xs, hbm_address(w) + t0 * s.ws, hbm_address(w1), hbm_address(w2),
            hbm_address(out) + t0 * O * es, hbm_address(tab)});
  }
  return true;
}

// The fused program, else the chain op by op on the chip (counted, logged the first time);
// never declines, so moe_ffn takes no host fallback of its own.
bool moe_ffn_eager(const ops::KernelArgs& a) {
  if (moe_ffn_chip(a)) return true;
  if (g_chain_fallbacks.fetch_add(1) == 0)
    log().info("moe_ffn: x {} {}, gate_up {}: not covered by the fused chip program, runs the chain op by op",
               a.inputs[0].shape(), a.inputs[0].dtype(), a.inputs[3].shape());
  graph::moe_ffn_chain(a);
  return true;
}

const Lowering kMoeFfnRule{.eager = &moe_ffn_eager};

[[maybe_unused]] const bool g_moe_ffn_registered = (install_lowering("moe_ffn", &kMoeFfnRule), true);

}  // namespace

uint64_t moe_ffn_chain_fallbacks() { return g_chain_fallbacks.load(); }

}  // namespace tpu::codegen
