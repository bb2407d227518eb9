#include "codegen/paged_attention.h"

#include <algorithm>

#include <fmt/format.h>

#include "codegen/elementwise_kernel.h"
#include "codegen/tile_loops.h"
#include "sim/builder.h"
#include "tpucore/core/error.h"

namespace tpu::codegen {

using B = sim::ProgramBuilder;
using sim::DType;
using sim::Op;

namespace {

constexpr float kMasked = -1e30f;  // finite: exp underflows to 0, no inf - inf
constexpr int kSemW = 0, kSemQ = 1, kSemK = 2, kSemV = 3, kSemO = 4, kSemU = 5, kSemZ = 6;
// Registers: r0..r8 arguments (see the header), the rest the program's own.
enum Reg : int {
  rQ = 0, rKn, rVn, rKc, rVc, rOut, rUnits, rPages, rSlots,
  rCount, rTok, rSlot, rNdec, rNcls, rUnit, rTok0, rNtok, rSPar, rFetch, rBlock, rStep, rPar, rNextPar,
  rOutTok, rPrevN, rFirst, rOutPar, rUnitsDone, rNext, rWait, rFull, rRest
};
// Registers of the cache update, reused by the attention part.
constexpr int rQkPar = rCount, rHasNext = rTok, rNextTok0 = rSlot;

struct Layout {
  // rows of a unit (kv_heads x tokens x group), keys per step, columns of the accumulators O
  // (head_dim + 1: column head_dim holds l) and of every key and KV head in the V buffers
  // (head_dim + 1 with the ones column, head_dim without it)
  int64_t rows = 0, keys = 0, dv = 0, vdv = 0;
  int64_t q[2]{}, s[3]{}, mask = 0, o[4]{}, zero = 0, obuf[2]{}, k[3]{}, v[3]{};
  int64_t m = 0, mnew = 0, alpha = 0, aprev = 0, g = 0, negm = 0, thr = 0, thrw = 0, rowt = 0, lsum = 0, col = 0;
  int64_t units = 0, fpos = 0;
  int64_t total = 0;
};

// Buffers by parity: Q and the output rows by unit (rOutPar), K/V pages and the scores S by step
// mod 3 (rSPar), the accumulators O by unit and step mod 2 (rPar; see emit_step).
// With the ones column (`ones`), V pages sit in VMEM as [keys, kv_heads, head_dim + 1]: the
// extra column of every head holds 1.0 (written once per class), so P V on the MXUs also yields
// the row sums of P in column head_dim of O (no vector or cross-lane work for l, and O's
// rescale rescales l with it). Without it ([keys, kv_heads, head_dim], a page is one contiguous
// copy), the row sums come from the cross-lane unit and are added into column head_dim of O.
Layout plan(const sim::ChipConfig& cfg, const PagedAttentionSpec& s, int64_t tokens, int64_t pps, bool ones) {
  (void)cfg;
  Layout p;
  const int64_t es = sim::dtype_size(s.dtype), group = s.heads / s.kv_heads, d = s.head_dim;
  p.rows = s.kv_heads * tokens * group;
  p.keys = pps * s.block_size;
  p.dv = d + 1;
  p.vdv = ones ? d + 1 : d;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t o = at;
    at = align64(at + bytes);
    return o;
  };
  p.units = take((1 + s.max_units) * kPagedUnitWords * 4);  // first: the same in both classes' layouts
  p.fpos = take(s.max_units * 4);
  for (auto& b : p.q) b = take(p.rows * d * es);
  for (auto& b : p.s) b = take(p.rows * p.keys * 4);
  p.mask = take(p.rows * p.keys * 4);
  for (auto& b : p.o) b = take(p.rows * p.dv * 4);  // [unit parity][step parity]
  p.zero = take(2 * (p.o[1] - p.o[0]));             // zeros, copied over a unit's two accumulators
  for (auto& b : p.obuf) b = take(p.rows * d * es);
  for (auto& b : p.k) b = take(p.keys * s.kv_heads * d * es);
  for (auto& b : p.v) b = take(p.keys * s.kv_heads * p.vdv * es);
  for (int64_t* v : {&p.m, &p.mnew, &p.alpha, &p.aprev, &p.g, &p.negm, &p.thr, &p.thrw, &p.rowt, &p.lsum})
    *v = take(p.rows * 4);
  p.col = take(p.keys * 4);
  p.total = at;
  return p;
}

// Whether a class's V buffers carry the ones column: prefill units (many rows per KV head: the
// MXUs' streaming dominates, and the column rides along in P V); decode units take their row
// sums from the cross-lane unit instead: with a head dim that is a multiple of the MXU width the
// column would cost a whole extra weight tile per KV head and step (a weight load costs its
// rows whatever its width), and without it the V pages are plain contiguous copies.
bool ones_column(bool prefill) { return prefill; }

class Emitter {
 public:
  Emitter(const sim::ChipConfig& cfg, const PagedAttentionSpec& s)
      : cfg_(cfg), s_(s), b_("paged_attention"), es_(sim::dtype_size(s.dtype)), group_(s.heads / s.kv_heads),
        d_(s.head_dim), kvrow_(s.kv_heads * s.head_dim * sim::dtype_size(s.dtype)),
        page_(s.block_size * s.kv_heads * s.head_dim * sim::dtype_size(s.dtype)) {}

