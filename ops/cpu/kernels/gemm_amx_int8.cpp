// Products with int8 and int4 weights on Intel AMX int8 tiles (TDPBSSD): C = q(A) x Wd^T for
// kGemmInt8AmxMinRows rows on (gemm.h, gemm_int8_amx / gemm_int4_amx), with the semantics of the
// vnni path (gemm_vnni.cpp): A quantized per row in blocks of 32 along K (d = max |a| / 127,
// q = round(a * 127 / max |a|) to nearest even), each block's sum of q w exact in int32, then
// accumulated in f32 times d and the weight's scale (int8: the channel scale, once at the end;
// int4: the group scale of the block).
//
// The weights are the A operand of the tile product and the activations the B operand, so that
// int8 weights are read in place: a weight tile is 16 weight rows (output columns) x the 32
// bytes of one block, loaded with the row stride K. The quantized activations are packed once
// per call into B tiles of 8 rows x 64 bytes per 16 activation rows and block (row kq, word m =
// the 4 values 4kq..4kq+3 of activation row m, the VNNI-4 layout), next to the 16 rows' block
// scales d. One TDPBSSD per block gives a 16 x 16 int32 tile C[n][m] (output column n,
// activation row m); it is stored and added in f32 to 16 vector accumulators (one per output
// column, lanes over the activation rows) times the block's d vector (int4: d times the
// column's group scale). After the last block the accumulators are transposed into the 16 x 16
// tile of C. Four blocks are in flight at a time (C tiles tmm0..3): their products are issued
// and stored before the sums of the previous four blocks are read back and scaled.
//
// int4 weights (gemv_int4.h) are unpacked to int8 (q = nibble - 8) per panel of 16 output
// columns into a per-thread buffer, as is the last, partial panel of int8 weights (rows past N
// zero), and their group scales are expanded to one per block and column; every group of 16
// activation rows then reuses the panel. While a panel's tiles run, the next panel's weights
// (int4: packed) are prefetched into the L2: read 32 bytes per row at a time, 16 rows apart,
// they escape the hardware prefetchers. The thread's tile configuration is saved and put back
// around the kernel.
//
// The kernel runs only when the CPU has amx_int8 and the OS granted the tile state
// (gemm_bf16_amx_available(): TPU_CPU_AMX=0 turns both off; the vnni and AVX2 paths then run).
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "ops/cpu/kernels/amx_tiles.h"
#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "ops/cpu/kernels/scratch.h"
#include "tpucore/core/batch_invariant.h"
#include "tpucore/core/parallel.h"

#define TPU_AMX_INT8 __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,fma")))

TPU_INTRIN_DIAGNOSTICS_PUSH

namespace tpu::kernels {
namespace {

constexpr int kBlock = 32;
constexpr int kTileBytes = 512;  // one packed B tile: 8 rows of 64 bytes
constexpr int64_t kL1Rounds = 3;  // int8: rounds of four blocks between an L1d prefetch and its use

bool cpu_has_amx_int8() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d >> 25) & 1u;  // CPUID.(EAX=7, ECX=0):EDX[25] AMX-INT8
}

bool amx_int8_ok() {
  static const bool ok = cpu_has_amx_int8() && gemm_bf16_amx_available();
  return ok;
}

using amx::TileConfig;

