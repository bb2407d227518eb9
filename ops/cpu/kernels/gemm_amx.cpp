// bf16 GEMM on Intel AMX (TDPBF16PS), for CPUs with amx_bf16 (Sapphire Rapids and later).
//
// A tile multiply takes a 16 x 32 bf16 A tile and a B tile of 16 K-pairs x 16 columns (each
// pair two bf16 along K, the layout vdpbf16ps uses too) and adds the 16 x 16 f32 products to a
// C tile. Register use: C tiles tmm0..3 (a 32 x 32 block of C), A tiles tmm4, tmm5 (two 16-row
// tiles), B tiles tmm6, tmm7 (two 16-column tiles): four multiplies per four tile loads.
//
// Blocking: B is packed once per call into 32-column panels of K-pairs (the AVX-512 packer's
// layout, so a B tile is 16 rows of 64 bytes at a 128-byte stride); each unit of work (a block
// of rows of C) copies its rows of A into a zero-padded buffer of K rounded up to 32 (or reads
// them in place when they need no padding) and runs, per 32-column panel and K block of kKc, the
// panel's K block against every 32-row pair of the unit (the panel block stays in the L1d),
// accumulating into a contiguous strip buffer that is written to C once per panel. When K fits
// one block and the tiles are whole, the products go straight to C, and when a 32-row pair of A
// fits the L1d the order turns around: each row pair stays there while every panel streams past
// it (see rows_outer below). Rows and columns past M and N, and K past K, are zero in the packed
// operands; only the valid part of the strip is written.
//
// The kernel runs only after the OS granted the process the AMX tile state
// (arch_prctl(ARCH_REQ_XCOMP_PERM)); TPU_CPU_AMX=0 turns it off (the AVX-512 vdpbf16ps kernel
// then runs, as on CPUs without AMX).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ops/cpu/kernels/amx_tiles.h"
#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/gemm_grouped.h"
#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "ops/cpu/kernels/scratch.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/parallel.h"

#define TPU_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))

namespace tpu::kernels {

namespace {

constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;
// K per block (multiple of 32). Products with K up to kKc write whole C tiles straight to C;
// longer ones accumulate a strip per panel over the K blocks. Measured on a 2-core Intel Xeon
// (48 KiB L1d, 2 MiB L2) against oneDNN in interleaved runs, one thread, n = 512 / 1024 / 2048:
// kKc 256: 0.73 / 1.03-1.10 / 1.33-1.38x; 512: 0.88-0.90 / 1.00 / 1.31x; 1024: 0.88-0.99 /
// 1.19-1.23 / 1.14-1.22x (and 1.04-1.07x instead of 0.88-0.93x at n = 1024 on two threads).
constexpr int64_t kKc = 1024;
constexpr int64_t kRowBlock = 256;  // rows of C per unit of work (multiple of 32)

bool amx_enabled() {
  static const bool ok = [] {
    if (!cpu_features().amx_bf16 || !cpu_features().avx512bw) return false;
    if (const char* e = std::getenv("TPU_CPU_AMX"); e && std::string(e) == "0") return false;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

using amx::TileConfig;

TPU_AMX void configure_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  amx::load_config(c);
}

// Adds the product of 32 rows of A (at `a`, rows lda_bytes apart) and one 32-column panel
// (its K pairs at `b`, 128 bytes per pair row) over `steps` K steps of 32 to a 32 x 32 f32 block
// at `c` (rows ldc_bytes apart), or writes it there when `first`.
TPU_AMX void block_32x32(const uint16_t* a, int64_t lda_bytes, const uint32_t* b, int64_t steps, float* c,
                         int64_t ldc_bytes, bool first) {
  const int64_t ldc = ldc_bytes / 4;
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, c, ldc_bytes);
    _tile_loadd(1, c + 16, ldc_bytes);
    _tile_loadd(2, c + 16 * ldc, ldc_bytes);
    _tile_loadd(3, c + 16 * ldc + 16, ldc_bytes);
  }
  for (int64_t s = 0; s < steps; ++s) {
    const uint16_t* as = a + s * 32;
    const uint32_t* bs = b + s * 16 * 32;
    _tile_loadd(4, as, lda_bytes);
    _tile_loadd(6, bs, 128);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, bs + 16, 128);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, reinterpret_cast<const char*>(as) + 16 * lda_bytes, lda_bytes);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, ldc_bytes);
  _tile_stored(1, c + 16, ldc_bytes);
  _tile_stored(2, c + 16 * ldc, ldc_bytes);
  _tile_stored(3, c + 16 * ldc + 16, ldc_bytes);
}