  sim::Program run() {
    // The unit table into VMEM (for the query positions as vectors), while the cache is updated.
    const Layout big = plan(cfg_, s_, s_.tile_tokens, s_.pages_per_step, true);
    b_.dma(B::vmem_at(B::at(big.units)), B::hbm_at(B::at(0, {{rUnits, 1}})),
           {.rows = 1, .row_bytes = (1 + s_.max_units) * kPagedUnitWords * 4}, 2 % cfg_.dma.engines, kSemU);
    emit_cache_update();
    b_.wait(kSemU);
    b_.unary(Op::vcast, vm(big.fpos), B::vmem(B::at(big.units + (kPagedUnitWords + 2) * 4), DType::i32, kPagedUnitWords),
             s_.max_units, 1);
    b_.sset(rPrevN, 0);
    b_.sset(rUnitsDone, 0);
    b_.sset(rOutPar, 0);
    b_.sload(rNdec, B::hbm_at(B::at(4, {{rUnits, 1}})));
    emit_class(1, false);
    emit_class(s_.tile_tokens, true);
    wait_outputs();
    b_.fence();
    return b_.finish();
  }

 private:
  static sim::Operand vm(int64_t addr, DType t = DType::f32, int64_t rs = -1, int64_t cs = 1) {
    return B::vmem(B::at(addr), t, rs, cs);
  }
  static sim::Operand colv(int64_t addr) { return vm(addr, DType::f32, 1, 0); }

  // An elementwise op over n contiguous f32 values (a column of per-row values) shaped as full
  // vregs plus a tail, so it costs n / vreg size, not one vreg per row. Sources: addresses of
  // such columns, or immediates / scalar broadcasts (kept as they are).
  void vec(Op op, int64_t dst, std::vector<sim::Operand> src, int64_t n) {
    emit_dense_vec(b_, cfg_.vpu.lanes, op, dst, src, n);
  }
  void vfill(int64_t dst, float value, int64_t n) { emit_dense_fill(b_, cfg_.vpu.lanes, dst, value, n); }

  // Copies every new token's K and V rows into its cache slot, then waits for all of them.
  void emit_cache_update() {
    b_.sload(rCount, B::hbm_at(B::at(0, {{rUnits, 1}})));
    b_.loop_reg(rTok, rCount);
    b_.sload(rSlot, B::hbm_at(B::at(0, {{rSlots, 1}, {rTok, 4}})));
    b_.dma(B::hbm_at(B::at(0, {{rKc, 1}, {rSlot, kvrow_}})), B::hbm_at(B::at(0, {{rKn, 1}, {rTok, kvrow_}})),
           {.rows = 1, .row_bytes = kvrow_}, 0, kSemW);
    b_.dma(B::hbm_at(B::at(0, {{rVc, 1}, {rSlot, kvrow_}})), B::hbm_at(B::at(0, {{rVn, 1}, {rTok, kvrow_}})),
           {.rows = 1, .row_bytes = kvrow_}, 1 % cfg_.dma.engines, kSemW);
    b_.end_loop();
    b_.loop_reg(rTok, rCount);
    b_.wait(kSemW, 2);
    b_.end_loop();
  }

  void wait_outputs() {
    b_.loop_reg(rWait, rPrevN);
    b_.wait(kSemO);
    b_.end_loop();
  }

  // Runs `body` once when the page entry at `back` steps + `p` pages from the page cursor
  // rFetch names a block (r[rBlock] = its id), not at all when it is -1 (a page past the
  // unit's last needed one, or a class's padding step): a loop counted by the entry + 1 whose
  // body ends it (its counter set past any block id).
  template <class F>
  void if_page(int64_t back, int64_t p, F&& body) {
    b_.sload(rBlock, B::hbm_at(B::at((p - back * pps_) * 4, {{rPages, 1}, {rFetch, 4}})));
    b_.sadd(rCount, rBlock, 1);
    b_.loop_reg(rNcls, rCount);
    body();
    b_.sset(rNcls, int64_t(1) << 40);
    b_.end_loop();
  }

  // Waits for the pages of the step `back` steps behind the page cursor on `sem` (one signal
  // per page its entries name).
  void wait_pages(int sem, int64_t back) {
    for (int64_t p = 0; p < pps_; ++p) if_page(back, p, [&] { b_.wait(sem); });
  }

  // The K and V pages of the step at the page cursor rFetch (the class's steps are consecutive
  // in the page list, units one after another) into the buffers of parity (register) `par`,
  // then the cursor advances; only the pages the entries name (-1: not read, the slot keeps
  // what it held: its keys are masked). V rows land in the [keys, kv_heads, vdv] layout: one DMA
  // per page, contiguous without the ones column, else block_size planes of kv_heads rows.
  void fetch_step(int16_t par, const Layout& L) {
    const int64_t P = pps_, kstep = L.k[1] - L.k[0], vstep = L.v[1] - L.v[0];
    const int64_t vpage = s_.block_size * s_.kv_heads * L.vdv * es_;
    for (int64_t p = 0; p < P; ++p)
      if_page(0, p, [&] {
        b_.dma(B::vmem_at(B::at(L.k[0] + p * page_, {{par, kstep}})), B::hbm_at(B::at(0, {{rKc, 1}, {rBlock, page_}})),
               {.rows = 1, .row_bytes = page_}, 0, kSemK);
        if (L.vdv == d_)
          b_.dma(B::vmem_at(B::at(L.v[0] + p * vpage, {{par, vstep}})), B::hbm_at(B::at(0, {{rVc, 1}, {rBlock, page_}})),
                 {.rows = 1, .row_bytes = page_}, 1 % cfg_.dma.engines, kSemV);
        else
          b_.dma(B::vmem_at(B::at(L.v[0] + p * vpage, {{par, vstep}})), B::hbm_at(B::at(0, {{rVc, 1}, {rBlock, page_}})),
                 {.planes = s_.block_size, .rows = s_.kv_heads, .row_bytes = d_ * es_,
                  .dst_plane_stride = s_.kv_heads * L.vdv * es_, .dst_row_stride = L.vdv * es_,
                  .src_plane_stride = s_.kv_heads * d_ * es_, .src_row_stride = d_ * es_},
                 1 % cfg_.dma.engines, kSemV);
      });
    b_.sadd(rFetch, rFetch, P);
  }

