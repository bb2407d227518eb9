#include "sim/programs.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "sim/builder.h"
#include "sim/error.h"

namespace tpu::sim {
namespace {

using B = ProgramBuilder;

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

int elem_size(MxuMode m) { return m == MxuMode::bf16 ? 2 : m == MxuMode::f32 ? 4 : 1; }
DType in_dtype(MxuMode m) {
  return m == MxuMode::bf16 ? DType::bf16 : m == MxuMode::f32 ? DType::f32 : m == MxuMode::fp8 ? DType::f8e4m3 : DType::i8;
}

}  // namespace

GemmProgram make_gemm(const ChipConfig& cfg, const GemmSpec& s, uint64_t a_addr) {
  const int64_t R = cfg.mxu.rows, C = cfg.mxu.cols;
  if (s.m < 1 || s.n < 1 || s.k < 1) throw SimError("make_gemm: m, n, k must be >= 1");
  if (s.k % R != 0 || s.n % C != 0)
    throw SimError(fmt::format("make_gemm: k={} must be a multiple of mxu.rows={} and n={} of mxu.cols={}", s.k, R,
                               s.n, C));
  if (s.block_m < 0 || s.block_m > s.m) throw SimError("make_gemm: block_m must be in [0, m]");
  const int64_t es = elem_size(s.mode);
  const DType dt = in_dtype(s.mode);
  const DType out_dt = s.mode == MxuMode::i8 ? DType::i32 : DType::f32;
  const double per_row = s.mode == MxuMode::bf16  ? cfg.mxu.bf16_cycles_per_row
                         : s.mode == MxuMode::f32 ? cfg.mxu.f32_cycles_per_row
                         : s.mode == MxuMode::fp8 ? cfg.mxu.fp8_cycles_per_row
                                                  : cfg.mxu.int8_cycles_per_row;
  // MXU layout: nmc column tiles side by side; when N has fewer column tiles than MXUs, the
  // remaining factor g splits each block's rows, so every MXU works on narrow outputs too.
  int nmc = cfg.mxu.count;
  while (nmc > 1 && ((s.n / C) % nmc != 0 || cfg.mxu.count % nmc != 0)) --nmc;
  const int64_t g = cfg.mxu.count / nmc;
  const int64_t PW = nmc * C, NP = s.n / PW, KT = s.k / R;
  // Rows per block: each MXU streams enough rows per weight tile to hide the next tile's load.
  const int64_t rows_per_mxu = int64_t(std::ceil(2.0 * double(R) * cfg.mxu.weight_load_cycles_per_row / per_row));
  int64_t bm = s.block_m > 0 ? s.block_m : std::min<int64_t>(s.m, g * rows_per_mxu);
  const uint64_t b_buf = align_up(uint64_t(s.k * PW * es), 64);
  const int nbb = int(std::min<int64_t>(NP, 2));  // B panel buffers (the next panel loads during this one)
  auto c_buf_of = [&](int64_t rows) { return align_up(uint64_t(rows * PW * 4), 64); };
  const uint64_t a_all = align_up(uint64_t(s.m * s.k * es), 64);
  // A stays resident (read from HBM once) when it fits with the B and C buffers; otherwise it
  // streams through 3 block buffers, once per panel.
  auto need = [&](int64_t rows, bool resident) {
    const uint64_t a = resident ? a_all : 3 * align_up(uint64_t(rows * s.k * es), 64);
    return a + uint64_t(nbb) * b_buf + 3 * c_buf_of(rows);
  };
  bool resident = NP == 1 || need(bm, true) <= cfg.memory.vmem_bytes;
  if (!resident)
    while (bm > 1 && need(bm, false) > cfg.memory.vmem_bytes) bm = (bm + 1) / 2;
  if (need(bm, resident) > cfg.memory.vmem_bytes)
    throw SimError(fmt::format("make_gemm: a {}x{} B panel does not fit in VMEM ({} bytes)", s.k, PW, cfg.memory.vmem_bytes));
  if (NP == 1) resident = false;  // one pass over A: nothing to keep
  const int64_t MB = (s.m + bm - 1) / bm;
  auto block_rows = [&](int64_t b) { return std::min(bm, s.m - b * bm); };

  GemmProgram gp;
  gp.block_m = bm;
  gp.panel_n = PW;
  gp.a_addr = a_addr;
  gp.b_addr = align_up(a_addr + uint64_t(s.m * s.k * es), 4096);
  gp.c_addr = align_up(gp.b_addr + uint64_t(s.k * s.n * es), 4096);
  gp.hbm_bytes = gp.c_addr + uint64_t(s.m * s.n * 4);
  if (gp.hbm_bytes > cfg.memory.hbm_bytes)
    throw SimError(fmt::format("make_gemm: operands need {} bytes of HBM, the chip has {}", gp.hbm_bytes, cfg.memory.hbm_bytes));
  const uint64_t a_slot = align_up(uint64_t(bm * s.k * es), 64);
  const uint64_t a_size = resident ? a_all : 3 * a_slot;
  const uint64_t b_base = a_size, c_base = b_base + uint64_t(nbb) * b_buf, c_slot = c_buf_of(bm);
  gp.vmem_bytes = c_base + 3 * c_slot;

  const int qa = 0, qb = 1 % cfg.dma.engines, qc = 2 % cfg.dma.engines;
  const int semA = 0, semB = 1, semC = 2;
  B b(fmt::format("gemm_{}x{}x{}_{}", s.m, s.n, s.k, mxu_mode_name(s.mode)));
  // Steps run panel by panel, block by block. A in VMEM: resident at block offset, or slot
  // (step % 3). DMAs of one kind go on one queue in order, so counting semaphores match them.
  const int64_t steps = NP * MB;
  auto a_vmem = [&](int64_t step) {
    const int64_t blk = step % MB;
    return resident ? uint64_t(blk * bm * s.k * es) : uint64_t(step % 3) * a_slot;
  };
  // Loads go in K tiles (one DMA per tile, in K order), so the first multiply of a block or
  // panel waits for its first tile only, not for the whole block or panel.
  auto load_a_tile = [&](int64_t step, int64_t kt) {
    const int64_t blk = step % MB;
    b.dma(B::vmem_at(B::at(int64_t(a_vmem(step)) + kt * R * es)),
          B::hbm_at(B::at(int64_t(gp.a_addr) + blk * bm * s.k * es + kt * R * es)),
          {.rows = block_rows(blk), .row_bytes = R * es, .dst_row_stride = s.k * es, .src_row_stride = s.k * es}, qa,
          semA);
  };
  auto load_a = [&](int64_t step) {
    for (int64_t kt = 0; kt < KT; ++kt) load_a_tile(step, kt);
  };
  auto load_b_tile = [&](int64_t p, int64_t kt) {
    b.dma(B::vmem_at(B::at(int64_t(b_base + uint64_t(p % nbb) * b_buf) + kt * R * PW * es)),
          B::hbm_at(B::at(int64_t(gp.b_addr) + kt * R * s.n * es + p * PW * es)),
          {.rows = R, .row_bytes = PW * es, .src_row_stride = s.n * es}, qb, semB);
  };
  const int64_t a_loads = resident ? MB : steps;  // A DMAs in the whole program
  const int64_t a_ahead = std::min<int64_t>(a_loads, resident ? 2 : 3);
  b.signal(semC, 3);  // the three C buffers start free
  // HBM serves DMAs in program order. The first panel's B and first block's A interleave by K tile, so both arrive progressively.
  for (int64_t kt = 0; kt < KT; ++kt) {
    load_b_tile(0, kt);
    load_a_tile(0, kt);
  }
  for (int64_t i = 1; i < a_ahead; ++i) load_a(i);
  int64_t a_issued = a_ahead;
  for (int64_t p = 0; p < NP; ++p) {
    for (int64_t blk = 0; blk < MB; ++blk) {
      const int64_t step = p * MB + blk, rows = block_rows(blk);
      const bool wait_a = !resident || p == 0, wait_b = blk == 0;  // first use of the loads
      // The next panel's B tiles, spread over this panel's blocks and issued before this
      // step's multiplies (its buffer's reads of panel p-1 are ordered by the scoreboard).
      if (p + 1 < NP)
        for (int64_t kt = blk * KT / MB; kt < (blk + 1) * KT / MB; ++kt) load_b_tile(p + 1, kt);
      b.wait(semC);
      const uint64_t a_off = a_vmem(step), b_off = b_base + uint64_t(p % nbb) * b_buf;
      const uint64_t c_off = c_base + uint64_t(step % 3) * c_slot;
      const int64_t per = (rows + g - 1) / g;
      auto tile = [&](int64_t kt, bool acc, bool in_loop) {
        if (wait_a) b.wait(semA);
        if (wait_b) b.wait(semB);
        for (int j = 0; j < cfg.mxu.count; ++j) {
          const int64_t cj = j % nmc, r0 = (j / nmc) * per, rn = std::min(per, rows - r0);
          if (rn <= 0) continue;
          Addr w = B::at(int64_t(b_off) + kt * R * PW * es + cj * C * es);
          Addr lhs = B::at(int64_t(a_off) + r0 * s.k * es + kt * R * es);
          if (in_loop) {
            w.terms[0] = {2, R * PW * es};
            lhs.terms[0] = {2, R * es};
          }
          b.mxu_load_weights(j, B::vmem(w, dt, PW), R, C, s.mode);
          b.mxu_matmul(j, B::vmem(B::at(int64_t(c_off) + r0 * PW * 4 + cj * C * 4), out_dt, PW), B::vmem(lhs, dt, s.k), rn,
                       R, C, acc, s.mode);
        }
      };
      tile(0, false, false);
      if (KT > 1) {
        b.loop(2, KT - 1);
        tile(1, true, true);
        b.end_loop();
      }
      b.dma(B::hbm_at(B::at(int64_t(gp.c_addr) + blk * bm * s.n * 4 + p * PW * 4)), B::vmem_at(B::at(int64_t(c_off))),
            {.rows = rows, .row_bytes = PW * 4, .dst_row_stride = s.n * 4}, qc, semC);
      // Refill the A slot this step used (its reads are ordered by the scoreboard).
      if (a_issued < a_loads) load_a(a_issued++);
    }
  }
  b.fence();
  gp.program = b.finish();
  return gp;
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