// tmm0..3: C (16 x 16 int32); tmm4, tmm5: weights (16 rows x 32 bytes); tmm6, tmm7:
// activations (8 rows x 64 bytes).
TPU_AMX_INT8 void configure_tiles() {
  TileConfig c;
  for (int t = 0; t < 4; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  for (int t = 4; t < 6; ++t) c.rows[t] = 16, c.colsb[t] = 32;
  for (int t = 6; t < 8; ++t) c.rows[t] = 8, c.colsb[t] = 64;
  amx::load_config(c);
}

using amx::SavedTiles;

// Quantized activations: for group g of 16 rows and block b, the B tile at q + (g * nb + b) *
// kTileBytes, the block scales at d + (g * nb + b) * 16 (0 for rows past M), and for int4 no more.
struct Packed {
  int64_t nb = 0, groups = 0;
  int8_t* q = nullptr;
  float* d = nullptr;
};

TPU_AMX_INT8 void quantize_rows(int64_t r0, int64_t r1, const float* A, int64_t lda, const Packed& p) {
  for (int64_t i = r0; i < r1; ++i) {
    const float* a = A + i * lda;
    const int64_t g = i / 16, m = i % 16;
    for (int64_t b = 0; b < p.nb; ++b) {
      const __m512 x0 = _mm512_loadu_ps(a + b * kBlock), x1 = _mm512_loadu_ps(a + b * kBlock + 16);
      float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
      // NaN in the block: its scale NaN, so that the outputs it touches are NaN.
      if (_mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q)) amax = __builtin_nanf("");
      p.d[(g * p.nb + b) * 16 + m] = amax / 127.0f;
      const float id = amax > 0 && amax <= 3.4e38f ? 127.0f / amax : 0.0f;
      const __m512 vid = _mm512_set1_ps(id);
      const __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)));
      const __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x1, vid)));
      const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
      // Word kq of the row's block goes to row kq of the tile, word m.
      const __m256i idx = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);
      _mm256_i32scatter_epi32(reinterpret_cast<int32_t*>(p.q + (g * p.nb + b) * kTileBytes) + m, idx, q, 4);
    }
  }
}

// Unpacks 16 rows of packed int4 weights (rows n0.. of W, `rows` of them, the others zero) into
// int8 rows of K bytes at dst (q = nibble - 8, weight order kept: a block's low nibbles are its
// weights 0-15, the high nibbles 16-31).
// 64 packed bytes (4 blocks) unpacked: o0 holds the first 64 weights (blocks 0, 1), o1 the next.
TPU_AMX_INT8 __attribute__((always_inline)) inline void unpack64(__m512i raw, __m512i& o0, __m512i& o1) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  const __m512i idx0 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), idx1 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  const __m512i lo = _mm512_sub_epi8(_mm512_and_si512(raw, low4), eight);
  const __m512i hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(raw, 4), low4), eight);
  o0 = _mm512_permutex2var_epi64(lo, idx0, hi);
  o1 = _mm512_permutex2var_epi64(lo, idx1, hi);
}

TPU_AMX_INT8 void unpack_int4_panel(const uint8_t* W, int64_t K, int64_t n0, int rows, int8_t* dst) {
  const int64_t rb = K / 2;  // packed bytes per row
  for (int r = 0; r < 16; ++r) {
    int8_t* out = dst + r * K;
    if (r >= rows) {
      std::memset(out, 0, static_cast<size_t>(K));
      continue;
    }
    const uint8_t* src = W + (n0 + r) * rb;
    int64_t c = 0;
    for (; c + 64 <= rb; c += 64) {  // 64 packed bytes: 4 blocks
      __m512i o0, o1;
      unpack64(_mm512_loadu_si512(src + c), o0, o1);
      _mm512_storeu_si512(out + 2 * c, o0);
      _mm512_storeu_si512(out + 2 * c + 64, o1);
    }
    if (c < rb) {  // the last 16, 32 or 48 packed bytes
      const int64_t n = rb - c;
      __m512i o0, o1;
      unpack64(_mm512_maskz_loadu_epi8((__mmask64{1} << n) - 1, src + c), o0, o1);
      _mm512_mask_storeu_epi8(out + 2 * c, 2 * n >= 64 ? ~__mmask64{0} : (__mmask64{1} << (2 * n)) - 1, o0);
      if (2 * n > 64) _mm512_mask_storeu_epi8(out + 2 * c + 64, (__mmask64{1} << (2 * n - 64)) - 1, o1);
    }
  }
}

// In-register transpose of 16 vectors of 16 floats.
TPU_AMX_INT8 __attribute__((always_inline)) inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // r[4i + j] now holds, in 128-bit lane L, element j of rows 4i..4i+3 at columns 4L + j.
#pragma GCC unroll 16
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
  }
#pragma GCC unroll 16
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
  }
}

