#include "codegen/matmul_kernel.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "codegen/megacore.h"
#include "sim/builder.h"
#include "tpucore/core/error.h"

namespace tpu::codegen {

using B = sim::ProgramBuilder;
using sim::DType;

namespace {

int64_t es_of(DType t) { return sim::dtype_size(t); }

// Bytes of B per element in HBM (half a byte for packed int4).
double b_elem_bytes(const MatmulSpec& s) { return s.b_int4_group > 0 ? 0.5 : double(es_of(s.b_dtype)); }

// The K step a tiling may cut B at: R, or with packed int4 weights a multiple of the group too.
int64_t k_step(const MatmulSpec& s, int64_t R) { return s.b_int4_group > 0 ? std::lcm(R, s.b_int4_group) : R; }

// MXU streaming cycles per LHS row in `mode` (bf16x3: three bf16 passes).
double mode_cycles_per_row(const sim::ChipConfig& cfg, sim::MxuMode mode) {
  switch (mode) {
    case sim::MxuMode::f32: return cfg.mxu.f32_cycles_per_row;
    case sim::MxuMode::bf16x3: return 3 * cfg.mxu.bf16_cycles_per_row;
    case sim::MxuMode::i8: return cfg.mxu.int8_cycles_per_row;
    case sim::MxuMode::fp8: return cfg.mxu.fp8_cycles_per_row;
    default: return cfg.mxu.bf16_cycles_per_row;
  }
}

// Whether the cross-lane unit takes part of a_row_quant's row max: not where the chip's timing
// prices a program that reduces rows there at a fixed cost (timing.reduce_cycles of the
// calibrated presets, about 1 us, more than the exposed time it saves); there the vector unit
// takes it all.
bool xlu_row_max(const sim::ChipConfig& cfg) { return !(cfg.timing.calibrated() && cfg.timing.reduce_cycles > 0); }

bool has_epilogue(const MatmulSpec& s) {
  return !s.epilogue.steps.empty() || s.epilogue.result.kind != VecRef::Kind::input || s.epilogue.result.index != 0 ||
         s.out_dtype != DType::f32;
}

int epilogue_slots(const MatmulSpec& s) {
  if (!has_epilogue(s)) return 0;
  std::vector<DType> dts{DType::f32};
  for (const EwInput& e : s.epilogue_inputs) dts.push_back(e.dtype);
  if (s.a_row_quant > 0) dts.push_back(DType::f32);
  return vec_temp_slots(s.epilogue, dts);
}

// Packed int4 B with few rows of A (a decode step): the MXUs read the nibbles as i8 weights (16 q,
// one pass per half block of 16) and each group's product is scaled into the accumulator on the
// vector unit, instead of a bf16 panel dequantized weight by weight.
bool int4_direct(const MatmulSpec& s, int64_t tm) { return s.b_int4_group > 0 && tm <= s.b_int4_group / 2; }

// VMEM layout of one tiling.
struct VmemPlan {
  int64_t a[2]{}, b[2]{}, acc[2]{}, out[2]{}, ascale[2]{};
  // a_row_quant: m / Q per row; the running [rows, R] tiles of the row max and min of A, and one
  // column per chunk for the chunks whose row max the cross-lane unit takes
  int64_t asx[2]{}, qmax = 0, qmin = 0, qx = 0, qm = 0;
  // int4 B: bf16 panels, group scales, f32 temps, -8 x scale, the low / high nibbles, the mask word
  int64_t dq[2]{}, sc[2]{}, qt[2]{}, sh = 0, nib[2]{}, mask = 0, sc16[2]{};  // sc16: f16 scales as loaded
  // int4_direct: a ring of buffers for the groups' products, deep enough that the MXUs run ahead
  // of the vector unit by the pipeline's fill and drain (512 cycles on a 256-row array; a group
  // of 32 takes 32 cycles of weight loads per MXU) plus a chunk of unpacking
  static constexpr int kGroupBuffers = 48;
  std::array<int64_t, kGroupBuffers> gt{};
  int ngt = 0;
  std::vector<std::array<int64_t, 2>> epi;
  TempArena arena;
  int64_t total = 0;
};

// A single A block (all of M and K in one tile) needs no second buffer: nothing is prefetched.
VmemPlan plan_vmem(const MatmulSpec& s, int64_t tm, int64_t tn, int64_t tk, int64_t R) {
  VmemPlan p;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t o = at;
    at = align64(at + bytes);
    return o;
  };
  const bool one_a = tm >= s.m && (tk >= s.k || s.a_row_quant > 0) && (s.batch == 1 || s.a_batch_stride == 0);
  const int64_t ak = s.a_row_quant > 0 ? s.k : tk;  // row quantization holds whole rows of A
  p.a[0] = take(tm * ak * es_of(s.a_dtype));
  p.a[1] = one_a ? p.a[0] : take(tm * ak * es_of(s.a_dtype));
  const int64_t g4 = s.b_int4_group;
  for (int i = 0; i < 2; ++i) p.b[i] = take(g4 > 0 ? (tk * tn + 1) / 2 : tk * tn * es_of(s.b_dtype));
  if (g4 > 0) {
    for (int i = 0; i < 2; ++i) p.dq[i] = take(tk * tn * 2);
    for (int i = 0; i < 2; ++i) p.sc[i] = take(tn * ((tk + g4 - 1) / g4) * 4);
    p.qt[0] = take(16 * tn * ((tk + g4 - 1) / g4) * 4);
    p.sh = take(tn * ((tk + g4 - 1) / g4) * 4);
    for (int i = 0; i < 2; ++i) p.nib[i] = take((tk * tn + 7) / 8 * 4);
    p.mask = take(12);  // 0x0f0f0f0f, 0xf0f0f0f0, 0x88888888
    if (int4_direct(s, tm)) {
      p.ngt = int(std::min<int64_t>(VmemPlan::kGroupBuffers, std::max<int64_t>(2, (tk + g4 - 1) / g4)));
      for (int i = 0; i < p.ngt; ++i) p.gt[size_t(i)] = take(tm * tn * 4);
    }
    if (s.b_int4_scale_f16)
      for (int i = 0; i < 2; ++i) p.sc16[i] = take((tn * ((tk + g4 - 1) / g4) + 1) / 2 * 4);
  }
  if (s.a_row_scale || s.a_row_quant > 0) {
    p.ascale[0] = take(tm * 4);
    p.ascale[1] = one_a ? p.ascale[0] : take(tm * 4);
  }
  if (s.a_row_quant > 0) {
    p.asx[0] = take(tm * 4);
    p.asx[1] = one_a ? p.asx[0] : take(tm * 4);
    p.qmax = take(tm * std::min(R, s.k) * 4);
    p.qmin = take(tm * std::min(R, s.k) * 4);
    p.qx = take(tm * ((s.k + R - 1) / R + 2) * 4);
    p.qm = take(tm * 4);
  }
  for (int i = 0; i < 2; ++i) p.acc[i] = take(tm * tn * 4);
  const bool epi = has_epilogue(s);
  for (int i = 0; i < 2; ++i) p.out[i] = epi ? take(tm * tn * es_of(s.out_dtype)) : p.acc[i];
  for (const EwInput& e : s.epilogue_inputs) {
    const int64_t es = es_of(e.dtype);
    const int64_t bytes = e.layout == EwLayout::full ? tm * tn * es
                          : e.layout == EwLayout::row ? tn * es
                          : e.layout == EwLayout::col ? tm * es
                                                      : es;
    p.epi.push_back({take(bytes), take(bytes)});
  }
  const int slots = epilogue_slots(s);
  p.arena.slots = slots;
  p.arena.slot_bytes = align64(tm * tn * 4);
  p.arena.base = at;
  at += p.arena.slot_bytes * slots;
  p.total = at;
  return p;
}

}  // namespace