  // S[kpar] = Q K[kpar]^T per KV head on the first half of the MXUs: key tile j on them in
  // turn, head dim in chunks of R. Q of this unit (next = false) or of the next one.
  void emit_qk(int64_t tokens, const Layout& L, int16_t kpar, bool next) {
    const int64_t R = cfg_.mxu.rows, C = cfg_.mxu.cols, nm = cfg_.mxu.count;
    const int64_t keys = L.keys, hrows = tokens * group_, ld = s_.kv_heads * d_;
    const int64_t kstep = L.k[1] - L.k[0], sstep = L.s[1] - L.s[0], qstep = L.q[1] - L.q[0];
    const int64_t qk_mxus = split_ && nm >= 2 ? nm / 2 : nm;
    int tile = 0;
    for (int64_t h = 0; h < s_.kv_heads; ++h)
      for (int64_t j = 0; j * C < keys; ++j, ++tile) {
        const int64_t nn = std::min(C, keys - j * C);
        const int mxu = int(tile % qk_mxus);
        for (int64_t c = 0; c * R < d_; ++c) {
          const int64_t kk = std::min(R, d_ - c * R);
          b_.mxu_load_weights(
              mxu, B::vmem(B::at(L.k[0] + (j * C * ld + h * d_ + c * R) * es_, {{kpar, kstep}}), s_.dtype, 1, ld), kk,
              nn, s_.mode);
          const int64_t qoff = (h * hrows * d_ + c * R) * es_;
          b_.mxu_matmul(mxu, B::vmem(B::at(L.s[0] + (h * hrows * keys + j * C) * 4, {{kpar, sstep}}), DType::f32, keys),
                        B::vmem(B::at((next ? L.q[1] : L.q[0]) + qoff, {{rOutPar, next ? -qstep : qstep}}), s_.dtype, d_),
                        hrows, kk, nn, c > 0, s_.mode);
        }
      }
  }