// The group scales of a panel of 16 output columns (rows n0.., `cols` of them, the others 0) as
// one f32 scale per block of 32 (gpb blocks per group): rows of nb = ngroups * gpb at dst, each
// column's contiguous (f16 widened). Per block, so that the tile loop indexes them by the block
// without a division.
TPU_AMX_INT8 void panel_block_scales(Int4Scales scale, int64_t n0, int cols, int64_t ngroups, int64_t gpb, float* dst,
                                     int64_t pf_rows) {
  if (pf_rows > 0) {  // the scales of the rows pf_rows further on (a later panel), contiguous
    const char* next = scale.is_f16() ? reinterpret_cast<const char*>(scale.half() + (n0 + pf_rows) * ngroups)
                                      : reinterpret_cast<const char*>(scale.f32() + (n0 + pf_rows) * ngroups);
    const int64_t bytes = 16 * ngroups * (scale.is_f16() ? 2 : 4);
    for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(next + o, _MM_HINT_T0);
  }
  const int64_t nb = ngroups * gpb;
  for (int c = 0; c < 16; ++c) {
    float* out = dst + c * nb;
    const int64_t off = (n0 + c) * ngroups;
    if (c >= cols) {
      std::memset(out, 0, static_cast<size_t>(nb) * sizeof(float));
    } else if (gpb == 1) {
      for (int64_t g0 = 0; g0 < ngroups; g0 += 16) {
        const int64_t n = std::min<int64_t>(16, ngroups - g0);
        const __mmask16 m = static_cast<__mmask16>(n == 16 ? 0xffffu : (1u << n) - 1);
        const __m512 v = scale.is_f16() ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, scale.half() + off + g0))
                                        : _mm512_maskz_loadu_ps(m, scale.f32() + off + g0);
        _mm512_mask_storeu_ps(out + g0, m, v);
      }
    } else {
      for (int64_t g = 0; g < ngroups; ++g) {
        const float v = scale[off + g];
        for (int64_t b = 0; b < gpb; ++b) out[g * gpb + b] = v;
      }
    }
  }
}

// Adds one block's stored tile (16 x 16 int32, row n = output column n) to the accumulators.
// Int4: times d and the columns' group scales gs (16 floats); int8: times d.
template <bool kInt4>
TPU_AMX_INT8 __attribute__((always_inline)) inline void scale_add(const int32_t* tile, const float* d, const float* gs,
                                                                  int64_t gstride, __m512 (&acc)[16]) {
  const __m512 dv = _mm512_loadu_ps(d);
#pragma GCC unroll 16
  for (int n = 0; n < 16; ++n) {
    const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(tile + 16 * n));
    acc[n] = _mm512_fmadd_ps(s, kInt4 ? _mm512_mul_ps(dv, _mm512_set1_ps(gs[n * gstride])) : dv, acc[n]);
  }
}

// One 16 x 16 tile of C: output columns n0.. (cols of them) of the weight rows at w (row stride
// ldw bytes), activation rows 16g.. (rows of them). Int8: cscale = the columns' channel scales;
// int4: gscale = the panel's scales per block, [16][K / 32].
// pf: the next panel's 16 weight rows (row stride pf_ld bytes; int4: packed) to prefetch into the
// L2, the bytes of four blocks of each row per round of four blocks, or null (the hardware
// prefetchers do not follow 16 rows read a block at a time: without it the weights arrive from L3
// or memory at about two thirds of the rate).
// Unpacks blocks b.. (nblk = 4 of them, or 1) of 16 packed int4 rows (stride ld bytes) into dst,
// row stride 128 bytes.
TPU_AMX_INT8 __attribute__((always_inline)) inline void unpack_round(const uint8_t* wp, int64_t ld, int64_t b, int nblk,
                                                                     int8_t* dst) {
  const __mmask64 m = nblk == 4 ? ~__mmask64{0} : (__mmask64{1} << (16 * nblk)) - 1;
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) {
    __m512i o0, o1;
    unpack64(_mm512_maskz_loadu_epi8(m, wp + r * ld + b * 16), o0, o1);
    _mm512_store_si512(dst + r * 128, o0);
    _mm512_store_si512(dst + r * 128 + 64, o1);
  }
}