std::string matmul_key(const MatmulSpec& s) {
  std::string k = fmt::format("mm:{}x{}x{}x{}:t{}{}:{}/{}:{}/{}>{}:{}:{}/{}/{}:", s.batch, s.m, s.n, s.k, s.b_transposed,
                              s.a_row_scale ? "s" : s.a_row_quant > 0 ? fmt::format("q{}", s.a_row_quant)
                                                  : s.b_int4_group > 0 ? fmt::format("g{}{}", s.b_int4_group, s.b_int4_scale_f16 ? "h" : "")
                                                                       : "",
                              s.a_batch_stride, s.b_batch_stride, sim::dtype_name(s.a_dtype),
                              sim::dtype_name(s.b_dtype), sim::dtype_name(s.out_dtype), sim::mxu_mode_name(s.mode),
                              s.tm, s.tn, s.tk);
  for (const EwInput& in : s.epilogue_inputs) k += fmt::format("{}{},", int(in.layout), sim::dtype_name(in.dtype));
  return k + s.epilogue.key();
}

MatmulTiling choose_matmul_tiling(const sim::ChipConfig& cfg, const MatmulSpec& s) {
  const int64_t R = cfg.mxu.rows, Cm = cfg.mxu.cols, nm = cfg.mxu.count;
  const int64_t budget = int64_t(cfg.memory.vmem_bytes) * 9 / 10;
  MatmulTiling t;
  t.tn = s.tn > 0 ? s.tn : std::min(s.n, nm * Cm);
  t.tk = s.tk > 0 ? s.tk : s.k;
  // In-kernel row quantization keeps K whole, so a block's rows wait for the whole block: the
  // first block's load is exposed, and blocks or panels too small to balance an MXU's weight-tile
  // load (R rows) with its streaming starve it. The tiling with the least estimated time (MXU
  // steps, HBM traffic with B re-read per block, the first block's load) that fits.
  if (s.a_row_quant > 0 && s.tm == 0 && s.tn == 0 && s.tk == 0) {
    const double cpr = mode_cycles_per_row(cfg, s.mode), bw = cfg.hbm_bytes_per_cycle();
    const double load = double(R) * cfg.mxu.weight_load_cycles_per_row;
    const int64_t ktiles = (s.k + R - 1) / R;
    double best = -1;
    MatmulTiling bt;
    std::vector<int64_t> tms{s.m};
    for (int64_t m = 2048; m >= 8; m /= 2)
      if (m < s.m) tms.push_back(m);
    std::vector<int64_t> tks{s.k};  // B panels may be cut along K (A's rows stay whole)
    for (int64_t k = (s.k / 2 + R - 1) / R * R; k >= R && k < tks.back(); k = (k / 2 + R - 1) / R * R) {
      tks.push_back(k);
      if (k == R) break;
    }
    for (const int64_t tm : tms)
      for (int64_t jt = std::min((s.n + Cm - 1) / Cm, nm); jt >= 1; --jt)
        for (const int64_t tk : tks) {
        const int64_t tn = std::min(s.n, jt * Cm);
        const int64_t vm = plan_vmem(s, tm, tn, tk, R).total;
        if (vm > budget) continue;
        const int64_t groups = jt < nm ? std::max<int64_t>(1, std::min(nm / jt, tm / 8)) : 1;
        const double rows = double(((tm + groups - 1) / groups + 7) / 8 * 8);
        const double mm_per_mxu = double((jt * groups + nm - 1) / nm);
        const double mblocks = double((s.m + tm - 1) / tm), panels = double((s.n + tn - 1) / tn);
        const double mxu = double(s.batch) * mblocks * panels * double(ktiles) * mm_per_mxu * std::max(rows * cpr, load);
        const double bytes = double(s.batch) * (double(s.m * s.k * es_of(s.a_dtype) + s.m * s.n * es_of(s.out_dtype)) +
                                                mblocks * double(s.k * s.n * es_of(s.b_dtype)));
        // The first block waits for its load and its row max pass (two vector ops per element,
        // 4/3 where the cross-lane unit shares it: make_matmul_part).
        const double first = double(std::min(tm, s.m) * s.k);
        const double ops = xlu_row_max(cfg) ? 4.0 / 3.0 : 2.0;
        const double est = std::max(mxu, bytes / bw) +
                           std::max(first * double(es_of(s.a_dtype)) / bw,
                                    ops * first / double(cfg.vpu.sublanes * cfg.vpu.lanes) * cfg.vpu.cycles_per_vreg);
        if (best < 0 || est < best) {
          best = est;
          bt = {tm, tn, tk, vm};
        }
      }
    if (best >= 0) return bt;
  }
  // B is re-read once per block of M rows. Blocks of up to 512 rows keep the first A load
  // short; all of M in one block (weights streamed through VMEM once) when re-reading B would
  // make the steps HBM-bound.
  if (s.tm == 0 && s.m > 512) {
    const double mxu_cycles = 512.0 * double((t.tk + R - 1) / R) * double((t.tn + Cm * nm - 1) / (Cm * nm)) *
                              mode_cycles_per_row(cfg, s.mode);
    const double b_cycles = double(t.tk * t.tn) * b_elem_bytes(s) / cfg.hbm_bytes_per_cycle();
    if (b_cycles > 0.7 * mxu_cycles) {
      t.tm = s.m;
      t.vmem_bytes = plan_vmem(s, t.tm, t.tn, t.tk, R).total;
      if (t.vmem_bytes <= budget) return t;
    }
  }
  t.tm = s.tm > 0 ? s.tm : std::min<int64_t>(s.m, 512);
  const int64_t ks = k_step(s, R);
  for (;;) {
    t.vmem_bytes = plan_vmem(s, t.tm, t.tn, t.tk, R).total;
    if (t.vmem_bytes <= budget) return t;
    if (s.a_row_quant > 0 && t.tm > 8) t.tm = std::max<int64_t>(8, t.tm / 2);  // K stays whole
    else if (s.a_row_quant > 0 && t.tn > Cm) t.tn = std::max(Cm, t.tn - Cm);
    else if (t.tk > 4 * ks) t.tk = std::max(ks, (t.tk / 2) / ks * ks);
    else if (t.tm > 8) t.tm = std::max<int64_t>(8, t.tm / 2);
    else if (t.tk > ks) t.tk = ks;
    else if (t.tn > Cm) t.tn = std::max(Cm, t.tn - Cm);
    else if (t.tm > 1) t.tm = std::max<int64_t>(1, t.tm / 2);
    else fail("matmul: no tiling of {}x{}x{} fits the chip's {} bytes of VMEM", s.m, s.n, s.k, cfg.memory.vmem_bytes);
  }
}

bool matmul_row_quant_fits(const sim::ChipConfig& cfg, const MatmulSpec& s) {
  const int64_t R = cfg.mxu.rows;
  return plan_vmem(s, std::min<int64_t>(s.m, 8), std::min<int64_t>(s.n, cfg.mxu.cols), std::min(s.k, R), R).total <=
         int64_t(cfg.memory.vmem_bytes) * 9 / 10;
}

int matmul_registers(int epilogue_inputs, bool a_row_scale) { return epilogue_inputs + 4 + (a_row_scale ? 1 : 0); }