  // One KV step of a unit of `tokens` tokens (its K/V/S buffers: rSPar, its accumulator: rPar),
  // software-pipelined: S of this step was computed by the step before (or, for a unit's first
  // step, by the previous unit's last step or the class's prologue), and this step issues the
  // Q K^T of the next one (`last`: the next unit's first step, when there is one) on the first
  // half of the MXUs after its exponentials and before its own P V on the other half. With S
  // and the K/V pages in three buffers, the next Q K^T and the page prefetch never wait for
  // this step's P V. The two accumulators take alternate steps: step j rescales O[j % 2] by
  // alpha_j alpha_{j-1} (its update two steps back), which depends on P V of step j - 2, not
  // j - 1, so the vector unit never waits for the previous step's P V; the unit's end adds the
  // other accumulator times the last alpha. A masked step computes its mask from the positions
  // (a compare and a select on the vector unit); steps without a mask cost neither.
  void emit_step(int64_t tokens, const Layout& L, bool masked, bool last) {
    const int64_t R = cfg_.mxu.rows, C = cfg_.mxu.cols, nm = cfg_.mxu.count;
    const int64_t rows = L.rows, keys = L.keys, hrows = tokens * group_, dv = L.dv;
    const int64_t vstep = L.v[1] - L.v[0], sstep = L.s[1] - L.s[0], ostep = L.o[1] - L.o[0];
    auto sat = [&](int64_t off) { return B::at(L.s[0] + off, {{rSPar, sstep}}); };
    auto oat = [&](int64_t off) { return B::at(L.o[0] + off, {{rOutPar, 2 * ostep}, {rPar, ostep}}); };
    const int64_t ldv = s_.kv_heads * L.vdv;  // elements between keys in the V buffers
    const int64_t pv_first = split_ && nm >= 2 ? nm / 2 : 0, pv_mxus = nm - pv_first;
    const sim::Operand O = B::vmem(oat(0), DType::f32, dv);
    // The score rows go through the vector units in chunks of KV heads (chunk_heads_), each
    // chunk's mask, row max, scale-and-shift and exponentials on its own rows, so the units
    // pipeline: the cross-lane unit takes the max of chunk c + 1 while the EUP exponentiates
    // chunk c, and P V of a head starts once its chunk's exponentials are done. Each unit runs
    // its instructions in order, so every chunk's mask comes first, then the maxes, then the
    // softmax updates.
    const int64_t crows = chunk_heads_ * hrows;
    auto chunks = [&](auto&& body) {
      for (int64_t r0 = 0; r0 < rows; r0 += crows) body(r0, std::min(crows, rows - r0));
    };
    auto Sc = [&](int64_t r0) { return B::vmem(sat(r0 * keys * 4), DType::f32, keys); };
    // Soft-capping: S = tanh(scale S / softcap) on the EUP; the softmax below then scales by
    // softcap instead of scale.
    const float escale = s_.softcap > 0 ? s_.softcap : s_.scale;
    if (s_.softcap > 0)
      chunks([&](int64_t r0, int64_t n) {
        b_.binary(Op::vmul, Sc(r0), Sc(r0), B::imm(s_.scale / s_.softcap), n, keys);
        b_.unary(Op::vtanh, Sc(r0), Sc(r0), n, keys);
      });
    // Causal mask (also masks keys past the context): key c of this step is visible to row r
    // when c <= thr[r] = query position - first key position of the step. Steps whose keys
    // every row sees (all before the unit's first query) skip it. A sliding window also masks
    // the keys with c <= thr[r] - window (every step of a windowed layer is masked).
    if (s_.window > 0) vec(Op::vsub, L.thrw, {vm(L.thr), B::imm(float(s_.window))}, rows);
    if (masked || s_.window > 0)
      chunks([&](int64_t r0, int64_t n) {
        const sim::Operand M = vm(L.mask + r0 * keys * 4, DType::f32, keys);
        b_.binary(Op::vcmple, M, vm(L.col, DType::f32, 0), colv(L.thr + r0 * 4), n, keys);
        b_.ternary(Op::vsel, Sc(r0), M, Sc(r0), B::imm(kMasked), n, keys);
        if (s_.window > 0) {
          b_.binary(Op::vcmplt, M, colv(L.thrw + r0 * 4), vm(L.col, DType::f32, 0), n, keys);
          b_.ternary(Op::vsel, Sc(r0), M, Sc(r0), B::imm(kMasked), n, keys);
        }
      });
    // Online softmax: the row max on the cross-lane unit (the vector unit stays free), one fused
    // scale-and-shift pass, the exponentials on the EUP; the row sums come from P V.
    chunks([&](int64_t r0, int64_t n) { b_.reduce(Op::xmax, vm(L.mnew + r0 * 4), Sc(r0), n, keys, 1); });
    chunks([&](int64_t r0, int64_t n) {
      auto at = [&](int64_t base) { return base + r0 * 4; };
      vec(Op::vmax, at(L.mnew), {vm(at(L.mnew)), vm(at(L.m))}, n);
      vec(Op::vsub, at(L.alpha), {vm(at(L.m)), vm(at(L.mnew))}, n);
      vec(Op::vmul, at(L.alpha), {vm(at(L.alpha)), B::imm(escale)}, n);
      vec(Op::vexp, at(L.alpha), {vm(at(L.alpha))}, n);
      vec(Op::vmov, at(L.m), {vm(at(L.mnew))}, n);
      vec(Op::vmul, at(L.negm), {vm(at(L.m)), B::imm(-escale)}, n);
      b_.ternary(Op::vfma, Sc(r0), Sc(r0), B::imm(escale), colv(at(L.negm)), n, keys);
      b_.unary(Op::vexp, Sc(r0), Sc(r0), n, keys);
      // Without the ones column: the row sums of P on the cross-lane unit.
      if (L.vdv == d_) b_.reduce(Op::xsum, vm(at(L.lsum)), Sc(r0), n, keys, 1);
    });
    vec(Op::vsub, L.thr, {vm(L.thr), B::imm(float(keys))}, rows);
    // The next step's K pages (the step two behind the page cursor), then its Q K^T.
    auto next_qk = [&](bool next) {
      wait_pages(kSemK, 2);
      b_.sadd(rQkPar, rSPar, 1);
      b_.smod(rQkPar, rQkPar, 3);
      emit_qk(tokens, L, rQkPar, next);
    };
    if (!last) {
      next_qk(false);
    } else {
      b_.loop_reg(rWait, rHasNext);
      b_.loop_reg(rOutTok, rNext);  // the next unit's queries (rNext: its tokens)
      b_.wait(kSemQ);
      b_.end_loop();
      next_qk(true);
      b_.end_loop();
    }
    vec(Op::vmul, L.g, {vm(L.alpha), vm(L.aprev)}, rows);
    vec(Op::vmov, L.aprev, {vm(L.alpha)}, rows);
    b_.binary(Op::vmul, O, O, colv(L.g), rows, dv);
    if (L.vdv == d_) b_.binary(Op::vadd, B::vmem(oat(d_ * 4), DType::f32, dv), B::vmem(oat(d_ * 4), DType::f32, dv),
                               colv(L.lsum), rows, 1);
    // O[par] += P [V | 1] (or P V) per KV head on the P V MXUs, once this step's V pages are in
    // (three steps behind the page cursor).
    wait_pages(kSemV, 3);
    const int64_t vcols = L.vdv;
    int tile = 0;
    for (int64_t h = 0; h < s_.kv_heads; ++h)
      for (int64_t n = 0; n * C < vcols; ++n, ++tile) {
        const int64_t nn = std::min(C, vcols - n * C);
        const int mxu = int(pv_first + tile % pv_mxus);
        for (int64_t c = 0; c * R < keys; ++c) {
          const int64_t kk = std::min(R, keys - c * R);
          b_.mxu_load_weights(mxu,
                              B::vmem(B::at(L.v[0] + (c * R * ldv + h * L.vdv + n * C) * es_, {{rSPar, vstep}}),
                                      s_.dtype, ldv),
                              kk, nn, s_.mode);
          b_.mxu_matmul(mxu, B::vmem(oat((h * hrows * dv + n * C) * 4), DType::f32, dv),
                        B::vmem(sat((h * hrows * keys + c * R) * 4), DType::f32, keys),
                        hrows, kk, nn, true, s_.mode);
        }
      }
    b_.sadd(rSPar, rSPar, 1);
    b_.smod(rSPar, rSPar, 3);
  }