// wp (int4 only; w and ldw then unused): the panel's 16 packed weight rows (row stride K / 2), each
// round's four blocks unpacked right before their tiles into a small buffer that stays in the
// L1d (for a panel that serves one group of rows: unpacking the whole panel first would, at
// large K, push it and the activation tiles out of the L1d).
template <bool kInt4>
TPU_AMX_INT8 void tile_16x16(const int8_t* w, int64_t ldw, const Packed& p, int64_t g, const float* cscale,
                             const float* gscale, float* C, int64_t ldc, int rows, int cols,
                             const int8_t* pf, int64_t pf_ld, const uint8_t* wp = nullptr) {
  alignas(64) int32_t buf[8][256];
  alignas(64) int8_t ubuf[2][16 * 128];  // wp: 16 rows of four unpacked blocks, two rounds
  if (kInt4 && wp) ldw = 128;
  __m512 acc[16];
#pragma GCC unroll 16
  for (int n = 0; n < 16; ++n) acc[n] = _mm512_setzero_ps();
  const int8_t* bq = p.q + g * p.nb * kTileBytes;
  const float* bd = p.d + g * p.nb * 16;
  // The first nb % 4 blocks one at a time, then 4 at a time: the products of blocks b..b+3 are
  // issued and stored before the sums of blocks b-4..b-1 (stored one round earlier) are read.
  const int64_t head = p.nb % 4;
  for (int64_t b = 0; b < head; ++b) {
    if (kInt4 && wp) unpack_round(wp, p.nb * 16, b, 1, ubuf[0]);
    _tile_zero(0);
    _tile_loadd(4, kInt4 && wp ? ubuf[0] : w + b * kBlock, ldw);
    _tile_loadd(6, bq + b * kTileBytes, 64);
    _tile_dpbssd(0, 4, 6);
    _tile_stored(0, buf[0], 64);
    scale_add<kInt4>(buf[0], bd + b * 16, gscale + (kInt4 ? b : 0), p.nb, acc);
  }
  int par = 0;
  for (int64_t b = head; b < p.nb; b += 4, par ^= 1) {
    const int8_t* wb = w + b * kBlock;
    if (kInt4 && wp) {
      unpack_round(wp, p.nb * 16, b, 4, ubuf[par]);
      wb = ubuf[par];
    }
    const int8_t* xb = bq + b * kTileBytes;
    if (pf) {
      if (kInt4) {  // packed: 64 bytes of each row per round
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r) _mm_prefetch(reinterpret_cast<const char*>(pf + r * pf_ld + b * (kBlock / 2)), _MM_HINT_T1);
      } else {
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(pf + r * pf_ld + b * kBlock), _MM_HINT_T1);
          _mm_prefetch(reinterpret_cast<const char*>(pf + r * pf_ld + b * kBlock + 64), _MM_HINT_T1);
        }
      }
    }
    // int8 read in place: this panel's blocks three rounds on, from the L2 into the L1d, so
    // that the tile loads do not wait on the L2 (about 5% faster streaming from memory).
    if (!kInt4 && b + 4 * kL1Rounds < p.nb) {
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(wb + r * ldw + kL1Rounds * 4 * kBlock), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(wb + r * ldw + kL1Rounds * 4 * kBlock + 64), _MM_HINT_T0);
      }
    }
    _tile_zero(0);
    _tile_loadd(4, wb, ldw);
    _tile_loadd(6, xb, 64);
    _tile_dpbssd(0, 4, 6);
    _tile_zero(1);
    _tile_loadd(5, wb + kBlock, ldw);
    _tile_loadd(7, xb + kTileBytes, 64);
    _tile_dpbssd(1, 5, 7);
    _tile_zero(2);
    _tile_loadd(4, wb + 2 * kBlock, ldw);
    _tile_loadd(6, xb + 2 * kTileBytes, 64);
    _tile_dpbssd(2, 4, 6);
    _tile_zero(3);
    _tile_loadd(5, wb + 3 * kBlock, ldw);
    _tile_loadd(7, xb + 3 * kTileBytes, 64);
    _tile_dpbssd(3, 5, 7);
    int32_t(*out)[256] = buf + 4 * par;
    _tile_stored(0, out[0], 64);
    _tile_stored(1, out[1], 64);
    _tile_stored(2, out[2], 64);
    _tile_stored(3, out[3], 64);
    if (b > head) {
      const int32_t(*prev)[256] = buf + 4 * (par ^ 1);
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t)
        scale_add<kInt4>(prev[t], bd + (b - 4 + t) * 16, gscale + (kInt4 ? b - 4 + t : 0), p.nb, acc);
    }
  }
  if (p.nb > head) {
    const int32_t(*prev)[256] = buf + 4 * (par ^ 1);
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t)
      scale_add<kInt4>(prev[t], bd + (p.nb - 4 + t) * 16, gscale + (kInt4 ? p.nb - 4 + t : 0), p.nb, acc);
  }
  if (!kInt4)