namespace {

// Output tiles of a tiling, in the order the program walks them (batch, M block, N panel).
int64_t matmul_tiles(const MatmulSpec& s, const MatmulTiling& tl) {
  return s.batch * ((s.m + tl.tm - 1) / tl.tm) * ((s.n + tl.tn - 1) / tl.tn);
}

// The program for output tiles [tile_lo, tile_hi) (all K steps of each).
sim::Program make_matmul_part(const sim::ChipConfig& cfg, const MatmulSpec& s, const MatmulTiling& tl, int64_t tile_lo,
                              int64_t tile_hi) {
  const int64_t R = cfg.mxu.rows, Cm = cfg.mxu.cols, nm = cfg.mxu.count;
  const VmemPlan vp = plan_vmem(s, tl.tm, tl.tn, tl.tk, R);
  const int ne = int(s.epilogue_inputs.size());
  const int a_reg = 0, b_reg = 1, out_reg = 2 + ne, k_reg = 3 + ne, scale_reg = 4 + ne;
  const bool quant = s.a_row_quant > 0;
  const bool xlu_max = quant && xlu_row_max(cfg);
  TPU_CHECK(!(s.a_row_scale || quant) || s.a_dtype == DType::f32 || s.a_dtype == DType::bf16,
            "internal: codegen: matmul row factors need a float A, got {}", sim::dtype_name(s.a_dtype));
  TPU_CHECK(!(quant && s.a_row_scale), "internal: codegen: a_row_quant and a_row_scale together");
  const int64_t g4 = s.b_int4_group;
  const bool direct = int4_direct(s, tl.tm);
  TPU_CHECK(g4 == 0 || (g4 % 32 == 0 && s.b_transposed && s.k % g4 == 0 && !quant && !s.a_row_scale &&
                        (s.batch == 1 || s.b_batch_stride == 0) && s.b_dtype == DType::i8),
            "internal: codegen: packed int4 B needs a transposed [N, K / 2] weight, K a multiple of the group {}", g4);
  TPU_CHECK(matmul_registers(ne, s.a_row_scale || g4 > 0) <= cfg.scalar.registers, "internal: codegen: matmul epilogue has too many inputs ({})",
            ne);
  const bool epi = has_epilogue(s);
  const int64_t esa = es_of(s.a_dtype), esb = es_of(s.b_dtype), eso = es_of(s.out_dtype);
  // The MXUs' weight operand: B's panel itself, or with int4 B the bf16 panel unpacked from it.
  const DType wdt = g4 > 0 ? DType::bf16 : s.b_dtype;
  const int64_t esw = es_of(wdt);
  const int nq = cfg.dma.engines;
  const int qa = 0, qb = 1 % nq, qe = 2 % nq, qc = 3 % nq;
  const int semA = 0, semB = 1, semE = 2, semC = 3, semS = 4;

  struct Step {
    int64_t b, m0, ml, n0, nl, k0, kl;
    bool first_k, last_k;
    int tile;
  };
  const int64_t ak = quant ? s.k : tl.tk;  // A's row length in VMEM (whole rows when quantizing)
  auto a_off = [&](const Step& st) { return quant ? st.k0 : int64_t(0); };  // the step's K range in it
  auto lda = [&](const Step& st) { return quant ? ak : st.kl; };
  std::vector<Step> steps;
  int tile = 0;
  for (int64_t bi = 0; bi < s.batch; ++bi)
    for (int64_t m0 = 0; m0 < s.m; m0 += tl.tm)
      for (int64_t n0 = 0; n0 < s.n; n0 += tl.tn, ++tile)
        for (int64_t k0 = 0; k0 < s.k && tile >= tile_lo && tile < tile_hi; k0 += tl.tk)
          steps.push_back({bi, m0, std::min(tl.tm, s.m - m0), n0, std::min(tl.tn, s.n - n0), k0,
                           std::min(tl.tk, s.k - k0), k0 == 0, k0 + tl.tk >= s.k, tile});
  // Which A / B buffer each step reads, and whether it must load it (consecutive steps that read
  // the same block share the load).
  const size_t ns = steps.size();
  std::vector<int> abuf(ns), bbuf(ns);
  std::vector<bool> aload(ns), bload(ns), premax(ns);
  for (size_t i = 0; i < ns; ++i) {
    const Step& st = steps[i];
    const bool same_a = i > 0 && steps[i - 1].m0 == st.m0 && (quant || steps[i - 1].k0 == st.k0) &&
                        (steps[i - 1].b == st.b || s.a_batch_stride == 0);
    const bool same_b = i > 0 && steps[i - 1].n0 == st.n0 && steps[i - 1].k0 == st.k0 &&
                        (steps[i - 1].b == st.b || s.b_batch_stride == 0);
    aload[i] = !same_a;
    bload[i] = !same_b;
    abuf[i] = i == 0 ? 0 : (same_a ? abuf[i - 1] : 1 - abuf[i - 1]);
    bbuf[i] = i == 0 ? 0 : (same_b ? bbuf[i - 1] : 1 - bbuf[i - 1]);
  }

  B b(s.name);
  // A step's A block and B panel load as one DMA per K chunk of R (A chunk t, then B chunk t),
  // each signalling once, so the step's first K tile waits for its first chunks only instead of
  // the whole block (the first block of a 1024 x 4096 A is 8 MiB: ~9k cycles on v6e before the
  // MXUs could start). DMAs take HBM bandwidth in program order, hence the interleaving.
  auto chunks = [&](const Step& st) { return (st.kl + R - 1) / R; };
  // (chunks of at least 1,024 weights per row: their words fill the vector unit's 128 lanes)
  auto nchunks4 = [&](const Step& st) {
    return std::max<int64_t>(1, std::min<int64_t>({st.kl / std::max<int64_t>(g4, 1), st.kl / 1024, 8}));
  };
  auto chunk_k = [&](const Step& st, int64_t c) { return c * (st.kl / g4) / nchunks4(st) * g4; };
  auto achunks = [&](const Step& st) { return quant ? (ak + R - 1) / R : chunks(st); };
  auto dma_a_chunk = [&](size_t i, int64_t c) {
    const Step& st = steps[i];
    const int64_t kc = c * R, kcl = std::min(R, (quant ? ak : st.kl) - kc);
    b.dma(B::vmem_at(B::at(vp.a[abuf[i]] + kc * esa)),
          B::hbm_at(B::at((st.b * s.a_batch_stride + st.m0 * s.k + (quant ? 0 : st.k0) + kc) * esa, {{int16_t(a_reg), 1}})),
          {.rows = st.ml, .row_bytes = kcl * esa, .dst_row_stride = lda(st) * esa, .src_row_stride = s.k * esa}, qa, semA);
  };
  // In-kernel row quantization: a later A block's chunks are loaded and folded into its row max
  // over the steps of the block before it (spread evenly, so they take the HBM bandwidth and the
  // vector unit the B panels and epilogues leave), each folded a step after its load went out
  // (in the block's last step for the last ones), the factors taken at the end of that last step.
  std::vector<bool> spread(ns), scale_here(ns);
  for (size_t i = 0, start = 0; i < ns; ++i) {  // a block's chunks are scaled in its first panel's steps
    if (aload[i]) start = i;
    scale_here[i] = aload[i] || (quant && steps[i].n0 == steps[start].n0);
  }
  std::vector<std::vector<std::pair<size_t, int64_t>>> issue_at(ns), fold_at(ns);
  std::vector<std::vector<size_t>> finish_at(ns);
  for (size_t j = 1, prev = 0; j < ns && quant; ++j) {
    if (!aload[j]) continue;
    spread[j] = premax[j] = true;
    {
      const int64_t P = int64_t(j - prev), nch = achunks(steps[j]);
      for (int64_t c = 0; c < nch; ++c) {
        const size_t h = prev + size_t(c * P / nch);
        issue_at[h].push_back({j, c});
        fold_at[std::min(h + 1, j - 1)].push_back({j, c});
      }
      finish_at[j - 1].push_back(j);
    }
    prev = j;
  }
  // A block loaded ahead has its first chunks scaled ahead too (in the step before its first,
  // right after its factors), as many as the MXUs take while the vector unit runs that step's
  // epilogue; its steps scale the rest as before. How many of a step's K tiles are scaled ahead:
  const double cpr_q = mode_cycles_per_row(cfg, s.mode);
  auto n_pre = [&](size_t j) {
    const Step& st = steps[j];
    const double epi = double((st.ml + cfg.vpu.sublanes - 1) / cfg.vpu.sublanes) *
                       double((st.nl + cfg.vpu.lanes - 1) / cfg.vpu.lanes) * double(s.epilogue.steps.size() + 1) *
                       cfg.vpu.cycles_per_vreg;
    const int64_t per = std::max<int64_t>(1, int64_t(double(st.ml) * cpr_q));
    return std::min((ak + R - 1) / R, 2 + int64_t(epi) / per);
  };
  std::vector<int64_t> pre(ns, 0);
  for (size_t i = 0, start = 0; i < ns && quant; ++i) {
    if (aload[i]) start = i;
    if (premax[start]) pre[i] = std::max<int64_t>(0, n_pre(start) - steps[i].k0 / R);
  }
  auto issue_loads = [&](size_t i) {
    const Step& st = steps[i];
    if (aload[i] && s.a_row_scale)
      b.dma(B::vmem_at(B::at(vp.ascale[abuf[i]])), B::hbm_at(B::at((st.b * s.m + st.m0) * 4, {{int16_t(scale_reg), 1}})),
            {.row_bytes = st.ml * 4}, qa, semS);
    // In-kernel row quantization needs the whole A block before its first product, and the
    // row max pass reads A's chunks only: A's chunks go out first, then B's.
    if (quant && aload[i] && !spread[i])
      for (int64_t c = 0; c < achunks(st); ++c) dma_a_chunk(i, c);
    for (int64_t c = 0; c < chunks(st); ++c) {
      const int64_t kc = c * R, kcl = std::min(R, st.kl - kc);
      if (aload[i] && !quant) dma_a_chunk(i, c);
      if (!bload[i] || g4 > 0) continue;
      if (s.b_transposed)
        b.dma(B::vmem_at(B::at(vp.b[bbuf[i]] + kc * esb)),
              B::hbm_at(B::at((st.b * s.b_batch_stride + st.n0 * s.k + st.k0 + kc) * esb, {{int16_t(b_reg), 1}})),
              {.rows = st.nl, .row_bytes = kcl * esb, .dst_row_stride = st.kl * esb, .src_row_stride = s.k * esb}, qb,
              semB);
      else
        b.dma(B::vmem_at(B::at(vp.b[bbuf[i]] + kc * st.nl * esb)),
              B::hbm_at(B::at((st.b * s.b_batch_stride + (st.k0 + kc) * s.n + st.n0) * esb, {{int16_t(b_reg), 1}})),
              {.rows = kcl, .row_bytes = st.nl * esb, .src_row_stride = s.n * esb}, qb, semB);
    }
    // int4 B: the packed panel (K / 2 bytes per weight row) and its group scales, two signals;
    // int4_direct: the scales, then the panel in nchunks4 chunks of whole groups along K, a
    // signal each (unpacked one by one during the step before).
    if (bload[i] && direct) {
      const int64_t ses = s.b_int4_scale_f16 ? 2 : 4;
      b.dma(B::vmem_at(B::at(s.b_int4_scale_f16 ? vp.sc16[bbuf[i]] : vp.sc[bbuf[i]])),
            B::hbm_at(B::at((st.n0 * (s.k / g4) + st.k0 / g4) * ses, {{int16_t(scale_reg), 1}})),
            {.rows = st.nl, .row_bytes = st.kl / g4 * ses, .src_row_stride = s.k / g4 * ses}, qb, semB);
      for (int64_t c = 0; c < nchunks4(st); ++c) {
        const int64_t k0 = chunk_k(st, c), k1 = chunk_k(st, c + 1);
        b.dma(B::vmem_at(B::at(vp.b[bbuf[i]] + k0 / 2)),
              B::hbm_at(B::at(st.b * s.b_batch_stride + st.n0 * (s.k / 2) + (st.k0 + k0) / 2, {{int16_t(b_reg), 1}})),
              {.rows = st.nl, .row_bytes = (k1 - k0) / 2, .dst_row_stride = st.kl / 2, .src_row_stride = s.k / 2}, qb,
              semB);
      }
    } else if (bload[i] && g4 > 0) {
      b.dma(B::vmem_at(B::at(vp.b[bbuf[i]])),
            B::hbm_at(B::at(st.b * s.b_batch_stride + st.n0 * (s.k / 2) + st.k0 / 2, {{int16_t(b_reg), 1}})),
            {.rows = st.nl, .row_bytes = st.kl / 2, .src_row_stride = s.k / 2}, qb, semB);
      const int64_t ses = s.b_int4_scale_f16 ? 2 : 4;
      b.dma(B::vmem_at(B::at(s.b_int4_scale_f16 ? vp.sc16[bbuf[i]] : vp.sc[bbuf[i]])),
            B::hbm_at(B::at((st.n0 * (s.k / g4) + st.k0 / g4) * ses, {{int16_t(scale_reg), 1}})),
            {.rows = st.nl, .row_bytes = st.kl / g4 * ses, .src_row_stride = s.k / g4 * ses}, qb, semB);
    }
  };
  // int4 B: the step's packed panel unpacked into its bf16 panel [nl, kl] on the vector unit.
  // Weight k = 32 c + 16 h + j of a row (c its block of 32, h the nibble) is in byte 16 c + j as
  // u = q + 8. First on the panel's 32-bit words (eight weights each, the panel as one dense
  // matrix): lo = w & 0x0f0f0f0f and hi = (w >> 4) & 0x0f0f0f0f hold u of the low and high
  // nibbles in the bytes where the packed panel holds their byte. Then per sub-block t of 32
  // weights of each group, viewed as 16 rows (j) by nl * kl / group columns (the groups): the
  // bytes of lo (then hi) converted to f32 and u s - 8 s by one fused multiply-add (exactly q s
  // before its one rounding), stored as bf16. So 3 / 8 integer ops plus 2 f32 ops per weight,
  // and each weight is its dequantized f32 value rounded to bf16.
  auto dense = [&](int64_t n) {  // a dense run of n elements as a [rows, cols] matrix filling vregs
    const int64_t r = std::gcd(n, int64_t(cfg.vpu.sublanes));
    return std::array<int64_t, 2>{r, n / r};
  };
  // f16 group scales (IEEE half bits, two per 32-bit word as loaded) widened to the f32 panel
  // scales, on integer ops: per half h, the f32 bits (h & 0x7fff) << 13 with h's sign bit on top
  // read as f32 and times 2^112 are h's value (normal and subnormal alike, exactly); a half
  // with exponent 31 (inf / NaN) lands at |v| >= 2^16, where the f32 exponent bits are then set
  // (so inf stays inf, NaN NaN).
  auto f16_scales_to_f32 = [&](int64_t C, int bf) {
    const int64_t nw = (C + 1) / 2;
    const int64_t tw = (nw + 15) / 16 * 16;  // words of one temp
    const int64_t T1 = vp.qt[0], T2 = vp.qt[0] + tw * 4;
    for (int h = 0; h < 2; ++h) {
      const int64_t n = h == 0 ? nw : C / 2;
      if (n == 0) continue;
      const auto rc = dense(n);  // named members: lambdas below capture them
      const int64_t r = rc[0], c = rc[1];
      auto I = [&](int64_t at) { return B::vmem(B::at(at), DType::i32, c); };
      auto F = [&](int64_t at) { return B::vmem(B::at(at), DType::f32, c); };
      const sim::Operand W = I(vp.sc16[bf]);
      if (h == 0) {
        b.binary(sim::Op::vshl, I(T1), W, B::imm(17), r, c);    // the magnitude bits on top
        b.binary(sim::Op::vshl, I(T2), W, B::imm(16), r, c);    // the sign at bit 31
      } else {
        b.binary(sim::Op::vshrl, I(T1), W, B::imm(16), r, c);
        b.binary(sim::Op::vshl, I(T1), I(T1), B::imm(17), r, c);
        b.binary(sim::Op::vand, I(T2), W, B::imm(-2147483648.0f), r, c);
      }
      b.binary(sim::Op::vshrl, I(T1), I(T1), B::imm(4), r, c);  // (h & 0x7fff) << 13
      if (h == 0) b.binary(sim::Op::vand, I(T2), I(T2), B::imm(-2147483648.0f), r, c);
      b.binary(sim::Op::vor, I(T1), I(T1), I(T2), r, c);
      b.binary(sim::Op::vmul, F(T1), F(T1), B::imm(std::ldexp(1.0f, 112)), r, c);
      // inf / NaN halves: |v| >= 2^16 only for them; OR in the all-ones f32 exponent.
      b.unary(sim::Op::vabs, F(T2), F(T1), r, c);
      b.binary(sim::Op::vcmple, F(T2), B::imm(65536.0f), F(T2), r, c);
      b.unary(sim::Op::vcast, I(T2), F(T2), r, c);
      b.binary(sim::Op::vshl, I(T2), I(T2), B::imm(31), r, c);
      b.binary(sim::Op::vshra, I(T2), I(T2), B::imm(8), r, c);
      b.binary(sim::Op::vand, I(T2), I(T2), B::imm(2139095040.0f), r, c);  // 0x7f800000
      b.binary(sim::Op::vor, B::vmem(B::at(vp.sc[bf] + 4 * h), DType::i32, 2 * c, 2), I(T1), I(T2), r, c);
    }
  };
  // int4_direct: chunk c of step i's packed panel (rows nl, the chunk's K range) on its words.
  // Rows [r0, r0 + rn) of it (the pieces spread the vector unit's work between the groups).
  auto unpack_chunk4 = [&](size_t i, int64_t c, int64_t r0, int64_t rn) {
    const Step& st = steps[i];
    const int bf = bbuf[i];
    const int64_t k0 = chunk_k(st, c), k1 = chunk_k(st, c + 1);
    auto words = [&](int64_t at) { return B::vmem(B::at(at + r0 * (st.kl / 2) + k0 / 2), DType::i32, st.kl / 8); };
    const sim::Operand mf0 = B::vmem(B::at(vp.mask + 4), DType::i32, 0, 0),
                       m88 = B::vmem(B::at(vp.mask + 8), DType::i32, 0, 0);
    const int64_t lo = vp.dq[bf], hi = vp.dq[bf] + st.nl * st.kl / 2, cols = (k1 - k0) / 8;
    b.binary(sim::Op::vxor, words(hi), words(vp.b[bf]), m88, rn, cols);
    b.binary(sim::Op::vshl, words(lo), words(hi), B::imm(4), rn, cols);
    b.binary(sim::Op::vand, words(lo), words(lo), mf0, rn, cols);
    b.binary(sim::Op::vand, words(hi), words(hi), mf0, rn, cols);
  };
  auto unpack_int4 = [&](size_t i) {
    const Step& st = steps[i];
    const int64_t C = st.nl * (st.kl / g4);
    const int bf = bbuf[i];
    const sim::Operand t0 = B::vmem(B::at(vp.qt[0]), DType::f32, C);
    const sim::Operand scl = B::vmem(B::at(vp.sc[bf]), DType::f32, 0, 1), sh = B::vmem(B::at(vp.sh), DType::f32, 0, 1);
    if (s.b_int4_scale_f16) f16_scales_to_f32(C, bf);
    const auto [sr, scols] = dense(C);
    if (direct) {
      // The scales over 16 (the weights are 16 q), then on the words: x = w ^ 0x88888888 turns
      // each nibble u into q (4-bit two's complement); hi = x & 0xf0f0f0f0 and
      // lo = (x << 4) & 0xf0f0f0f0 hold 16 q as i8 in the bytes where the packed panel holds
      // their byte: weights 32 c + j and 32 c + 16 + j of a row at byte 16 c + j of lo and hi.
      b.binary(sim::Op::vmul, B::vmem(B::at(vp.sc[bf]), DType::f32, scols), B::vmem(B::at(vp.sc[bf]), DType::f32, scols),
               B::imm(1.0f / 16), sr, scols);
      return;  // the words: unpack_chunk4
    }
    b.binary(sim::Op::vmul, B::vmem(B::at(vp.sh), DType::f32, scols), B::vmem(B::at(vp.sc[bf]), DType::f32, scols),
             B::imm(-8.0f), sr, scols);
    const auto wrc = dense(st.nl * st.kl / 8);  // named members: the lambda below captures wc
    const int64_t wr = wrc[0], wc = wrc[1];
    auto words = [&](int64_t at) { return B::vmem(B::at(at), DType::i32, wc); };
    const sim::Operand mask = B::vmem(B::at(vp.mask), DType::i32, 0, 0);
    b.binary(sim::Op::vand, words(vp.nib[0]), words(vp.b[bf]), mask, wr, wc);
    b.binary(sim::Op::vshrl, words(vp.nib[1]), words(vp.b[bf]), B::imm(4), wr, wc);
    b.binary(sim::Op::vand, words(vp.nib[1]), words(vp.nib[1]), mask, wr, wc);
    for (int64_t t = 0; t < g4 / 32; ++t)
      for (int h = 0; h < 2; ++h) {
        const sim::Operand u = B::vmem(B::at(vp.nib[h] + 16 * t), DType::i8, 1, g4 / 2);
        const sim::Operand out = B::vmem(B::at(vp.dq[bf] + (32 * t + 16 * h) * 2), DType::bf16, 1, g4);
        b.unary(sim::Op::vcast, t0, u, 16, C);
        b.ternary(sim::Op::vfma, out, t0, scl, sh, 16, C);
      }
  };

  b.signal(semC, 2);  // both store buffers start free
  int64_t extra_stores = 0;  // stores beyond one per tile (signals on semC)
  if (g4 > 0) {  // the nibble mask 0x0f0f0f0f, built from immediates (which are f32 values)
    const sim::Operand m = B::vmem(B::at(vp.mask), DType::i32), tmp = B::vmem(B::at(vp.nib[0]), DType::i32);
    b.binary(sim::Op::vor, m, B::imm(15), B::imm(0), 1, 1);
    b.binary(sim::Op::vshl, tmp, m, B::imm(8), 1, 1);
    b.binary(sim::Op::vor, m, m, tmp, 1, 1);
    b.binary(sim::Op::vshl, tmp, m, B::imm(16), 1, 1);
    b.binary(sim::Op::vor, m, m, tmp, 1, 1);
    const sim::Operand mf0 = B::vmem(B::at(vp.mask + 4), DType::i32), m88 = B::vmem(B::at(vp.mask + 8), DType::i32);
    b.binary(sim::Op::vxor, mf0, m, B::imm(-1), 1, 1);
    b.binary(sim::Op::vor, m88, B::imm(136), B::imm(0), 1, 1);
    b.binary(sim::Op::vshl, tmp, m88, B::imm(8), 1, 1);
    b.binary(sim::Op::vor, m88, m88, tmp, 1, 1);
    b.binary(sim::Op::vshl, tmp, m88, B::imm(16), 1, 1);
    b.binary(sim::Op::vor, m88, m88, tmp, 1, 1);
  }
  if (ns) issue_loads(0);
  for (size_t i = 0; i < ns; ++i) {
    const Step& st = steps[i];
    const int par = st.tile % 2;
    // Epilogue operands of this tile load while it computes, ahead of the next step's loads:
    // DMAs take HBM bandwidth in program order, and behind a whole next B panel (29 MiB for a
    // 1024 x 14336 x 4096 linear) the epilogue's wait would stall issue, and the MXUs with it,
    // long after this tile's matmuls are done.
    std::vector<sim::Operand> epi_ops;
    int epi_loads = 0;
    if (st.last_k) {
      epi_ops.push_back(B::vmem(B::at(vp.acc[par]), DType::f32, st.nl));
      for (int e = 0; e < ne; ++e) {
        const EwInput& in = s.epilogue_inputs[size_t(e)];
        const int64_t es = es_of(in.dtype), buf = vp.epi[size_t(e)][size_t(par)];
        const int16_t reg = int16_t(2 + e);
        switch (in.layout) {
          case EwLayout::full:
            b.dma(B::vmem_at(B::at(buf)), B::hbm_at(B::at((st.b * s.m * s.n + st.m0 * s.n + st.n0) * es, {{reg, 1}})),
                  {.rows = st.ml, .row_bytes = st.nl * es, .src_row_stride = s.n * es}, qe, semE);
            epi_ops.push_back(B::vmem(B::at(buf), in.dtype, st.nl));
            ++epi_loads;
            break;
          case EwLayout::row:
            b.dma(B::vmem_at(B::at(buf)), B::hbm_at(B::at(st.n0 * es, {{reg, 1}})), {.row_bytes = st.nl * es}, qe, semE);
            epi_ops.push_back(B::vmem(B::at(buf), in.dtype, 0));
            ++epi_loads;
            break;
          case EwLayout::col:
            b.dma(B::vmem_at(B::at(buf)), B::hbm_at(B::at((st.b * s.m + st.m0) * es, {{reg, 1}})),
                  {.row_bytes = st.ml * es}, qe, semE);
            epi_ops.push_back(B::vmem(B::at(buf), in.dtype, 1, 0));
            ++epi_loads;
            break;
          case EwLayout::scalar:
            b.dma(B::vmem_at(B::at(buf)), B::hbm_at(B::at(0, {{reg, 1}})), {.row_bytes = es}, qe, semE);
            epi_ops.push_back(B::vmem(B::at(buf), in.dtype, 0, 0));
            ++epi_loads;
            break;
        }
      }
    }
    if (st.last_k && quant) epi_ops.push_back(B::vmem(B::at(vp.asx[abuf[i]]), DType::f32, 1, 0));
    // The next step's loads go out next (they take the HBM bandwidth this step's chunks leave);
    // this step's chunks are waited for one K tile at a time below.
    for (const auto& [j, c] : issue_at[i])  // folded in this step: ahead of the next B panel
      if (std::find(fold_at[i].begin(), fold_at[i].end(), std::pair<size_t, int64_t>{j, c}) != fold_at[i].end())
        dma_a_chunk(j, c);
    if (i + 1 < ns) issue_loads(i + 1);
    for (const auto& [j, c] : issue_at[i])
      if (std::find(fold_at[i].begin(), fold_at[i].end(), std::pair<size_t, int64_t>{j, c}) == fold_at[i].end())
        dma_a_chunk(j, c);
    if (i == 0 && bload[i] && g4 > 0) {  // later panels are unpacked during the step before theirs
      b.wait(semB, 2);  // the packed panel and its scales; int4_direct: its scales and first chunk
      unpack_int4(i);
      if (direct) unpack_chunk4(i, 0, 0, st.nl);
    }
    if (st.first_k && !epi) b.wait(semC);  // the accumulator is the store buffer
    // The MXUs: column tile j of the panel on its own MXU, K tiles of R rows. A panel narrower
    // than the MXUs (N of 128-384 on four 128-wide arrays) splits its rows into groups so every
    // MXU streams: each group loads the same weights and streams its rows.
    const int64_t ktiles_full = st.kl / R, k_tail = st.kl % R;
    const int64_t jt = (st.nl + Cm - 1) / Cm;
    const int64_t groups = jt < nm ? std::max<int64_t>(1, std::min(nm / jt, st.ml / 8)) : 1;
    const int64_t group_rows = ((st.ml + groups - 1) / groups + 7) / 8 * 8;
    bool scale_waited = false;
    // The row max m of |A| over a whole block as its chunks land, then the factors (1 / m) Q
    // (scaling the chunks before the MXUs read them) and m / Q (the epilogue's column input).
    // With the cross-lane unit (xlu_max): m = max(max_k A, -min_k A), each chunk's min on the
    // vector unit into a running [rows, R] tile and its max, for two chunks in three, as a row
    // reduction on the cross-lane unit into its own column of qx (for the third, on the vector
    // unit into a second running tile), so the two units share the pass (4/3 of a vector pass
    // over the block each, against two for the vector unit alone); the tiles are folded to one
    // vector register's width (-min into the max tile) and reduced across lanes, the chunks'
    // columns with one more holding 1e-30 (written with the block's first chunk) reduced as well,
    // and the larger of the two is m = max(max |A|, 1e-30).
    // Without: |chunk| into a running tile on the vector unit, folded by halving steps.
    // A step whose successor loads a new A block of the same K chunks folds that block's chunks
    // after its own K tiles, so the vector unit takes it while the MXUs stream.
    auto chunk_op = [&](size_t j, int64_t kt_off, bool in_loop) {
      sim::Addr a = B::at(vp.a[abuf[j]] + kt_off * R * esa);
      if (in_loop) a.terms[0] = {int16_t(k_reg), R * esa};
      return B::vmem(a, s.a_dtype, ak);
    };
    const int64_t W = std::min(R, ak), NX = (ak + R - 1) / R;
    auto qmax_tile = [&](int64_t off) { return B::vmem(B::at(vp.qmax + off * 4), DType::f32, W); };
    auto qmin_tile = [&](int64_t off) { return B::vmem(B::at(vp.qmin + off * 4), DType::f32, W); };
    auto qx_col = [&](int64_t col) { return B::vmem(B::at(vp.qx + col * 4), DType::f32, NX + 2); };
    const int64_t n_xlu = xlu_max ? NX - (NX + 2) / 3 : 0;  // chunks c with c % 3 != 0
    auto max_chunk = [&](size_t j, int64_t c, int64_t kk) {
      const int64_t ml = steps[j].ml;
      const sim::Operand x = chunk_op(j, c, false);
      if (!xlu_max) {
        b.wait(semA);
        if (c == 0) {  // chunk 0 is whole: W columns
          b.unary(sim::Op::vabs, qmax_tile(0), x, ml, kk);
        } else {
          b.unary(sim::Op::vabs, qmin_tile(0), x, ml, kk);  // the min tile as scratch
          b.binary(sim::Op::vmax, qmax_tile(0), qmax_tile(0), qmin_tile(0), ml, kk);
        }
        return;
      }
      if (c == 0) b.fill(qx_col(n_xlu), 1e-30f, ml, 1);
      b.wait(semA);
      if (c == 0) b.unary(sim::Op::vmov, qmin_tile(0), x, ml, kk);
      else b.binary(sim::Op::vmin, qmin_tile(0), qmin_tile(0), x, ml, kk);
      if (c % 3 != 0) b.reduce(sim::Op::xmax, qx_col(c - (c + 2) / 3), x, ml, kk, 1);
      else if (c == 0) b.unary(sim::Op::vmov, qmax_tile(0), x, ml, kk);
      else b.binary(sim::Op::vmax, qmax_tile(0), qmax_tile(0), x, ml, kk);
    };
    auto max_finish = [&](size_t j) {
      const int64_t ml = steps[j].ml;
      const sim::Operand mcol = B::vmem(B::at(vp.qm), DType::f32, 1);
      // The chunks' columns and 1e-30 reduced while the vector unit folds the tiles.
      if (xlu_max) b.reduce(sim::Op::xmax, qx_col(n_xlu + 1), qx_col(0), ml, n_xlu + 1, 1);
      int64_t w = W;
      for (; w > (xlu_max ? cfg.vpu.lanes : 1); w = (w + 1) / 2) {
        const int64_t h = (w + 1) / 2;
        if (xlu_max) b.binary(sim::Op::vmin, qmin_tile(0), qmin_tile(0), qmin_tile(h), ml, w - h);
        b.binary(sim::Op::vmax, qmax_tile(0), qmax_tile(0), qmax_tile(h), ml, w - h);
      }
      if (xlu_max) {
        b.binary(sim::Op::vmul, qmin_tile(0), qmin_tile(0), B::imm(-1), ml, w);
        b.binary(sim::Op::vmax, qmax_tile(0), qmax_tile(0), qmin_tile(0), ml, w);
        b.reduce(sim::Op::xmax, mcol, qmax_tile(0), ml, w, 1);
        b.binary(sim::Op::vmax, mcol, mcol, qx_col(n_xlu + 1), ml, 1);
      } else {
        b.binary(sim::Op::vmax, mcol, qmax_tile(0), B::imm(1e-30f), ml, 1);
      }
      const sim::Operand fac = B::vmem(B::at(vp.ascale[abuf[j]]), DType::f32, 1);
      b.unary(sim::Op::vrecip, fac, mcol, ml, 1);  // the vector unit's divide runs under it
      b.binary(sim::Op::vdiv, B::vmem(B::at(vp.asx[abuf[j]]), DType::f32, 1), mcol, B::imm(s.a_row_quant), ml, 1);
      b.binary(sim::Op::vmul, fac, fac, B::imm(s.a_row_quant), ml, 1);
    };
    // A block loaded ahead is scaled right after its factors, chunk by chunk, before this step's
    // epilogue: the next step's MXUs start on scaled chunks instead of waiting for the vector
    // unit to finish the epilogue first.
    auto prescale = [&](size_t j) {
      const int64_t ml = steps[j].ml;
      for (int64_t c = 0; c < n_pre(j); ++c) {
        const sim::Operand x = chunk_op(j, c, false);
        b.binary(sim::Op::vmul, x, x, B::vmem(B::at(vp.ascale[abuf[j]]), DType::f32, 1, 0), ml, std::min(R, ak - c * R));
      }
    };
    if (aload[i] && quant && !premax[i]) {
      for (int64_t c = 0; c < NX; ++c) max_chunk(i, c, std::min(R, ak - c * R));
      max_finish(i);
    }
    auto ktile = [&](int64_t kt_off, int64_t kk, bool acc, bool in_loop) {
      if (aload[i] && !quant) b.wait(semA);
      if ((aload[i] && s.a_row_scale) || (quant && scale_here[i] && kt_off >= pre[i])) {  // this chunk of A times its rows' factors, in place
        if (!scale_waited && !quant) b.wait(semS);
        scale_waited = true;
        sim::Addr chunk = B::at(vp.a[abuf[i]] + (a_off(st) + kt_off * R) * esa);
        if (in_loop) chunk.terms[0] = {int16_t(k_reg), R * esa};
        b.binary(sim::Op::vmul, B::vmem(chunk, s.a_dtype, lda(st)), B::vmem(chunk, s.a_dtype, lda(st)),
                 B::vmem(B::at(vp.ascale[abuf[i]]), DType::f32, 1, 0), st.ml, kk);
      }
      if (bload[i] && g4 == 0) b.wait(semB);
      for (int64_t jg = 0; jg < jt * groups; ++jg) {
        const int64_t j = jg / groups, r0 = (jg % groups) * group_rows;
        const int64_t rl = std::min(group_rows, st.ml - r0);
        if (rl <= 0) continue;
        const int64_t nn = std::min(Cm, st.nl - j * Cm);
        const int mxu = int(jg % nm);
        sim::Addr w, lhs = B::at(vp.a[abuf[i]] + (r0 * lda(st) + a_off(st) + kt_off * R) * esa);
        if (in_loop) lhs.terms[0] = {int16_t(k_reg), R * esa};
        sim::Operand wop;
        if (s.b_transposed) {
          w = B::at((g4 > 0 ? vp.dq[bbuf[i]] : vp.b[bbuf[i]]) + (j * Cm * st.kl + kt_off * R) * esw);
          if (in_loop) w.terms[0] = {int16_t(k_reg), R * esw};
          wop = B::vmem(w, wdt, 1, st.kl);
        } else {
          w = B::at(vp.b[bbuf[i]] + (kt_off * R * st.nl + j * Cm) * esb);
          if (in_loop) w.terms[0] = {int16_t(k_reg), R * st.nl * esb};
          wop = B::vmem(w, s.b_dtype, st.nl);
        }
        b.mxu_load_weights(mxu, wop, kk, nn, s.mode);
        b.mxu_matmul(mxu, B::vmem(B::at(vp.acc[par] + (r0 * st.nl + j * Cm) * 4), DType::f32, st.nl),
                     B::vmem(lhs, s.a_dtype, lda(st)), rl, kk, nn, acc, s.mode);
      }
    };
    if (direct) {
      // Per group: its 16-row halves through the MXUs into gt (i8 weights 16 q, exact in bf16),
      // then acc = gt x scale / 16 (+ acc) for the group's scales, a row vector.
      if (aload[i]) b.wait(semA, chunks(st));
      const int64_t ng = st.kl / g4, half = st.nl * st.kl / 2;
      // Group G's product is folded into acc lag groups later in program order, when the MXUs'
      // fill and drain have passed: a fold issued earlier would wait in the vector unit's queue,
      // and a full queue stalls the issue of the MXUs' work.
      const int64_t per_group = std::max<int64_t>(
          1, int64_t(double(g4) * cfg.mxu.weight_load_cycles_per_row) * ((jt + nm - 1) / nm));
      const int64_t lag = std::min<int64_t>(
          vp.ngt - 2, int64_t((cfg.mxu.fill_cycles + cfg.mxu.drain_cycles + cfg.vpu.latency) / double(per_group)) + 1);
      auto fold = [&](int64_t G) {
        const sim::Operand accop = B::vmem(B::at(vp.acc[par]), DType::f32, st.nl);
        const sim::Operand gtop = B::vmem(B::at(vp.gt[size_t(G % vp.ngt)]), DType::f32, st.nl);
        const sim::Operand scrow = B::vmem(B::at(vp.sc[bbuf[i]] + G * 4), DType::f32, 0, ng);
        if (st.first_k && G == 0) b.binary(sim::Op::vmul, accop, gtop, scrow, st.ml, st.nl);
        else b.ternary(sim::Op::vfma, accop, gtop, scrow, accop, st.ml, st.nl);
      };
      // Unpacking in pieces of 128 rows between the groups: the step's own chunk c + 1 over the
      // groups of chunk c, and the next step's first chunk (with its scales) over the last chunk's
      // groups (from the middle of the step on at least), by when its DMA, issued at this step's
      // start, has landed at HBM speed.
      std::vector<std::vector<std::array<int64_t, 4>>> work(static_cast<size_t>(ng));  // {step, chunk, r0, rows}
      auto spread = [&](size_t step, int64_t c, int64_t g0, int64_t g1) {
        const int64_t nl1 = steps[step].nl, pieces = std::max<int64_t>(1, nl1 / 128);
        g1 = std::max(g1, g0 + 1);
        for (int64_t pc = 0; pc < pieces; ++pc)
          work[size_t(std::min(ng - 1, g0 + pc * (g1 - g0) / pieces))].push_back(
              {int64_t(step), c, pc * nl1 / pieces, (pc + 1) * nl1 / pieces - pc * nl1 / pieces});
      };
      const int64_t nch = nchunks4(st);
      auto first_group = [&](int64_t c) { return chunk_k(st, c) / g4; };
      if (bload[i])
        for (int64_t c = 0; c + 1 < nch; ++c) spread(i, c + 1, first_group(c), first_group(c + 1));
      if (i + 1 < ns && bload[i + 1]) spread(i + 1, 0, std::max(first_group(nch - 1), ng / 2), ng);
      for (int64_t G = 0; G < ng; ++G) {
        for (const auto& [step, c, r0, rn] : work[size_t(G)]) {
          if (r0 == 0) {
            if (c == 0) {
              b.wait(semB);  // the next panel's scales
              unpack_int4(size_t(step));
            }
            b.wait(semB);
          }
          unpack_chunk4(size_t(step), c, r0, rn);
        }
        const size_t gp = size_t(G % vp.ngt);
        const int64_t kr = std::min<int64_t>(R, 16);  // rows per pass (16, or the array's rows if fewer)
        for (int64_t t = 0; t < g4 / 32; ++t)
          for (int h = 0; h < 2; ++h)
            for (int64_t r0 = 0; r0 < 16; r0 += kr)
              for (int64_t j = 0; j < jt; ++j) {
                const int64_t nn = std::min(Cm, st.nl - j * Cm), kk = std::min(kr, 16 - r0);
                const int mxu = int((j + G * jt) % nm);
                const sim::Operand wop =
                    B::vmem(B::at(vp.dq[bbuf[i]] + h * half + j * Cm * (st.kl / 2) + (G * g4 / 32 + t) * 16 + r0),
                            DType::i8, 1, st.kl / 2);
                b.mxu_load_weights(mxu, wop, kk, nn, s.mode);
                const sim::Operand lhs = B::vmem(
                    B::at(vp.a[abuf[i]] + (a_off(st) + G * g4 + 32 * t + 16 * h + r0) * esa), s.a_dtype, lda(st));
                b.mxu_matmul(mxu, B::vmem(B::at(vp.gt[gp] + j * Cm * 4), DType::f32, st.nl), lhs, st.ml, kk, nn,
                             t > 0 || h > 0 || r0 > 0, s.mode);
              }
        if (G >= lag) fold(G - lag);
      }
      for (int64_t G = std::max<int64_t>(0, ng - lag); G < ng; ++G) fold(G);
    } else if (ktiles_full > 0) {
      ktile(0, R, !st.first_k, false);
      // K tiles [1, t) read chunks scaled ahead, [t, full) scale theirs: one loop each.
      const int64_t t = std::clamp<int64_t>(pre[i], 1, ktiles_full);
      if (t > 1) {
        b.loop(k_reg, t - 1);
        ktile(1, R, true, true);
        b.end_loop();
      }
      if (ktiles_full > t) {
        b.loop(k_reg, ktiles_full - t);
        ktile(t, R, true, true);
        b.end_loop();
      }
    }
    if (!direct && k_tail > 0) ktile(ktiles_full, k_tail, !(st.first_k && ktiles_full == 0), false);
    for (const auto& [j, c] : fold_at[i]) max_chunk(j, c, std::min(R, ak - c * R));
    for (const size_t j : finish_at[i]) {
      max_finish(j);
      prescale(j);
    }
    // int4 B: the next step's panel unpacked while this step's matmuls stream (its own bf16
    // buffer; the epilogue below waits for it).
    if (i + 1 < ns && bload[i + 1] && g4 > 0 && !direct) {
      b.wait(semB, 2);
      unpack_int4(i + 1);
    }
    if (!st.last_k) continue;
    if (epi_loads) b.wait(semE, epi_loads);
    if (epi) b.wait(semC);
    // The program's last tile with row quantization (its epilogue two multiplies per output)
    // runs its epilogue and store in pieces of rows, each piece's store under the next one's
    // epilogue, so less of them is left after the last MXU pass.
    const bool split = quant && epi && i + 1 == ns && st.ml >= 32;
    const int64_t piece = split ? (st.ml / 8 + 7) / 8 * 8 : st.ml;
    for (int64_t r0 = 0; r0 < st.ml; r0 += piece, ++extra_stores) {
      const int64_t rl = std::min(piece, st.ml - r0);
      auto rows_at = [&](sim::Operand o) {  // the operand from row r0 on
        o.addr.offset += r0 * std::max<int64_t>(o.row_stride, 0) * es_of(o.dtype);
        return o;
      };
      if (epi) {
        std::vector<sim::Operand> ops;
        for (const sim::Operand& o : epi_ops) ops.push_back(rows_at(o));
        emit_vec_expr(b, s.epilogue, ops, rows_at(B::vmem(B::at(vp.out[par]), s.out_dtype, st.nl)),
                      TempArena{vp.arena.base, vp.arena.slot_bytes, st.nl, vp.arena.slots}, rl, st.nl);
      }
      b.dma(B::hbm_at(B::at((st.b * s.m * s.n + (st.m0 + r0) * s.n + st.n0) * eso, {{int16_t(out_reg), 1}})),
            B::vmem_at(B::at(vp.out[par] + r0 * st.nl * eso)),
            {.rows = rl, .row_bytes = st.nl * eso, .dst_row_stride = s.n * eso}, qc, semC);
    }
    --extra_stores;
  }
  b.wait(semC, 2 + int(extra_stores));
  b.fence();
  return b.finish();
}

}  // namespace