  // The loop over the work units of one class (decode: 1 token, prefill: tile_tokens tokens).
  void emit_class(int64_t tokens, bool prefill) {
    pps_ = paged_pages_per_step(s_, !prefill);
    // Decode units have a few rows per KV head: their MXU time is weight loading, which every
    // MXU shares; prefill units split the MXUs between Q K^T and P V (see emit_step).
    split_ = prefill;
    // Prefill rows in two chunks of KV heads (emit_step); a decode unit's few rows in one.
    chunk_heads_ = prefill ? (s_.kv_heads + 1) / 2 : s_.kv_heads;
    const Layout L = plan(cfg_, s_, tokens, pps_, ones_column(prefill));
    const int64_t rows = L.rows, hrows = tokens * group_;
    wait_outputs();  // the previous class's stores read buffers this class reuses
    b_.sset(rPrevN, 0);
    b_.sload(rNcls, B::hbm_at(B::at(prefill ? 8 : 4, {{rUnits, 1}})));
    // Per-class constants, only when the class has units (a loop over them whose body ends it):
    // key columns 0..keys-1 (by doubling: col[n..2n) = col[0..n) + n) and each row's token index
    // within the unit.
    b_.loop_reg(rWait, rNcls);
    vfill(L.col, 0, 1);
    for (int64_t n = 1; n < L.keys; n *= 2)
      vec(Op::vadd, L.col + n * 4, {vm(L.col), B::imm(float(n))}, std::min(n, L.keys - n));
    for (int64_t h = 0; h < s_.kv_heads; ++h)
      for (int64_t t = 0; t < tokens; ++t) b_.fill(vm(L.rowt + (h * hrows + t * group_) * 4, DType::f32, 1), float(t), group_, 1);
    // Zeros in the V buffers past each step's first page: a step's slots past its unit's last
    // page are not fetched and keep what they hold (P is 0 there, and 0 times what an earlier
    // program left in VMEM must not be NaN; a step's first page is always fetched, except with
    // a window, where a unit's first step may start before its first visible block: then the
    // whole buffer); the ones column of every key and KV head (page DMAs never write it).
    // The zeros are written as f32 words over the bytes (all bits zero in either dtype, and no
    // 16-bit vector stores), then the ones column over them.
    const int64_t vfirst = s_.window > 0 ? 0 : s_.block_size * s_.kv_heads * L.vdv * es_;  // bytes not zeroed
    const int64_t vbytes = L.keys * s_.kv_heads * L.vdv * es_;         // bytes of a V buffer
    for (int64_t vb : L.v) {
      if (vfirst % 4 == 0) {
        if (vbytes - vfirst >= 4) vfill(vb + vfirst, 0, (vbytes - vfirst) / 4);
        if ((vbytes - vfirst) % 4) b_.fill(B::vmem(B::at(vb + vbytes - es_), s_.dtype, 1), 0.0f, 1, 1);
      } else if (vbytes > vfirst) {
        b_.fill(B::vmem(B::at(vb + vfirst), s_.dtype, 1), 0.0f, (vbytes - vfirst) / es_, 1);
      }
      if (L.vdv > d_) b_.fill(B::vmem(B::at(vb + d_ * es_), s_.dtype, L.vdv), 1.0f, L.keys * s_.kv_heads, 1);
    }
    b_.fill(vm(L.zero, DType::f32, 2 * L.dv), 0, rows, 2 * L.dv);
    b_.sset(rWait, int64_t(1) << 40);
    b_.end_loop();
    b_.sset(rSPar, 0);
    b_.sset(rFirst, 1);
    b_.sset(rPar, 0);
    b_.loop_reg(rUnit, rNcls);
    // The unit's record (decode units first, then prefill units); next = the following one.
    auto record = [&](int64_t word, bool next) {
      sim::Addr a = B::at((kPagedUnitWords * (next ? 2 : 1) + word) * 4, {{rUnits, 1}, {rUnit, kPagedUnitWords * 4}});
      if (prefill) a.terms[2] = {rNdec, kPagedUnitWords * 4};
      return B::hbm_at(a);
    };
    b_.sload(rTok0, record(0, false));
    b_.sload(rNtok, record(1, false));
    b_.sload(rFull, record(5, false));
    b_.sload(rRest, record(6, false));
    b_.sload(rHasNext, record(7, false));
    const int64_t qrow = s_.heads * d_ * es_, gbytes = group_ * d_ * es_;
    // Queries of the unit's `ntok` tokens from tok0 into the Q buffer of parity `qpar`: one DMA
    // per token (its query heads, per KV head), so q needs no rows past the step's tokens; the
    // buffer's rows past ntok keep an earlier unit's queries, their results are not stored.
    // `next`: into the other unit parity's buffer (1 - rOutPar).
    auto load_q = [&](int16_t tok0, int16_t ntok, bool next) {
      const int64_t qstep = L.q[1] - L.q[0];
      b_.loop_reg(rOutTok, ntok);
      b_.dma(B::vmem_at(B::at(next ? L.q[1] : L.q[0], {{rOutPar, next ? -qstep : qstep}, {rOutTok, gbytes}})),
             B::hbm_at(B::at(0, {{rQ, 1}, {tok0, qrow}, {rOutTok, qrow}})),
             {.planes = s_.kv_heads, .rows = 1, .row_bytes = gbytes, .dst_plane_stride = hrows * d_ * es_,
              .src_plane_stride = gbytes},
             2 % cfg_.dma.engines, kSemQ);
      b_.end_loop();
    };
    // Zeros over the two accumulators of this unit's parity (or the next unit's), by DMA so the
    // vector unit does not wait for the previous unit's last P V to free them.
    const int64_t ostep = L.o[1] - L.o[0];
    auto zero_o = [&](bool next) {
      b_.dma(B::vmem_at(B::at(next ? L.o[2] : L.o[0], {{rOutPar, next ? -2 * ostep : 2 * ostep}})),
             B::vmem_at(B::at(L.zero)), {.rows = 1, .row_bytes = 2 * ostep}, 3 % cfg_.dma.engines, kSemZ);
    };
    auto next_parity = [&](int64_t ahead) {  // the K/V/S buffers `ahead` steps on
      b_.sadd(rNextPar, rSPar, ahead);
      b_.smod(rNextPar, rNextPar, 3);
    };
    // The class's first unit loads its queries and the first two steps' pages and computes its
    // first S itself; every step then fetches the pages of the step two ahead (of its unit or
    // the next ones: the page list runs on past the class's last step by two padding steps);
    // later units find them prefetched and computed by the unit before (emit_step, `last`).
    b_.loop_reg(rWait, rFirst);
    load_q(rTok0, rNtok, false);
    zero_o(false);
    b_.sload(rFetch, record(4, false));
    fetch_step(rSPar, L);
    next_parity(1);
    fetch_step(rNextPar, L);
    b_.loop_reg(rOutTok, rNtok);
    b_.wait(kSemQ);
    b_.end_loop();
    wait_pages(kSemK, 2);
    emit_qk(tokens, L, rSPar, false);
    b_.end_loop();
    // thr = token index + the unit's first query position (the masks' threshold); m = -inf,
    // alpha_{-1} = 1; O = 0 (zeroed by DMA).
    sim::Addr fa = B::at(L.fpos, {{rUnit, 4}});
    if (prefill) fa.terms[1] = {rNdec, 4};
    const sim::Operand fp = B::vmem(fa, DType::f32, 0, 0);
    vec(Op::vadd, L.thr, {vm(L.rowt), fp}, rows);
    vfill(L.m, kMasked, rows);
    vfill(L.aprev, 1, rows);
    b_.wait(kSemZ);
    // Steps 0 .. steps-2 fetch the next step's pages first (the first rFull of them need no
    // mask, the next rRest do); the last step fetches the next unit's queries and first pages
    // (when the class has a next unit). Page buffers alternate from step to step across units.
    auto toggle_o = [&] {  // the next step's accumulator
      b_.sadd(rPar, rPar, 1);
      b_.smod(rPar, rPar, 2);
    };
    auto prefetching_step = [&](bool masked) {
      next_parity(2);
      fetch_step(rNextPar, L);
      emit_step(tokens, L, masked, false);
      toggle_o();
    };
    b_.loop_reg(rStep, rFull);
    prefetching_step(false);
    b_.end_loop();
    b_.loop_reg(rOutTok, rRest);
    prefetching_step(true);
    b_.end_loop();
    b_.loop_reg(rWait, rHasNext);
    b_.sload(rNextTok0, record(0, true));
    b_.sload(rNext, record(1, true));
    load_q(rNextTok0, rNext, true);
    zero_o(true);
    b_.end_loop();
    next_parity(2);
    fetch_step(rNextPar, L);
    emit_step(tokens, L, true, true);
    // O = O[last] + alpha_last O[other] (columns 0..head_dim-1: the numerator, head_dim: l),
    // then O / l into the output buffer of this unit's parity (after the previous unit's
    // stores, which read the other buffer, are done), then one DMA per valid token.
    const int64_t obytes = L.obuf[1] - L.obuf[0];
    const sim::Operand olast = B::vmem(B::at(L.o[0], {{rOutPar, 2 * ostep}, {rPar, ostep}}), DType::f32, L.dv);
    b_.ternary(Op::vfma, olast, B::vmem(B::at(L.o[1], {{rOutPar, 2 * ostep}, {rPar, -ostep}}), DType::f32, L.dv),
               colv(L.alpha), olast, rows, L.dv);
    wait_outputs();
    b_.binary(Op::vdiv, B::vmem(B::at(L.obuf[0], {{rOutPar, obytes}}), s_.dtype, d_), olast,
              B::vmem(B::at(L.o[0] + d_ * 4, {{rOutPar, 2 * ostep}, {rPar, ostep}}), DType::f32, L.dv, 0), rows, d_);
    toggle_o();
    b_.sset(rFirst, 0);
    b_.loop_reg(rOutTok, rNtok);
    b_.dma(B::hbm_at(B::at(0, {{rOut, 1}, {rTok0, qrow}, {rOutTok, qrow}})),
           B::vmem_at(B::at(L.obuf[0], {{rOutPar, obytes}, {rOutTok, gbytes}})),
           {.planes = s_.kv_heads, .rows = 1, .row_bytes = gbytes, .dst_plane_stride = gbytes,
            .src_plane_stride = hrows * d_ * es_},
           3 % cfg_.dma.engines, kSemO);
    b_.end_loop();
    b_.sadd(rPrevN, rNtok, 0);
    b_.sadd(rUnitsDone, rUnitsDone, 1);
    b_.smod(rOutPar, rUnitsDone, 2);
    b_.end_loop();
    // The two steps fetched past the class's last one are padding entries (-1): nothing in flight.
  }