#pragma GCC unroll 16
    for (int n = 0; n < 16; ++n) acc[n] = _mm512_mul_ps(acc[n], _mm512_set1_ps(n < cols ? cscale[n] : 0.0f));
  transpose16(acc);  // acc[m]: activation row m over the output columns
  const __mmask16 cm = static_cast<__mmask16>(cols >= 16 ? 0xffffu : (1u << cols) - 1);
#pragma GCC unroll 16
  for (int m = 0; m < rows; ++m) _mm512_mask_storeu_ps(C + m * ldc, cm, acc[m]);
}

// Quantizes and packs A, then runs the panels of 16 output columns over the pool threads. Int8:
// W int8 [N, K], scale [N]; int4: W packed [N, K / 2], scale [N, K / group].
template <bool kInt4>
void run(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const void* W,
         Int4Scales scale, float* C, int64_t ldc) {
  Packed p;
  p.nb = K / kBlock;
  p.groups = (M + 15) / 16;
  thread_local detail::ScratchBuffer t_packed;
  const size_t qbytes = static_cast<size_t>(p.groups * p.nb * kTileBytes);
  auto* base = static_cast<uint8_t*>(t_packed.get(qbytes + static_cast<size_t>(p.groups * p.nb * 16) * sizeof(float)));
  p.q = reinterpret_cast<int8_t*>(base);
  p.d = reinterpret_cast<float*>(base + qbytes);
  if (M % 16 != 0) {  // the last group's missing rows: zero values and scales
    const int64_t g = p.groups - 1;
    std::memset(p.q + g * p.nb * kTileBytes, 0, static_cast<size_t>(p.nb * kTileBytes));
    std::memset(p.d + g * p.nb * 16, 0, static_cast<size_t>(p.nb * 16) * sizeof(float));
  }
  parallel_for(0, M, std::max<int64_t>(16, 8192 / K), [&](int64_t r0, int64_t r1) { quantize_rows(r0, r1, A, lda, p); });
  const int64_t panels = (N + 15) / 16, ngroups = kInt4 ? K / group : 1, gpb = kInt4 ? group / kBlock : 1;
  const int64_t spp = kInt4 ? p.nb * 16 : 16;  // scales per panel
  // Below ~2^22 multiply-adds a second thread's wake-up costs more than its share.
  const int64_t grain = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) >= 4.0e6 ? 1 : panels;
  // Each thread takes a range of panels, in batches whose weights (int4: unpacked) fit in about
  // half the L2, and runs each batch chunk by chunk of activation groups whose packed tiles fit
  // in half the L1d (reused there by every panel of the batch; each panel's weights stay in the
  // L1d across the groups of a chunk).
  const int64_t panel_bytes = 16 * K;
  const int64_t batch = std::max<int64_t>(1, (int64_t{1} << 20) / panel_bytes);
  const int64_t chunk = std::max<int64_t>(1, (int64_t{24} << 10) / (p.nb * kTileBytes));
  parallel_for(0, panels, grain, [&](int64_t q0, int64_t q1) {
    thread_local detail::ScratchBuffer t_panels, t_scales;
    const SavedTiles saved;
    configure_tiles();
    for (int64_t qb = q0; qb < q1; qb += batch) {
      const int64_t qe = std::min(q1, qb + batch);
      // The batch's weights (unpacked int4, or the last partial panel of int8 with its missing
      // rows zero) and scales (int8: [panel][16]; int4: [panel][16][K / 32]).
      // When one chunk holds every group (up to ~48 rows at K 768), each panel is used right after
      // it is prepared and never again: one slot then serves the whole batch and stays in the L1d.
      const int64_t slots = p.groups <= chunk ? 1 : qe - qb;
      const auto slot = [&](int64_t q) { return slots == 1 ? 0 : q - qb; };
      int8_t* unpacked = kInt4 || N % 16 != 0 ? t_panels.get_as<int8_t>(static_cast<size_t>(slots * panel_bytes)) : nullptr;
      float* sc = t_scales.get_as<float>(static_cast<size_t>(slots * spp));
      // A whole int4 panel for a single group of rows is unpacked by the tile loop as it goes.
      const auto fused = [&](int cols) { return kInt4 && p.groups == 1 && cols == 16; };
      // Fills panel q's slot of the batch (run by the first chunk of groups, right before the
      // panel's tiles, so that they find it in the L1d).
      const auto prepare = [&](int64_t q) {
        const int64_t n0 = q * 16;
        const int cols = static_cast<int>(std::min<int64_t>(16, N - n0));
        float* s = sc + slot(q) * spp;
        if (kInt4) {
          // The scales of the next panel of the thread's range (whole) are prefetched alongside.
          const int64_t pf_rows = q + 1 < q1 && (q + 2) * 16 <= N ? 16 : 0;
          if (!fused(cols)) unpack_int4_panel(static_cast<const uint8_t*>(W), K, n0, cols, unpacked + slot(q) * panel_bytes);
          panel_block_scales(scale, n0, cols, ngroups, gpb, s, pf_rows);
        } else {
          if (cols < 16) {
            int8_t* dst = unpacked + slot(q) * panel_bytes;
            std::memcpy(dst, static_cast<const int8_t*>(W) + n0 * K, static_cast<size_t>(cols * K));
            std::memset(dst + cols * K, 0, static_cast<size_t>((16 - cols) * K));
          }
          for (int n = 0; n < 16; ++n) s[n] = n < cols ? scale[n0 + n] : 0.0f;
        }
      };
      for (int64_t g0 = 0; g0 < p.groups; g0 += chunk) {
        const int64_t g1 = std::min(p.groups, g0 + chunk);
        for (int64_t q = qb; q < qe; ++q) {
          if (g0 == 0) prepare(q);
          const int64_t n0 = q * 16;
          const int cols = static_cast<int>(std::min<int64_t>(16, N - n0));
          const int8_t* w = kInt4 || cols < 16 ? unpacked + slot(q) * panel_bytes : static_cast<const int8_t*>(W) + n0 * K;
          const float* s = sc + slot(q) * spp;
          for (int64_t g = g0; g < g1; ++g) {
            const int rows = static_cast<int>(std::min<int64_t>(16, M - g * 16));
            // The first group prefetches the next panel of the thread's range (int4: packed).
            const bool pf_next = g == 0 && q + 1 < q1 && (q + 2) * 16 <= N;
            const int8_t* pf = !pf_next ? nullptr
                               : kInt4 ? reinterpret_cast<const int8_t*>(static_cast<const uint8_t*>(W) + (n0 + 16) * (K / 2))
                                       : w + 16 * K;
            const uint8_t* wp = fused(cols) ? static_cast<const uint8_t*>(W) + n0 * (K / 2) : nullptr;
            tile_16x16<kInt4>(w, K, p, g, s, s, C + g * 16 * ldc + n0, ldc, rows, cols, pf, kInt4 ? K / 2 : K, wp);
          }
        }
      }
    }
  });
}

}  // namespace

bool gemm_int8_amx_available() { return amx_int8_ok(); }

bool gemm_int8_amx(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const int8_t* W, const float* scale,
                   float* C, int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0 || K % kBlock != 0 || batch_invariant() || !amx_int8_ok()) return false;
  run<false>(M, N, K, 1, A, lda, W, scale, C, ldc);
  return true;
}

bool gemm_int4_amx(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
                   Int4Scales scale, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0 || K % kBlock != 0 || group <= 0 || group % kBlock != 0 || K % group != 0 ||
      batch_invariant() || !amx_int8_ok())
    return false;
  run<true>(M, N, K, group, A, lda, W, scale, C, ldc);
  return true;
}

}  // namespace tpu::kernels

TPU_INTRIN_DIAGNOSTICS_POP