// Packs B (K x N) into 32-column panels of K pairs: panel q holds kp / 2 rows of 32 words,
// word c of row p = bf16 (2p, j) low, (2p + 1, j) high for column j = 32q + c; zero past K, N.
void pack_b(int64_t N, int64_t K, int64_t kp, const uint16_t* B, int64_t b_rs, int64_t b_cs, uint32_t* dst,
            bool threaded) {
  const int64_t panels = (N + 31) / 32, pairs = kp / 2;
  const bool rows_contiguous = b_cs == 1;  // (amx_enabled() implies avx512bw for its packer)
  parallel_for(0, panels, threaded ? 4 : panels, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      uint32_t* d = dst + q * pairs * 32;
      const int64_t j0 = q * 32;
      const int cols = static_cast<int>(std::min<int64_t>(32, N - j0));
      if (rows_contiguous) {  // this panel and the next one of the range in one pass
        const int both = q + 1 < q1 ? static_cast<int>(std::min<int64_t>(64, N - j0)) : cols;
        detail::pack_b_panels_bf16_pairs_avx512(B + j0, b_rs, both, K, d, pairs * 32);
        for (int h = 0; h < (both > 32 ? 2 : 1); ++h)
          std::memset(d + h * pairs * 32 + (K + 1) / 2 * 32, 0,
                      sizeof(uint32_t) * static_cast<size_t>((pairs - (K + 1) / 2) * 32));
        if (both > 32) ++q;
        continue;
      }
      if (b_rs == 1) {  // columns contiguous along K (B = W^T of a linear layer): a pair is one word
        detail::pack_b_panel_bf16_pairs_transposed_avx512(B + j0 * b_cs, b_cs, cols, K, d);
        std::memset(d + (K + 1) / 2 * 32, 0, sizeof(uint32_t) * static_cast<size_t>((pairs - (K + 1) / 2) * 32));
        continue;
      }
      for (int64_t p = 0; p < pairs; ++p)
        for (int c = 0; c < 32; ++c) {
          uint32_t lo = 0, hi = 0;
          if (c < cols) {
            const int64_t k = 2 * p, j = j0 + c;
            if (k < K) lo = B[k * b_rs + j * b_cs];
            if (k + 1 < K) hi = B[(k + 1) * b_rs + j * b_cs];
          }
          d[p * 32 + c] = lo | (hi << 16);
        }
    }
  });
}

// ---- Few rows times a weight read in place (gemm_bf16_amx_wt) ----
//
// C = X W^T with W [N, K] K-contiguous (B = W^T, b_rs 1): the weight is the tile multiply's A
// operand, loaded straight from memory (16 weight rows x 32 bf16 per tile, rows b_cs apart), and
// the few rows of X, packed once per call into K pairs x 16 rows, are its B operand. A C tile then
// holds 16 weight rows (outputs j) x 16 rows of X (outputs i), C^T, transposed on its way to C.
// Each weight byte is read from memory once per call and used against up to 64 rows of X (four
// C tiles per weight tile; more rows pass again over the same 16 weight rows, then in the L2), so
// nothing of the weight is copied. Measured on the 2-core Intel Xeon at N 14336, K 4096 (a loaded
// machine): 2 to 16 rows 2-4x faster than the GEMV kernel, 17 to 128 rows 3-5x faster than the
// packing AMX path (which copies all of the weight per call); at 256 rows of a 512 x 512 weight
// the packing path is ahead.