  const sim::ChipConfig& cfg_;
  const PagedAttentionSpec& s_;
  B b_;
  int64_t es_, group_, d_, kvrow_, page_;
  int64_t pps_ = 1;     // pages per step of the class being emitted
  bool split_ = false;  // Q K^T and P V on separate halves of the MXUs
  int64_t chunk_heads_ = 1;  // KV heads per chunk of the softmax's vector work (emit_step)
};

void check_spec(const PagedAttentionSpec& s) {
  TPU_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.head_dim > 0 && s.block_size > 0 &&
                s.pages_per_step > 0 && s.decode_pages_per_step >= 0 && s.tile_tokens > 0 && s.max_units > 0 &&
                s.scale > 0 && s.window >= 0 && s.softcap >= 0,
            "paged_attention: invalid spec ({} heads, {} kv heads, head_dim {}, block {}, {} pages/step, tile {}, "
            "{} units, scale {}, window {}, softcap {})",
            s.heads, s.kv_heads, s.head_dim, s.block_size, s.pages_per_step, s.tile_tokens, s.max_units, s.scale,
            s.window, s.softcap);
}

// Of sequence s's q new tokens, how many (the first ones) go in prefill units.
int64_t prefill_part(const std::vector<int64_t>* prompt_tokens, size_t s, int64_t q) {
  if (!prompt_tokens) return q == 1 ? 0 : q;
  return std::clamp<int64_t>((*prompt_tokens)[s], 0, q);
}

}  // namespace