sim::Program make_matmul_program(const sim::ChipConfig& cfg, const MatmulSpec& s) {
  MatmulTiling tl = choose_matmul_tiling(cfg, s);
  // Megacore: the output tiles are split between the cores when the matmul is big enough (one
  // core's estimate: MXU streaming over its MXUs, or its share of the HBM traffic). With fewer
  // tiles than cores, M is cut into one block per core.
  const double per_row = mode_cycles_per_row(cfg, s.mode);
  const double stream = double(s.batch * s.m) * double((s.k + cfg.mxu.rows - 1) / cfg.mxu.rows) *
                        double((s.n + cfg.mxu.cols - 1) / cfg.mxu.cols) * per_row / cfg.mxu.count;
  const double bytes = double(s.batch) * double(s.m * s.k * es_of(s.a_dtype) + s.m * s.n * es_of(s.out_dtype)) +
                       double(s.k * s.n) * b_elem_bytes(s) * (s.b_batch_stride ? double(s.batch) : 1.0);
  const int cores = megacore_cores(cfg, std::max(stream, bytes / cfg.hbm_bytes_per_cycle()));
  if (cores > 1 && matmul_tiles(s, tl) < cores && s.tm == 0 && s.m >= 8 * cores) {
    MatmulSpec cut = s;
    cut.tm = ((s.m + cores - 1) / cores + 7) / 8 * 8;
    tl = choose_matmul_tiling(cfg, cut);
  }
  const int64_t tiles = matmul_tiles(s, tl);
  if (cores == 1 || tiles < cores) return make_matmul_part(cfg, s, tl, 0, tiles);
  sim::Program p;
  p.name = s.name;
  for (int c = 0; c < cores; ++c) p.cores.push_back(make_matmul_part(cfg, s, tl, tiles * c / cores, tiles * (c + 1) / cores));
  p.finalize();
  return p;
}

}  // namespace tpu::codegen