// Packed X: step s (32 values of K), row tile t (16 rows of X): 16 pair rows x 16 words at
// xp + (s * tiles + t) * 256, word c of pair row p = X[16 t + c, 32 s + 2p] low, [.., + 1] high;
// zero past M and K.
void pack_x_pairs(int64_t M, int64_t K, const uint16_t* X, int64_t rs, int64_t cs, int64_t tiles, uint32_t* xp) {
  const int64_t steps = (K + 31) / 32;
  std::memset(xp, 0, sizeof(uint32_t) * static_cast<size_t>(steps * tiles * 256));
  for (int64_t i = 0; i < M; ++i) {
    const uint16_t* x = X + i * rs;
    uint32_t* d = xp + (i / 16) * 256 + (i % 16);
    for (int64_t k = 0; k + 1 < K; k += 2) {
      const uint32_t lo = x[k * cs], hi = x[(k + 1) * cs];
      d[(k / 32) * tiles * 256 + ((k % 32) / 2) * 16] = lo | (hi << 16);
    }
    if (K % 2) d[((K - 1) / 32) * tiles * 256 + (((K - 1) % 32) / 2) * 16] = x[(K - 1) * cs];
  }
}

// Cache lines ahead of the tile loads that each weight row is prefetched, into the L2: weight
// rows a multiple of 4 KiB apart put a step's 16 lines into one L1d set (more lines than its
// ways), where prefetched lines would evict each other. Into the L1d instead was 5-20% slower
// in 6 interleaved pairs of runs at 16 rows, N 14336, K 4096 (one and two threads, loaded machine).
constexpr int64_t kWeightPrefetch = 8;

// Tiles: C 0..NT-1 (row tiles t0..t0+NT-1 of X), the weight tile 4, X tiles 5, 6, 7 (the fourth
// reuses 5). `w`: 16 weight rows, w_bytes apart, `steps` K steps of 32 read in place, then the
// K tail (when `tail`: 16 rows of 32 values, 64 bytes apart, zero past K). Writes the NT C^T
// tiles to out (tile b at out + 256 b, 16 x 16 f32, 64 bytes a row).
// `next`: when not null, the next 16 weight rows the thread reads (w_bytes apart, in place),
// whose first kWeightPrefetch lines are prefetched over the last steps here, so that the
// streams run on from one row block to the next instead of starting cold at each block (gate/up
// product of 16 rows, N 14336, K 4096: 4-7% more weight bytes per second of process CPU time,
// medians of 12 interleaved runs on the loaded 2-core Intel Xeon; the down product, K 7168,
// within 2%).
template <int NT>
TPU_AMX void wt_tiles(const uint16_t* w, int64_t w_bytes, int64_t steps, const uint16_t* tail, const uint32_t* xp,
                      int64_t tiles, int64_t t0, float* out, const char* next) {
  _tile_zero(0);
  if constexpr (NT > 1) _tile_zero(1);
  if constexpr (NT > 2) _tile_zero(2);
  if constexpr (NT > 3) _tile_zero(3);
  const auto step = [&](const void* wt, int64_t stride, int64_t s) {
    const uint32_t* x = xp + (s * tiles + t0) * 256;
    _tile_loadd(4, wt, stride);
    _tile_loadd(5, x, 64);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (NT > 1) {
      _tile_loadd(6, x + 256, 64);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (NT > 2) {
      _tile_loadd(7, x + 512, 64);
      _tile_dpbf16ps(2, 4, 7);
    }
    if constexpr (NT > 3) {
      _tile_loadd(5, x + 768, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
  };
  const char* wb = reinterpret_cast<const char*>(w);
  for (int64_t s = 0; s < steps; ++s) {
    if (s + kWeightPrefetch < steps)
      for (int r = 0; r < 16; ++r) _mm_prefetch(wb + r * w_bytes + (s + kWeightPrefetch) * 64, _MM_HINT_T1);
    else if (next)
      for (int r = 0; r < 16; ++r) _mm_prefetch(next + r * w_bytes + (s + kWeightPrefetch - steps) * 64, _MM_HINT_T1);
    step(wb + s * 64, w_bytes, s);
  }
  if (tail) step(tail, 64, steps);
  _tile_stored(0, out, 64);
  if constexpr (NT > 1) _tile_stored(1, out + 256, 64);
  if constexpr (NT > 2) _tile_stored(2, out + 512, 64);
  if constexpr (NT > 3) _tile_stored(3, out + 768, 64);
}

// Column c of wt_tiles' stored C^T tiles (16 x 16 f32 each, tile c / 16): the 16 weight rows'
// products with row c of the tiles' X rows.
TPU_AMX inline __m512 tile_column(const float* out, int c) {
  const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(16));
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xFFFF, idx, out + (c / 16) * 256 + c % 16, 4);
}

// C^T tiles from wt_tiles to C: rows [i0, i0 + rows_x) of X, weight rows [j0, j0 + rows_w).
TPU_AMX void store_transposed(const float* out, int64_t i0, int rows_x, int64_t j0, int rows_w, float* C, int64_t ldc,
                              bool accumulate) {
  const __mmask16 m = static_cast<__mmask16>((1u << rows_w) - 1);
  for (int c = 0; c < rows_x; ++c) {
    const __m512 v = tile_column(out, c);
    float* d = C + (i0 + c) * ldc + j0;
    _mm512_mask_storeu_ps(d, m, accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, d), v) : v);
  }
}