int64_t paged_attention_units(const PagedAttentionSpec& spec, const std::vector<int64_t>& query_start,
                              const std::vector<int64_t>* prompt_tokens) {
  TPU_CHECK(!prompt_tokens || prompt_tokens->size() + 1 == query_start.size(),
            "paged_attention: {} prompt-token counts for {} query offsets (want one per sequence)",
            prompt_tokens ? prompt_tokens->size() : 0, query_start.size());
  int64_t n = 0;
  for (size_t i = 0; i + 1 < query_start.size(); ++i) {
    const int64_t q = query_start[i + 1] - query_start[i], pre = prefill_part(prompt_tokens, i, q);
    n += (pre + spec.tile_tokens - 1) / spec.tile_tokens + (q - pre);
  }
  return n;
}

PagedAttentionMeta plan_paged_attention(const PagedAttentionSpec& spec, int64_t num_blocks,
                                        const std::vector<int64_t>& query_start,
                                        const std::vector<int64_t>& context_len,
                                        const std::vector<const std::vector<int32_t>*>& block_tables,
                                        const std::vector<int64_t>* prompt_tokens) {
  check_spec(spec);
  const size_t ns = context_len.size();
  TPU_CHECK(query_start.size() == ns + 1 && block_tables.size() == ns && !query_start.empty() && query_start[0] == 0 &&
                (!prompt_tokens || prompt_tokens->size() == ns),
            "paged_attention: {} query offsets, {} context lengths, {} block tables and {} prompt-token counts do not "
            "describe one batch (want n + 1, n, n and n or none, and a first offset of 0)",
            query_start.size(), ns, block_tables.size(), prompt_tokens ? prompt_tokens->size() : 0);
  PagedAttentionMeta m;
  m.num_tokens = query_start.back();
  m.slots.resize(size_t(m.num_tokens));
  struct Unit {
    int64_t tok0, ntok, pos0, seq;
  };
  std::vector<Unit> dec, pre;
  const int64_t bs = spec.block_size;
  for (size_t s = 0; s < ns; ++s) {
    const int64_t q0 = query_start[s], q = query_start[s + 1] - q0, ctx = context_len[s];
    TPU_CHECK(q >= 1 && ctx >= q, "paged_attention: sequence {} brings {} tokens with a context of {} (want 1 <= "
              "tokens <= context)", s, q, ctx);
    TPU_CHECK(block_tables[s] && int64_t(block_tables[s]->size()) * bs >= ctx,
              "paged_attention: the block table of sequence {} covers fewer than its {} positions", s, ctx);
    const std::vector<int32_t>& t = *block_tables[s];
    // The blocks the step reads: from the first new token's window on (with a window, earlier
    // blocks may have been released).
    const int64_t fb = spec.window > 0 ? std::max<int64_t>(0, ctx - q - spec.window + 1) / bs : 0;
    for (int64_t b = fb; b < (ctx + bs - 1) / bs; ++b)
      TPU_CHECK(t[size_t(b)] >= 0 && t[size_t(b)] < num_blocks,
                "paged_attention: sequence {} names block {} outside the cache's {} blocks", s, t[size_t(b)], num_blocks);
    for (int64_t i = 0; i < q; ++i) {
      const int64_t pos = ctx - q + i;
      m.slots[size_t(q0 + i)] = int32_t(t[size_t(pos / bs)] * bs + pos % bs);
    }
    const int64_t np = prefill_part(prompt_tokens, s, q);
    for (int64_t i = 0; i < np; i += spec.tile_tokens)
      pre.push_back({q0 + i, std::min(spec.tile_tokens, np - i), ctx - q + i, int64_t(s)});
    for (int64_t i = np; i < q; ++i) dec.push_back({q0 + i, 1, ctx - q + i, int64_t(s)});
  }
  m.num_units = int64_t(dec.size() + pre.size());
  TPU_CHECK(m.num_units <= spec.max_units, "paged_attention: the step needs {} work units, the program holds {}",
            m.num_units, spec.max_units);
  m.units.assign(size_t((1 + spec.max_units) * kPagedUnitWords), 0);
  m.units[0] = int32_t(m.num_tokens);
  m.units[1] = int32_t(dec.size());
  m.units[2] = int32_t(pre.size());
  size_t ui = 1;
  for (const auto* list : {&dec, &pre})
    for (const Unit& u : *list) {
      const int64_t pps = paged_pages_per_step(spec, list == &dec), keys = pps * bs;
      // The page list starts at the block of the first query's first visible key (block 0
      // without a window); positions in the record count from that block's first key.
      const int64_t seen = spec.window > 0 ? std::max<int64_t>(0, u.pos0 - spec.window + 1) / bs : 0;
      // By token kind, a windowed prefill unit's steps start on the grid of whole steps (block
      // multiples of pps), so each query's keys fall in the same steps whichever token its unit
      // starts at; the blocks before the first visible one are -1 (not read, masked).
      const int64_t b0 = prompt_tokens && spec.window > 0 && list == &pre ? seen / pps * pps : seen;
      const int64_t rel = u.pos0 - b0 * bs;
      const int64_t needed = rel + u.ntok, steps = (needed + keys - 1) / keys;
      const std::vector<int32_t>& t = *block_tables[size_t(u.seq)];
      int32_t* r = m.units.data() + ui * kPagedUnitWords;
      r[0] = int32_t(u.tok0);
      r[1] = int32_t(u.ntok);
      r[2] = int32_t(rel);
      r[3] = int32_t(steps);
      r[4] = int32_t(m.pages.size());
      // Leading steps whose keys all lie at or before the unit's first query position need no
      // mask; of the steps that prefetch (all but the last), r[5] are such, r[6] the rest. With
      // a window every step is masked.
      const int64_t full = spec.window > 0 ? 0 : std::min((rel + 1) / keys, steps - 1);
      r[5] = int32_t(full);
      r[6] = int32_t(steps - 1 - full);
      r[7] = &u != &list->back();  // a next unit of the same class follows
      const int64_t used = (needed + bs - 1) / bs;
      for (int64_t p = 0; p < steps * pps; ++p) m.pages.push_back(p < used && b0 + p >= seen ? t[size_t(b0 + p)] : -1);
      m.kv_pages_read += used - (seen - b0);
      ++ui;
      // Two steps of padding (-1: nothing read): the kernel looks two steps ahead.
      if (&u == &list->back()) m.pages.insert(m.pages.end(), size_t(2 * pps), -1);
    }
  if (m.pages.empty()) m.pages.push_back(0);
  return m;
}

