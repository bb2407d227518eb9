#include "codegen/mlp_kernel.h"

#include <algorithm>

#include <fmt/format.h>

#include "sim/builder.h"
#include "tpucore/core/error.h"

namespace tpu::codegen {

using B = sim::ProgramBuilder;
using sim::DType;

namespace {

int64_t es_of(DType t) { return sim::dtype_size(t); }

int slots_of(const VecExpr& e, const std::vector<EwInput>& ins) {
  std::vector<DType> d{DType::f32};
  for (const EwInput& i : ins) d.push_back(i.dtype);
  return vec_temp_slots(e, d);
}

struct MlpVmem {
  int64_t x = 0, w1[2]{}, hacc[2]{}, h[2]{}, w2[2]{}, acc = 0, out[2]{};
  std::vector<std::array<int64_t, 2>> e1, e2;
  TempArena a1, a2;
  int64_t total = 0;
};

MlpVmem plan(const MlpSpec& s, int64_t th, int64_t rc) {
  MlpVmem v;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t o = at;
    at = align64(at + bytes);
    return o;
  };
  const int64_t es = es_of(s.dtype);
  v.x = take(s.m * s.k1 * es);
  for (int i = 0; i < 2; ++i) v.w1[i] = take(th * s.k1 * es);
  for (int i = 0; i < 2; ++i) v.hacc[i] = take(s.m * th * 4);
  for (int i = 0; i < 2; ++i) v.h[i] = take(s.m * th * es);
  for (int i = 0; i < 2; ++i) v.w2[i] = take(s.n2 * th * es);
  v.acc = take(s.m * s.n2 * 4);
  for (int i = 0; i < 2; ++i) v.out[i] = take(rc * s.n2 * es_of(s.out_dtype));
  for (const EwInput& in : s.epi1_inputs) v.e1.push_back({take(ew_tile_bytes(in, s.m, th)), take(ew_tile_bytes(in, s.m, th))});
  for (const EwInput& in : s.epi2_inputs) v.e2.push_back({take(ew_tile_bytes(in, rc, s.n2)), take(ew_tile_bytes(in, rc, s.n2))});
  v.a1 = {at, align64(s.m * th * 4), th, slots_of(s.epi1, s.epi1_inputs)};
  at += v.a1.slot_bytes * v.a1.slots;
  v.a2 = {at, align64(rc * s.n2 * 4), s.n2, slots_of(s.epi2, s.epi2_inputs)};
  at += v.a2.slot_bytes * v.a2.slots;
  v.total = at;
  return v;
}

}  // namespace

std::string mlp_key(const MlpSpec& s) {
  std::string k = fmt::format("mlp:{}x{}x{}x{}:{}>{}:{}:", s.m, s.k1, s.n1, s.n2, sim::dtype_name(s.dtype),
                              sim::dtype_name(s.out_dtype), sim::mxu_mode_name(s.mode));
  for (const EwInput& in : s.epi1_inputs) k += fmt::format("{}{},", int(in.layout), sim::dtype_name(in.dtype));
  k += s.epi1.key() + "|";
  for (const EwInput& in : s.epi2_inputs) k += fmt::format("{}{},", int(in.layout), sim::dtype_name(in.dtype));
  return k + s.epi2.key();
}

std::optional<MlpTiling> choose_mlp_tiling(const sim::ChipConfig& cfg, const MlpSpec& s) {
  for (const EwInput& in : s.epi1_inputs)
    if (in.layout != EwLayout::row && in.layout != EwLayout::scalar) return std::nullopt;
  const int64_t budget = int64_t(cfg.memory.vmem_bytes) * 9 / 10;
  const int64_t Cm = cfg.mxu.cols;
  for (int64_t th = std::min<int64_t>(s.n1, int64_t(cfg.mxu.count) * Cm); th >= 1; th = th > Cm ? th - Cm : th / 2)
    for (int64_t rc = std::min<int64_t>(s.m, 256); rc >= 1; rc /= 2) {
      const int64_t need = plan(s, th, rc).total;
      if (need <= budget) return MlpTiling{th, rc, need};
      if (rc == 1) break;
    }
  return std::nullopt;
}

int mlp_registers(const MlpSpec& s) { return int(s.epi1_inputs.size() + s.epi2_inputs.size()) + 5; }