TPU_INTRIN_DIAGNOSTICS_PUSH
// The same store for the grouped kernel: overwrites C (f32, or bf16 rounded to nearest even with
// NaN kept quiet, as tpu::bf16 rounds), element (i, j) at C + i * ldc + j.
TPU_AMX void store_transposed_set(const float* out, int rows_x, int64_t j0, int rows_w, void* C, int64_t ldc,
                                  bool c_bf16) {
  const __mmask16 m = static_cast<__mmask16>((1u << rows_w) - 1);
  for (int c = 0; c < rows_x; ++c) {
    const __m512 v = tile_column(out, c);
    if (!c_bf16) {
      _mm512_mask_storeu_ps(static_cast<float*>(C) + c * ldc + j0, m, v);
      continue;
    }
    const __m512i u = _mm512_castps_si512(v);
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), one))),
        16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i bits =
        _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
    _mm512_mask_cvtepi32_storeu_epi16(static_cast<uint16_t*>(C) + c * ldc + j0, m, bits);
  }
}
TPU_INTRIN_DIAGNOSTICS_POP

}  // namespace

bool gemm_bf16_amx_wt(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                      const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  if (!amx_enabled() || M <= 0 || N <= 0 || K <= 0 || b_rs != 1) return false;
  const int64_t tiles = (M + 15) / 16, steps = (K + 31) / 32, full = K / 32, blocks = (N + 15) / 16;
  thread_local detail::ScratchBuffer xp_buf;
  uint32_t* xp_t = xp_buf.get_as<uint32_t>(static_cast<size_t>(steps * tiles * 256));
  pack_x_pairs(M, K, A, a_rs, a_cs, tiles, xp_t);
  const uint32_t* xp = xp_t;  // (a thread_local named inside the lambda would be the pool thread's)
  // Weight rows split over the threads (each reads its half of the weight once); one thread below
  // ~2^22 multiply-adds, where the hand-off costs more than it saves.
  const bool threaded = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) >= 4e6;
  parallel_for(0, blocks, threaded ? 1 : blocks, [&](int64_t q0, int64_t q1) {
    thread_local detail::ScratchBuffer pad_buf;  // the last weight rows (N % 16), zero-padded
    thread_local detail::ScratchBuffer tail_buf;  // a row block's K tail (K % 32), zero-padded
    thread_local detail::ScratchBuffer out_buf;   // four C^T tiles
    const int64_t pad_stride = steps * 32 + 32;    // one cache line more than the padded K
    float* out = out_buf.get_as<float>(1024);
    uint16_t* tail = tail_buf.get_as<uint16_t>(16 * 32);
    const amx::SavedTiles saved;  // the thread's configuration is put back at the end
    configure_tiles();
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t j0 = q * 16;
      const int rows_w = static_cast<int>(std::min<int64_t>(16, N - j0));
      const uint16_t* w = B + j0 * b_cs;
      int64_t w_bytes = b_cs * 2, in_place = full;
      const uint16_t* t = nullptr;
      if (rows_w < 16) {  // copy the last rows, K padded with zeros, rows past N zero
        uint16_t* pad = pad_buf.get_as<uint16_t>(static_cast<size_t>(16 * pad_stride));
        std::memset(pad, 0, sizeof(uint16_t) * static_cast<size_t>(16 * pad_stride));
        for (int r = 0; r < rows_w; ++r) std::memcpy(pad + r * pad_stride, w + r * b_cs, sizeof(uint16_t) * static_cast<size_t>(K));
        w = pad;
        w_bytes = pad_stride * 2;
        in_place = steps;
      } else if (full < steps) {  // the K tail of these 16 rows, padded with zeros
        std::memset(tail, 0, sizeof(uint16_t) * 16 * 32);
        for (int r = 0; r < 16; ++r)
          std::memcpy(tail + r * 32, w + r * b_cs + full * 32, sizeof(uint16_t) * static_cast<size_t>(K - full * 32));
        t = tail;
      }
      // The thread's next 16 weight rows (read in place when whole) are prefetched during the
      // last pass over these.
      const bool next_in_place = q + 1 < q1 && N - (j0 + 16) >= 16;
      for (int64_t t0 = 0; t0 < tiles; t0 += 4) {
        const int64_t nt = std::min<int64_t>(4, tiles - t0);
        const char* next =
            next_in_place && t0 + 4 >= tiles ? reinterpret_cast<const char*>(B + (j0 + 16) * b_cs) : nullptr;
        switch (nt) {
          case 1: wt_tiles<1>(w, w_bytes, in_place, t, xp, tiles, t0, out, next); break;
          case 2: wt_tiles<2>(w, w_bytes, in_place, t, xp, tiles, t0, out, next); break;
          case 3: wt_tiles<3>(w, w_bytes, in_place, t, xp, tiles, t0, out, next); break;
          default: wt_tiles<4>(w, w_bytes, in_place, t, xp, tiles, t0, out, next); break;
        }
        store_transposed(out, t0 * 16, static_cast<int>(std::min<int64_t>(64, M - t0 * 16)), j0, rows_w, C, ldc,
                         accumulate);
      }
    }
  });
  return true;
}