int64_t paged_attention_vmem_bytes(const sim::ChipConfig& cfg, const PagedAttentionSpec& s) {
  return std::max(plan(cfg, s, s.tile_tokens, paged_pages_per_step(s, false), true).total,
                  plan(cfg, s, 1, paged_pages_per_step(s, true), ones_column(false)).total);
}

void choose_paged_attention_tiling(const sim::ChipConfig& cfg, PagedAttentionSpec& s) {
  check_spec(s);
  const int64_t group = s.heads / s.kv_heads;
  const int64_t wide = std::max<int64_t>(1, (int64_t(cfg.mxu.cols) + s.block_size - 1) / s.block_size);
  s.tile_tokens = std::max<int64_t>(1, (int64_t(cfg.mxu.rows) * 2 + group - 1) / group);
  // Prefill steps cover about the unit's own span of keys (at most an MXU width): a unit's
  // diagonal step computes exponentials for keys past its queries that the mask throws away, so
  // shorter steps waste less of the EUP (a 1,024-token causal chunk in 128-token units: 25% of
  // its exponentials masked with 256-key steps, 12.5% with 128-key ones). Decode steps keep an
  // MXU width of keys (with two steps of pages in flight, such steps keep HBM busy).
  s.pages_per_step = std::max<int64_t>(1, std::min(wide * s.block_size, s.tile_tokens) / s.block_size);
  s.decode_pages_per_step = s.pages_per_step == wide ? 0 : wide;
  const int64_t budget = int64_t(cfg.memory.vmem_bytes) * 9 / 10;
  while (paged_attention_vmem_bytes(cfg, s) > budget) {
    if (s.tile_tokens > 1) s.tile_tokens = (s.tile_tokens + 1) / 2;
    else if (s.pages_per_step > 1) s.pages_per_step = (s.pages_per_step + 1) / 2;
    else if (s.decode_pages_per_step > 1) s.decode_pages_per_step = (s.decode_pages_per_step + 1) / 2;
    else fail("paged_attention: head_dim {} with {} kv heads does not fit the chip's {} bytes of VMEM", s.head_dim,
              s.kv_heads, cfg.memory.vmem_bytes);
  }
}

sim::Program make_paged_attention_program(const sim::ChipConfig& cfg, const PagedAttentionSpec& s) {
  check_spec(s);
  TPU_CHECK(paged_attention_vmem_bytes(cfg, s) <= int64_t(cfg.memory.vmem_bytes),
            "paged_attention: tiles of {} tokens x {} pages need {} bytes of VMEM, the chip has {}", s.tile_tokens,
            s.pages_per_step, paged_attention_vmem_bytes(cfg, s), cfg.memory.vmem_bytes);
  TPU_CHECK(cfg.scalar.registers > int(rRest), "paged_attention: the chip has {} scalar registers, the program uses {}",
            cfg.scalar.registers, int(rRest) + 1);
  return Emitter(cfg, s).run();
}

std::string paged_attention_key(const PagedAttentionSpec& s) {
  return fmt::format("paged_attention:{}/{}x{}:b{}:p{}/{}:t{}:u{}:s{}:w{}:c{}:{}:{}", s.heads, s.kv_heads, s.head_dim,
                     s.block_size, s.pages_per_step, paged_pages_per_step(s, true), s.tile_tokens, s.max_units, s.scale,
                     s.window, s.softcap, sim::dtype_name(s.dtype), sim::mxu_mode_name(s.mode));
}

}  // namespace tpu::codegen