sim::Program make_mlp_program(const sim::ChipConfig& cfg, const MlpSpec& s, const MlpTiling& t) {
  const MlpVmem v = plan(s, t.th, t.rc);
  TPU_CHECK(uint64_t(v.total) <= cfg.memory.vmem_bytes, "internal: codegen: MLP plan needs {} bytes of VMEM", v.total);
  const int64_t R = cfg.mxu.rows, Cm = cfg.mxu.cols, nm = cfg.mxu.count, es = es_of(s.dtype);
  const int n1in = int(s.epi1_inputs.size()), n2in = int(s.epi2_inputs.size());
  const int e1_reg = 3, e2_reg = 3 + n1in, out_reg = 3 + n1in + n2in, k_reg = out_reg + 1;
  TPU_CHECK(mlp_registers(s) <= cfg.scalar.registers, "internal: codegen: MLP epilogues have too many inputs");
  const int nq = cfg.dma.engines;
  const int qx = 0, qw1 = 1 % nq, qw2 = 2 % nq, qe = 3 % nq;
  const int sX = 0, sW1 = 1, sW2 = 2, sE1 = 3, sE2 = 4, sOut = 5;
  const int64_t th = t.th, NC = (s.n1 + th - 1) / th;
  auto h0 = [&](int64_t c) { return c * th; };
  auto hl = [&](int64_t c) { return std::min(th, s.n1 - c * th); };

  B b("mlp");
  auto load_w1 = [&](int64_t c) {
    b.dma(B::vmem_at(B::at(v.w1[c % 2])), B::hbm_at(B::at(h0(c) * s.k1 * es, {{1, 1}})),
          {.rows = hl(c), .row_bytes = s.k1 * es}, qw1, sW1);
  };
  auto load_w2 = [&](int64_t c) {
    b.dma(B::vmem_at(B::at(v.w2[c % 2])), B::hbm_at(B::at(h0(c) * es, {{2, 1}})),
          {.rows = s.n2, .row_bytes = hl(c) * es, .src_row_stride = s.n1 * es}, qw2, sW2);
  };
  auto load_e1 = [&](int64_t c) {
    for (int i = 0; i < n1in; ++i) {
      const EwInput& in = s.epi1_inputs[size_t(i)];
      const int64_t e = es_of(in.dtype);
      const bool row = in.layout == EwLayout::row;
      b.dma(B::vmem_at(B::at(v.e1[size_t(i)][size_t(c % 2)])), B::hbm_at(B::at(row ? h0(c) * e : 0, {{int16_t(e1_reg + i), 1}})),
            {.row_bytes = row ? hl(c) * e : e}, qe, sE1);
    }
  };
  // rows x (k tiles of R) x (column tiles of Cm) on the MXUs; weights stored [n, k] (row stride ldw).
  auto mxu_pass = [&](int64_t lhs, int64_t lda, int64_t w, int64_t ldw, int64_t kdim, int64_t ndim, int64_t outb,
                      int64_t ldo, bool first_acc) {
    const int64_t kt_full = kdim / R, k_tail = kdim % R, jt = (ndim + Cm - 1) / Cm;
    // Fewer column tiles than MXUs: the rows are split over the idle MXUs too (each loads the
    // same weight tile), so a narrow hidden chunk or output does not leave MXUs idle.
    const int64_t splits = std::max<int64_t>(1, std::min(nm / jt, s.m / 8));
    const int64_t rb = (s.m + splits - 1) / splits;
    // K tiles outer, column tiles inner: the MXUs work side by side (the issue queue of one
    // MXU never holds back the others).
    auto ktile = [&](int64_t kt, int64_t kk, bool acc, bool in_loop) {
      for (int64_t j = 0; j < jt; ++j)
        for (int64_t p = 0; p < splits; ++p) {
          const int64_t nn = std::min(Cm, ndim - j * Cm), r0 = p * rb, rows = std::min(rb, s.m - r0);
          if (rows <= 0) continue;
          const int mxu = int((j * splits + p) % nm);
          sim::Addr wa = B::at(w + (j * Cm * ldw + kt * R) * es), la = B::at(lhs + (r0 * lda + kt * R) * es);
          if (in_loop) {
            wa.terms[0] = {int16_t(k_reg), R * es};
            la.terms[0] = {int16_t(k_reg), R * es};
          }
          b.mxu_load_weights(mxu, B::vmem(wa, s.dtype, 1, ldw), kk, nn, s.mode);
          b.mxu_matmul(mxu, B::vmem(B::at(outb + (r0 * ldo + j * Cm) * 4), DType::f32, ldo), B::vmem(la, s.dtype, lda),
                       rows, kk, nn, acc, s.mode);
        }
    };
    if (kt_full > 0) {
      ktile(0, R, !first_acc, false);
      if (kt_full > 1) {
        b.loop(k_reg, kt_full - 1);
        ktile(1, R, true, true);
        b.end_loop();
      }
    }
    if (k_tail > 0) ktile(kt_full, k_tail, !(first_acc && kt_full == 0), false);
  };
  auto phase1 = [&](int64_t c) {
    mxu_pass(v.x, s.k1, v.w1[c % 2], s.k1, s.k1, hl(c), v.hacc[c % 2], hl(c), true);
  };
  auto epi1 = [&](int64_t c) {
    std::vector<sim::Operand> ops{B::vmem(B::at(v.hacc[c % 2]), DType::f32, hl(c))};
    for (int i = 0; i < n1in; ++i)
      ops.push_back(B::vmem(B::at(v.e1[size_t(i)][size_t(c % 2)]), s.epi1_inputs[size_t(i)].dtype, 0,
                            s.epi1_inputs[size_t(i)].layout == EwLayout::row ? 1 : 0));
    TempArena a = v.a1;
    a.ld = hl(c);
    emit_vec_expr(b, s.epi1, ops, B::vmem(B::at(v.h[c % 2]), s.dtype, hl(c)), a, s.m, hl(c));
  };
  auto phase2 = [&](int64_t c) { mxu_pass(v.h[c % 2], hl(c), v.w2[c % 2], hl(c), hl(c), s.n2, v.acc, s.n2, c == 0); };

  b.signal(sOut, 2);
  b.dma(B::vmem_at(B::at(v.x)), B::hbm_at(B::at(0, {{0, 1}})), {.rows = s.m, .row_bytes = s.k1 * es}, qx, sX);
  load_w1(0);
  load_w2(0);
  load_e1(0);
  b.wait(sX);
  b.wait(sW1);
  if (NC > 1) load_w1(1);
  phase1(0);
  if (n1in) b.wait(sE1, n1in);
  epi1(0);
  if (NC > 1) load_e1(1);
  // Chunk c's second matmul is issued before epilogue 1 of chunk c + 1: the vector unit's
  // instructions wait for H_{c+1} in its in-order queue (holding up the issue of what follows),
  // and the MXUs have H_c W2c^T queued meanwhile instead of idling.
  for (int64_t c = 0; c < NC; ++c) {
    if (c + 1 < NC) {
      b.wait(sW1);
      if (c + 2 < NC) load_w1(c + 2);
      phase1(c + 1);
    }
    b.wait(sW2);
    if (c + 1 < NC) load_w2(c + 1);
    phase2(c);
    if (c + 1 < NC) {
      if (n1in) b.wait(sE1, n1in);
      epi1(c + 1);
      if (c + 2 < NC) load_e1(c + 2);
    }
  }
  // Epilogue 2 over row chunks of the accumulator, stores double-buffered.
  const int64_t eso = es_of(s.out_dtype);
  int64_t ci = 0;
  for (int64_t r0 = 0; r0 < s.m; r0 += t.rc, ++ci) {
    const int64_t rl = std::min(t.rc, s.m - r0);
    const int par = int(ci % 2);
    std::vector<sim::Operand> ops{B::vmem(B::at(v.acc + r0 * s.n2 * 4), DType::f32, s.n2)};
    int loads = 0;
    for (int i = 0; i < n2in; ++i) {
      const EwInput& in = s.epi2_inputs[size_t(i)];
      const int64_t e = es_of(in.dtype), buf = v.e2[size_t(i)][size_t(par)];
      const int16_t reg = int16_t(e2_reg + i);
      switch (in.layout) {
        case EwLayout::full:
          b.dma(B::vmem_at(B::at(buf)), B::hbm_at(B::at(r0 * s.n2 * e, {{reg, 1}})), {.rows = 1, .row_bytes = rl * s.n2 * e}, qe, sE2);
          ops.push_back(B::vmem(B::at(buf), in.dtype, s.n2));
          break;
        case EwLayout::row:
          b.dma(B::vmem_at(B::at(buf)), B::hbm_at(B::at(0, {{reg, 1}})), {.row_bytes = s.n2 * e}, qe, sE2);
          ops.push_back(B::vmem(B::at(buf), in.dtype, 0));
          break;
        case EwLayout::col:
          b.dma(B::vmem_at(B::at(buf)), B::hbm_at(B::at(r0 * e, {{reg, 1}})), {.row_bytes = rl * e}, qe, sE2);
          ops.push_back(B::vmem(B::at(buf), in.dtype, 1, 0));
          break;
        case EwLayout::scalar:
          b.dma(B::vmem_at(B::at(buf)), B::hbm_at(B::at(0, {{reg, 1}})), {.row_bytes = e}, qe, sE2);
          ops.push_back(B::vmem(B::at(buf), in.dtype, 0, 0));
          break;
      }
      ++loads;
    }
    if (loads) b.wait(sE2, loads);
    b.wait(sOut);
    emit_vec_expr(b, s.epi2, ops, B::vmem(B::at(v.out[par]), s.out_dtype, s.n2), v.a2, rl, s.n2);
    b.dma(B::hbm_at(B::at(r0 * s.n2 * eso, {{int16_t(out_reg), 1}})), B::vmem_at(B::at(v.out[par])),
          {.rows = 1, .row_bytes = rl * s.n2 * eso}, qx, sOut);
  }
  b.wait(sOut, 2);
  b.fence();
  return b.finish();
}

}  // namespace tpu::codegen