bool gemm_bf16_amx_wt_grouped(int64_t N, int64_t K, const WtGroup* groups, int64_t count, int64_t x_rs, int64_t x_cs,
                              int64_t w_rs, int64_t ldc, bool c_bf16) {
  if (!amx_enabled() || N <= 0 || K <= 0) return false;
  const int64_t steps = (K + 31) / 32, full = K / 32, blocks = (N + 15) / 16;
  // The groups with rows, and where each one's packed rows start (in row tiles of 16).
  std::vector<int64_t> live, tile0;
  int64_t tiles_total = 0;
  double madds = 0;
  for (int64_t g = 0; g < count; ++g) {
    if (groups[g].rows > kAmxWeightInPlaceMaxRows) return false;
    if (groups[g].rows <= 0) continue;
    live.push_back(g);
    tile0.push_back(tiles_total);
    tiles_total += (groups[g].rows + 15) / 16;
    madds += static_cast<double>(groups[g].rows) * static_cast<double>(N) * static_cast<double>(K);
  }
  if (live.empty()) return true;
  const auto n_live = static_cast<int64_t>(live.size());
  // One thread below ~2^22 multiply-adds (as gemm_bf16_amx_wt).
  const bool threaded = madds >= 4e6;
  thread_local detail::ScratchBuffer xp_buf;
  // Group i's packed rows: steps x tiles_i x 256 words from xp + tile0[i] * steps * 256.
  uint32_t* xp_t = xp_buf.get_as<uint32_t>(static_cast<size_t>(steps * tiles_total * 256));
  parallel_for(0, n_live, threaded ? 1 : n_live, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const WtGroup& gr = groups[live[static_cast<size_t>(i)]];
      pack_x_pairs(gr.rows, K, gr.x, x_rs, x_cs, (gr.rows + 15) / 16, xp_t + tile0[static_cast<size_t>(i)] * steps * 256);
    }
  });
  const uint32_t* xp = xp_t;  // (a thread_local named inside the lambda would be the pool thread's)
  // Work items: item i is the 16 weight rows of block i % blocks of live group i / blocks, taken
  // in runs of `run` items (a contiguous stretch of one weight, up to ~2 MiB) from a shared counter.
  const int64_t items = n_live * blocks;
  const int64_t team = threaded ? std::max(1, num_threads()) : 1;
  const int64_t run = std::clamp<int64_t>(items / (16 * team), 1, 16);
  std::atomic<int64_t> next_item{0};
  parallel_for(0, team, 1, [&](int64_t, int64_t) {
    thread_local detail::ScratchBuffer pad_buf;   // the last weight rows (N % 16), zero-padded
    thread_local detail::ScratchBuffer tail_buf;  // a row block's K tail (K % 32), zero-padded
    thread_local detail::ScratchBuffer out_buf;   // four C^T tiles
    const int64_t pad_stride = steps * 32 + 32;
    float* out = out_buf.get_as<float>(1024);
    uint16_t* tail = tail_buf.get_as<uint16_t>(16 * 32);
    const amx::SavedTiles saved;
    configure_tiles();
    for (;;) {
      const int64_t r0 = next_item.fetch_add(run, std::memory_order_relaxed);
      if (r0 >= items) break;
      const int64_t r1 = std::min(items, r0 + run);
      for (int64_t item = r0; item < r1; ++item) {
        const int64_t li = item / blocks, q = item % blocks;
        const WtGroup& gr = groups[live[static_cast<size_t>(li)]];
        const int64_t tiles = (gr.rows + 15) / 16;
        const uint32_t* xg = xp + tile0[static_cast<size_t>(li)] * steps * 256;
        const int64_t j0 = q * 16;
        const int rows_w = static_cast<int>(std::min<int64_t>(16, N - j0));
        const uint16_t* w = gr.w + j0 * w_rs;
        int64_t w_bytes = w_rs * 2, in_place = full;
        const uint16_t* t = nullptr;
        if (rows_w < 16) {
          uint16_t* pad = pad_buf.get_as<uint16_t>(static_cast<size_t>(16 * pad_stride));
          std::memset(pad, 0, sizeof(uint16_t) * static_cast<size_t>(16 * pad_stride));
          for (int r = 0; r < rows_w; ++r)
            std::memcpy(pad + r * pad_stride, w + r * w_rs, sizeof(uint16_t) * static_cast<size_t>(K));
          w = pad;
          w_bytes = pad_stride * 2;
          in_place = steps;
        } else if (full < steps) {
          std::memset(tail, 0, sizeof(uint16_t) * 16 * 32);
          for (int r = 0; r < 16; ++r)
            std::memcpy(tail + r * 32, w + r * w_rs + full * 32, sizeof(uint16_t) * static_cast<size_t>(K - full * 32));
          t = tail;
        }
        // The next item of the run (in this weight or the next group's), prefetched over the
        // last steps here when its 16 rows are read in place.
        const char* next_w = nullptr;
        if (item + 1 < r1) {
          const int64_t nli = (item + 1) / blocks, nj0 = ((item + 1) % blocks) * 16;
          if (N - nj0 >= 16) next_w = reinterpret_cast<const char*>(groups[live[static_cast<size_t>(nli)]].w + nj0 * w_rs);
        }
        for (int64_t t0 = 0; t0 < tiles; t0 += 4) {
          const int64_t nt = std::min<int64_t>(4, tiles - t0);
          const char* next = t0 + 4 >= tiles ? next_w : nullptr;
          switch (nt) {
            case 1: wt_tiles<1>(w, w_bytes, in_place, t, xg, tiles, t0, out, next); break;
            case 2: wt_tiles<2>(w, w_bytes, in_place, t, xg, tiles, t0, out, next); break;
            case 3: wt_tiles<3>(w, w_bytes, in_place, t, xg, tiles, t0, out, next); break;
            default: wt_tiles<4>(w, w_bytes, in_place, t, xg, tiles, t0, out, next); break;
          }
          const int64_t es = c_bf16 ? 2 : 4;
          store_transposed_set(out, static_cast<int>(std::min<int64_t>(64, gr.rows - t0 * 16)), j0, rows_w,
                               static_cast<char*>(gr.c) + t0 * 16 * ldc * es, ldc, c_bf16);
        }
      }
    }
  });
  return true;
}

