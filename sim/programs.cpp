#include "sim/programs.h"

#include <algorithm>

#include <fmt/format.h>

#include "sim/builder.h"
#include "sim/error.h"

namespace tpu::sim {
namespace {

using B = ProgramBuilder;

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

int elem_size(MxuMode m) { return m == MxuMode::bf16 ? 2 : m == MxuMode::f32 ? 4 : 1; }
DType in_dtype(MxuMode m) { return m == MxuMode::bf16 ? DType::bf16 : m == MxuMode::f32 ? DType::f32 : DType::i8; }

}  // namespace

GemmProgram make_gemm(const ChipConfig& cfg, const GemmSpec& s, uint64_t a_addr) {
  const int64_t R = cfg.mxu.rows, C = cfg.mxu.cols;
  if (s.m < 1 || s.n < 1 || s.k < 1) throw SimError("make_gemm: m, n, k must be >= 1");
  if (s.k % R != 0 || s.n % C != 0)
    throw SimError(fmt::format("make_gemm: k={} must be a multiple of mxu.rows={} and n={} of mxu.cols={}", s.k, R,
                               s.n, C));
  const int64_t es = elem_size(s.mode);
  const DType dt = in_dtype(s.mode);
  const DType out_dt = s.mode == MxuMode::i8 ? DType::i32 : DType::f32;
  int nm = cfg.mxu.count;
  while (nm > 1 && s.n % (nm * C) != 0) --nm;
  const int64_t PW = nm * C;
  const int64_t NP = s.n / PW, KT = s.k / R;
  const uint64_t b_bytes = uint64_t(s.k * PW * es);
  auto vmem_need = [&](int64_t bm) { return 2 * align_up(uint64_t(bm * s.k * es), 64) + 2 * align_up(b_bytes, 64) + 2 * uint64_t(bm * PW * 4); };
  int64_t bm = s.block_m > 0 ? s.block_m : std::min<int64_t>(s.m, 512);
  if (s.m % bm != 0 && s.block_m > 0) throw SimError("make_gemm: block_m must divide m");
  while (bm > 1 && (s.m % bm != 0 || vmem_need(bm) > cfg.memory.vmem_bytes)) --bm;
  if (vmem_need(bm) > cfg.memory.vmem_bytes)
    throw SimError(fmt::format("make_gemm: a {}x{} B panel does not fit in VMEM ({} bytes)", s.k, PW, cfg.memory.vmem_bytes));
  const int64_t MB = s.m / bm;

  GemmProgram g;
  g.block_m = bm;
  g.panel_n = PW;
  g.a_addr = a_addr;
  g.b_addr = align_up(a_addr + uint64_t(s.m * s.k * es), 4096);
  g.c_addr = align_up(g.b_addr + uint64_t(s.k * s.n * es), 4096);
  g.hbm_bytes = g.c_addr + uint64_t(s.m * s.n * 4);
  if (g.hbm_bytes > cfg.memory.hbm_bytes)
    throw SimError(fmt::format("make_gemm: operands need {} bytes of HBM, the chip has {}", g.hbm_bytes, cfg.memory.hbm_bytes));
  const uint64_t a_buf = align_up(uint64_t(bm * s.k * es), 64);
  const uint64_t b_base = 2 * a_buf, b_buf = align_up(b_bytes, 64);
  const uint64_t c_base = b_base + 2 * b_buf, c_buf = uint64_t(bm * PW * 4);
  g.vmem_bytes = c_base + 2 * c_buf;

  const int qa = 0, qb = 1 % cfg.dma.engines, qc = 2 % cfg.dma.engines;
  const int semA = 0, semB = 1, semC = 2;
  // registers: r0 block, r1 panel, r2 k tile, r3 panel counter, r4 its parity, r5 next panel,
  // r6 next parity, r7 A buffer, r8 next A buffer
  B b(fmt::format("gemm_{}x{}x{}_{}", s.m, s.n, s.k, mxu_mode_name(s.mode)));
  b.sset(3, 0);
  b.sset(4, 0);
  b.signal(semC, 2);  // both C buffers start free
  b.dma(B::vmem_at(B::at(0)), B::hbm_at(B::at(int64_t(g.a_addr))), {.rows = bm, .row_bytes = s.k * es}, qa, semA);
  b.dma(B::vmem_at(B::at(int64_t(b_base))), B::hbm_at(B::at(int64_t(g.b_addr))),
        {.rows = s.k, .row_bytes = PW * es, .src_row_stride = s.n * es}, qb, semB);

  auto panel = [&](bool prefetch_b) {
    b.wait(semB);
    if (prefetch_b) {
      b.sadd(5, 1, 1);
      b.smod(5, 5, NP);
      b.sadd(6, 3, 1);
      b.smod(6, 6, 2);
      b.dma(B::vmem_at(B::at(int64_t(b_base), {{6, int64_t(b_buf)}})),
            B::hbm_at(B::at(int64_t(g.b_addr), {{5, PW * es}})),
            {.rows = s.k, .row_bytes = PW * es, .src_row_stride = s.n * es}, qb, semB);
    }
    b.wait(semC);
    auto step = [&](int64_t k_off, bool acc, bool in_loop) {
      for (int j = 0; j < nm; ++j) {
        Addr w = B::at(int64_t(b_base) + k_off * R * PW * es + j * C * es, {{4, int64_t(b_buf)}});
        Addr lhs = B::at(k_off * R * es, {{7, int64_t(a_buf)}});
        if (in_loop) {
          w.terms[1] = {2, R * PW * es};
          lhs.terms[1] = {2, R * es};
        }
        b.mxu_load_weights(j, B::vmem(w, dt, PW), R, C, s.mode);
        b.mxu_matmul(j, B::vmem(B::at(int64_t(c_base) + j * C * 4, {{4, int64_t(c_buf)}}), out_dt, PW),
                     B::vmem(lhs, dt, s.k), bm, R, C, acc, s.mode);
      }
    };
    step(0, false, false);
    if (KT > 1) {
      b.loop(2, KT - 1);
      step(1, true, true);
      b.end_loop();
    }
    b.dma(B::hbm_at(B::at(int64_t(g.c_addr), {{0, bm * s.n * 4}, {1, PW * 4}})),
          B::vmem_at(B::at(int64_t(c_base), {{4, int64_t(c_buf)}})),
          {.rows = bm, .row_bytes = PW * 4, .dst_row_stride = s.n * 4}, qc, semC);
    b.sadd(3, 3, 1);
    b.smod(4, 3, 2);
  };
  auto block = [&](bool last) {
    b.smod(7, 0, 2);
    b.wait(semA);
    if (!last) {
      b.sadd(8, 0, 1);
      b.smod(8, 8, 2);
      b.dma(B::vmem_at(B::at(0, {{8, int64_t(a_buf)}})),
            B::hbm_at(B::at(int64_t(g.a_addr) + bm * s.k * es, {{0, bm * s.k * es}})),
            {.rows = bm, .row_bytes = s.k * es}, qa, semA);
      b.loop(1, NP);
      panel(true);
      b.end_loop();
    } else {
      if (NP > 1) {
        b.loop(1, NP - 1);
        panel(true);
        b.end_loop();
      }
      b.sset(1, NP - 1);
      panel(false);
    }
  };
  if (MB > 1) {
    b.loop(0, MB - 1);
    block(false);
    b.end_loop();
  }
  b.sset(0, MB - 1);
  block(true);
  b.fence();
  g.program = b.finish();
  return g;
}

CopyProgram make_stream_copy(const ChipConfig& cfg, uint64_t bytes, uint64_t chunk, int buffers, uint64_t src,
                             uint64_t dst) {
  if (chunk == 0 || bytes == 0 || bytes % chunk != 0) throw SimError("make_stream_copy: bytes must be a positive multiple of chunk");
  if (buffers < 2) throw SimError("make_stream_copy: needs at least 2 buffers");
  if (uint64_t(buffers) * chunk > cfg.memory.vmem_bytes) throw SimError("make_stream_copy: buffers do not fit in VMEM");
  CopyProgram c;
  c.src = src;
  c.dst = dst ? dst : align_up(src + bytes, 4096);
  if (c.dst + bytes > cfg.memory.hbm_bytes || src + bytes > cfg.memory.hbm_bytes)
    throw SimError("make_stream_copy: source or destination is outside HBM");
  const int64_t n = int64_t(bytes / chunk), nb = buffers, ch = int64_t(chunk);
  const int qin = 0, qout = 1 % cfg.dma.engines, semIn = 0, semOut = 1;
  B b(fmt::format("stream_copy_{}", bytes));
  b.signal(semOut, 1);
  for (int64_t i = 0; i < std::min<int64_t>(nb - 1, n); ++i)
    b.dma(B::vmem_at(B::at(i * ch)), B::hbm_at(B::at(int64_t(src) + i * ch)), {.row_bytes = ch}, qin, semIn);
  // r5 = chunk index, r1 = its buffer, r2 = chunk to prefetch, r6 = its buffer
  auto body = [&](bool load) {
    b.smod(1, 5, nb);
    b.wait(semIn);
    b.dma(B::hbm_at(B::at(int64_t(c.dst), {{5, ch}})), B::vmem_at(B::at(0, {{1, ch}})), {.row_bytes = ch}, qout, semOut);
    if (load) {
      b.wait(semOut);
      b.sadd(2, 5, nb - 1);
      b.smod(6, 2, nb);
      b.dma(B::vmem_at(B::at(0, {{6, ch}})), B::hbm_at(B::at(int64_t(src), {{2, ch}})), {.row_bytes = ch}, qin, semIn);
    }
  };
  const int64_t nload = std::max<int64_t>(0, n - (nb - 1));
  if (nload > 0) {
    b.loop(0, nload);
    b.sadd(5, 0, 0);
    body(true);
    b.end_loop();
  }
  if (n - nload > 0) {
    b.loop(4, n - nload);
    b.sadd(5, 4, nload);
    body(false);
    b.end_loop();
  }
  b.fence();
  c.program = b.finish();
  return c;
}

}  // namespace tpu::sim