bool gemm_bf16_amx_available() { return amx_enabled(); }

bool gemm_bf16_amx(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                   const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  if (!amx_enabled() || M <= 0 || N <= 0 || K <= 0) return false;
  const int64_t kp = (K + 31) / 32 * 32;
  // Packed B, kept per calling thread between calls (no page faults or zeroing per call).
  thread_local detail::ScratchBuffer bp;  // on 64-byte boundaries: tile rows must not straddle cache lines
  uint32_t* packed = bp.get_as<uint32_t>(static_cast<size_t>((N + 31) / 32 * (kp / 2) * 32));
  // Below ~2^28 multiply-adds (n = 512 cubed: ~0.3 ms on one core) a second thread's wake-up
  // and join cost more than its share of the work.
  const bool threaded = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) >= 2.6e8;
  pack_b(N, K, kp, B, b_rs, b_cs, packed, threaded);
  const uint32_t* packed_b = packed;  // (a thread_local named inside the lambda would be the pool thread's)
  // Units of work: blocks of rows, smaller when there are fewer blocks than threads.
  int64_t rb = kRowBlock;
  while (threaded && rb > 32 && (M + rb - 1) / rb < num_threads()) rb /= 2;
  const int64_t units = (M + rb - 1) / rb, panels = (N + 31) / 32;
  // A's tiles load straight from A when its rows need no padding (K a multiple of 32), start on
  // cache lines, and sit far enough apart in the L1d sets (rows a multiple of 2 KiB apart put
  // 8 or all 16 rows of a tile into one set: there the copy at a padded stride pays); the copy
  // was ~7% of a 512 x 512 x 512 product on one core.
  const bool a_in_place = a_cs == 1 && K % 32 == 0 && (a_rs * 2) % 64 == 0 && (a_rs * 2) % 2048 != 0 &&
                          reinterpret_cast<uintptr_t>(A) % 64 == 0;
  // Order of the direct path (one K block): a 32-row pair of A (32 x kp bf16) that fits in two
  // thirds of the L1d stays there while every panel of B streams past it from the L2, when all
  // of packed B fits in half of the L2: the B panels' tile rows are contiguous (2 KiB per tile),
  // which the prefetchers follow better than the 16 strided rows of an A tile. Otherwise each
  // panel stays in the L1d (or the L2) while the row pairs stream. Measured on the Intel Xeon
  // (48 KiB L1d, 2 MiB L2), the kernel alone at n = 512: 1470 against 1300 GFLOP/s; at
  // n = 1024 (A's row pair no longer fits) the panel-outer order stays ahead, 1115 against 1050.
  const CpuCaches& caches = cpu_caches();
  const int64_t l1d = caches.l1d > 0 ? caches.l1d : int64_t{32} << 10, l2 = caches.l2 > 0 ? caches.l2 : int64_t{1} << 20;
  const bool rows_outer = 3 * (32 * kp * 2) <= 2 * l1d && panels * 32 * kp * 2 <= l2 / 2;
  parallel_for(0, units, threaded ? 1 : units, [&](int64_t u0, int64_t u1) {
    // This unit's rows of A, K padded to kp with zeros; rows lda apart, one cache line more than
    // kp so that a tile's 16 rows do not fall into one L1d set when kp * 2 is a multiple of 4 KiB.
    const int64_t lda = kp + 32;
    thread_local detail::ScratchBuffer ab_buf;
    thread_local detail::ScratchBuffer acc_buf;  // a 32-column strip of the unit's rows of C
    uint16_t* ab = ab_buf.get_as<uint16_t>(static_cast<size_t>(rb * lda));
    float* acc = acc_buf.get_as<float>(static_cast<size_t>(rb * 32));
    const amx::SavedTiles saved;  // the thread's configuration is put back at the end
    configure_tiles();
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t i0 = u * rb, rows = std::min(rb, M - i0), row_pairs = (rows + 31) / 32;
      const bool direct = a_in_place && rows == row_pairs * 32;
      const uint16_t* at = direct ? A + i0 * a_rs : ab;  // the unit's rows of A, lda_u apart
      const int64_t lda_u = direct ? a_rs : lda;
      for (int64_t r = 0; !direct && r < row_pairs * 32; ++r) {
        uint16_t* d = ab + r * lda;
        if (r >= rows) {
          std::memset(d, 0, sizeof(uint16_t) * static_cast<size_t>(kp));
          continue;
        }
        const uint16_t* src = A + (i0 + r) * a_rs;
        if (a_cs == 1) std::memcpy(d, src, sizeof(uint16_t) * static_cast<size_t>(K));
        else
          for (int64_t k = 0; k < K; ++k) d[k] = src[k * a_cs];
        std::memset(d + K, 0, sizeof(uint16_t) * static_cast<size_t>(kp - K));
      }
      // Per panel: the unit's 32-column strip of C accumulates in `acc` (rows 128 bytes apart:
      // C rows a multiple of 4 KiB apart would share one L1d set) over the K blocks, each K block
      // of the panel (kKc / 2 x 128 bytes) reused from the L1d across the unit's row pairs; then
      // it is written to C once.
      // One K block and whole tiles: C directly, for the panels of 32 columns.
      const int64_t direct_panels = kp <= kKc && rows == row_pairs * 32 ? N / 32 : 0;
      const auto tile_pair = [&](int64_t rp, int64_t q) {
        block_32x32(at + rp * 32 * lda_u, lda_u * 2, packed_b + q * (kp / 2) * 32, kp / 32,
                    C + (i0 + rp * 32) * ldc + q * 32, ldc * 4, !accumulate);
      };
      if (rows_outer) {  // a row pair's A stays in the L1d; the panels stream from the L2
        for (int64_t rp = 0; rp < row_pairs; ++rp)
          for (int64_t q = 0; q < direct_panels; ++q) tile_pair(rp, q);
      } else {  // a panel stays in the L1d (or the L2); the row pairs stream
        for (int64_t q = 0; q < direct_panels; ++q)
          for (int64_t rp = 0; rp < row_pairs; ++rp) tile_pair(rp, q);
      }
      for (int64_t q = direct_panels; q < panels; ++q) {
        const int cols = static_cast<int>(std::min<int64_t>(32, N - q * 32));
        for (int64_t k0 = 0; k0 < kp; k0 += kKc) {
          const int64_t steps = std::min(kKc, kp - k0) / 32;
          const uint32_t* panel = packed_b + q * (kp / 2) * 32 + (k0 / 2) * 32;
          for (int64_t rp = 0; rp < row_pairs; ++rp)
            block_32x32(at + rp * 32 * lda_u + k0, lda_u * 2, panel, steps, acc + rp * 32 * 32, 128, k0 == 0);
        }
        for (int64_t r = 0; r < rows; ++r) {
          float* c = C + (i0 + r) * ldc + q * 32;
          const float* v = acc + r * 32;
          if (accumulate)
            for (int j = 0; j < cols; ++j) c[j] += v[j];
          else
            std::memcpy(c, v, sizeof(float) * static_cast<size_t>(cols));
        }
      }
    }
  });
  return true;
}

}  // namespace tpu::kernels
