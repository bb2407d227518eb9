// AVX-512 micro-kernels for the host GEMM (f32 with FMA, bf16 with vdpbf16ps).
//
// This translation unit is compiled for the baseline CPU like the rest of the library;
// only the functions below carry a target attribute, and the driver calls them only after
// tpu::cpu_features() reported AVX-512 (and avx512_bf16 for the bf16 kernel).
//
// Register tile: MR = 14 rows x NR = 32 columns (two zmm per row) = 28 accumulators; per
// packed k-step the kernel loads two B vectors and broadcasts 14 A values (folded into the
// FMA as memory broadcasts), so 28 FMAs go with 16 loads. bf16 uses the same tile: a packed
// k-step is one pair of bf16 along K, and vdpbf16ps adds both products of the pair.
#include <immintrin.h>

#include <algorithm>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/intrin_diagnostics.h"

// The f32 kernel needs no avx512_bf16, so it also runs on AVX-512 CPUs without it.
#define TPU_GEMM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TPU_GEMM_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

namespace tpu::kernels::detail {
namespace {

constexpr int kMR = 14;
constexpr int kNR = 32;

// Adds (or stores) the accumulators of R rows into C with the column masks m0, m1.
template <int R>
TPU_GEMM_AVX512 inline void store_tile(const __m512 (&acc0)[kMR], const __m512 (&acc1)[kMR],
                                       float* C, int64_t ldc, __mmask16 m0, __mmask16 m1,
                                       bool load_c) {
  if (load_c) {
#pragma GCC unroll 14
    for (int r = 0; r < R; ++r) {
      float* c = C + r * ldc;
      const __m512 c0 = _mm512_maskz_loadu_ps(m0, c);
      const __m512 c1 = _mm512_maskz_loadu_ps(m1, c + 16);
      _mm512_mask_storeu_ps(c, m0, _mm512_add_ps(acc0[r], c0));
      _mm512_mask_storeu_ps(c + 16, m1, _mm512_add_ps(acc1[r], c1));
    }
  } else {
#pragma GCC unroll 14
    for (int r = 0; r < R; ++r) {
      float* c = C + r * ldc;
      _mm512_mask_storeu_ps(c, m0, acc0[r]);
      _mm512_mask_storeu_ps(c + 16, m1, acc1[r]);
    }
  }
}

// Prefetches the R rows of a C tile (two cache lines each) with the given hint.
template <int R, int Hint>
TPU_GEMM_AVX512 inline void prefetch_tile(const float* C, int64_t ldc) {
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r) {
    // _mm_prefetch(p, Hint) as GCC and Clang both define it (Clang has no _mm_hint enum)
    __builtin_prefetch(C + r * ldc, (Hint >> 2) & 1, Hint & 3);
    __builtin_prefetch(C + r * ldc + 16, (Hint >> 2) & 1, Hint & 3);
  }
}

// How many k-steps before the end of the tile its C rows are prefetched into the L1d. At the
// start they go to the L2 only: in a wide C the rows are a multiple of 4 KiB apart, so all 14
// rows fall into the same L1d set and an early L1d prefetch would evict half of them (and
// lines of the B panel) long before the tile is written; when C no longer fits the L2
// (n = 1024, 2048) its lines then arrive from the L3 or DRAM during the multiply.
constexpr int64_t kCL1Lead = 24;

template <int R>
TPU_GEMM_AVX512 void tile_f32(int64_t kc, const float* Ap, const float* Bp, float* C,
                              int64_t ldc, __mmask16 m0, __mmask16 m1, bool load_c) {
  __m512 acc0[kMR], acc1[kMR];
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm512_setzero_ps();
    acc1[r] = _mm512_setzero_ps();
  }
  prefetch_tile<R, _MM_HINT_T1>(C, ldc);
  const int64_t k_pf = kc > kCL1Lead ? kc - kCL1Lead : 0;
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    if (k == k_pf) prefetch_tile<R, _MM_HINT_T0>(C, ldc);
    const __m512 b0 = _mm512_load_ps(Bp);
    const __m512 b1 = _mm512_load_ps(Bp + 16);
    _mm_prefetch(reinterpret_cast<const char*>(Bp + 8 * kNR), _MM_HINT_T0);
#pragma GCC unroll 14
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(Ap[r]);
      acc0[r] = _mm512_fmadd_ps(a, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(a, b1, acc1[r]);
    }
    Ap += kMR;
    Bp += kNR;
  }
  store_tile<R>(acc0, acc1, C, ldc, m0, m1, load_c);
}

template <int R>
TPU_GEMM_AVX512_BF16 void tile_bf16(int64_t kc, const uint32_t* Ap, const uint32_t* Bp, float* C,
                               int64_t ldc, __mmask16 m0, __mmask16 m1, bool load_c) {
  __m512 acc0[kMR], acc1[kMR];
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm512_setzero_ps();
    acc1[r] = _mm512_setzero_ps();
  }
  prefetch_tile<R, _MM_HINT_T1>(C, ldc);
  const int64_t k_pf = kc > kCL1Lead ? kc - kCL1Lead : 0;
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    if (k == k_pf) prefetch_tile<R, _MM_HINT_T0>(C, ldc);
    const __m512bh b0 = (__m512bh)_mm512_load_si512(Bp);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(Bp + 16);
    _mm_prefetch(reinterpret_cast<const char*>(Bp + 8 * kNR), _MM_HINT_T0);
#pragma GCC unroll 14
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(Ap[r]));
      acc0[r] = _mm512_dpbf16_ps(acc0[r], a, b0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], a, b1);
    }
    Ap += kMR;
    Bp += kNR;
  }
  store_tile<R>(acc0, acc1, C, ldc, m0, m1, load_c);
}

TPU_GEMM_AVX512 inline void column_masks(int cols, __mmask16* m0, __mmask16* m1) {
  *m0 = cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1u);
  *m1 = cols >= 32 ? __mmask16(0xFFFF)
                   : (cols > 16 ? __mmask16((1u << (cols - 16)) - 1u) : __mmask16(0));
}

}  // namespace

// The register tile; mc, kc and nc here are only the values the driver's derivation from the
// caches gives on a Zen 4 core (32 KiB L1d, 1 MiB L2): it derives them at run time
// (detail::derive_blocking; kc counts packed k-steps, bf16: pairs).
const GemmBlocking kAvx512BlockingF32 = {kMR, kNR, 14 * 18, 512, 4096};
const GemmBlocking kAvx512BlockingBf16 = {kMR, kNR, 14 * 18, 512, 4096};

#define TPU_GEMM_ROW_CASES(FN)                             \
  switch (rows) {                                          \
    case 14: FN<14>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break; \
    case 13: FN<13>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break; \
    case 12: FN<12>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break; \
    case 11: FN<11>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break; \
    case 10: FN<10>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break; \
    case 9: FN<9>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break;   \
    case 8: FN<8>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break;   \
    case 7: FN<7>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break;   \
    case 6: FN<6>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break;   \
    case 5: FN<5>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break;   \
    case 4: FN<4>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break;   \
    case 3: FN<3>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break;   \
    case 2: FN<2>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break;   \
    case 1: FN<1>(kc, Ap, Bp, C, ldc, m0, m1, load_c); break;   \
    default: break;                                        \
  }

TPU_GEMM_AVX512 void micro_kernel_f32_avx512(int64_t kc, const float* Ap, const float* Bp,
                                             float* C, int64_t ldc, int rows, int cols,
                                             bool load_c) {
  __mmask16 m0, m1;
  column_masks(cols, &m0, &m1);
  TPU_GEMM_ROW_CASES(tile_f32)
}

TPU_GEMM_AVX512_BF16 void micro_kernel_bf16_avx512(int64_t kc, const uint32_t* Ap,
                                              const uint32_t* Bp, float* C, int64_t ldc,
                                              int rows, int cols, bool load_c) {
  __mmask16 m0, m1;
  column_masks(cols, &m0, &m1);
  TPU_GEMM_ROW_CASES(tile_bf16)
}

#undef TPU_GEMM_ROW_CASES

TPU_INTRIN_DIAGNOSTICS_PUSH
namespace {
// Transposes a block of 16 rows x 16 32-bit words in registers (unpacks and 128-bit lane
// shuffles): w[c] = word c of every row, row i in lane i. Row i (i < rows) is read at
// base + i * row_bytes, its first n words; rows past `rows` and words past n read as zero.
TPU_GEMM_AVX512 inline void transpose_words_16x16(const char* base, int64_t row_bytes, int rows, int n,
                                                  __m512i (&w)[16]) {
  const __mmask16 in_mask = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
  __m512i r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_setzero_si512();
  for (int i = 0; i < rows; ++i) r[i] = _mm512_maskz_loadu_epi32(in_mask, base + i * row_bytes);
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + j], 128-bit lane L: column 4L + j of rows 4i .. 4i+3.
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i a0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);
    const __m512i a1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD);
    const __m512i b0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    const __m512i b1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
    w[j] = _mm512_shuffle_i32x4(a0, b0, 0x88);
    w[4 + j] = _mm512_shuffle_i32x4(a1, b1, 0x88);
    w[8 + j] = _mm512_shuffle_i32x4(a0, b0, 0xDD);
    w[12 + j] = _mm512_shuffle_i32x4(a1, b1, 0xDD);
  }
}
}  // namespace

// One packed A panel from `rows` (<= 14) rows of 32-bit words (f32 values, or bf16 pairs):
// dst[k * 14 + r] = word k of row r, zero for r >= rows. Rows are read 16 words at a time
// and transposed in registers.
TPU_GEMM_AVX512 void pack_a_panel_words_avx512(const void* src, int64_t row_bytes, int rows,
                                               int64_t kw, uint32_t* dst) {
  const char* base = static_cast<const char*>(src);
  const __mmask16 out_mask = (1u << kMR) - 1u;
  for (int64_t k0 = 0; k0 < kw; k0 += 16) {
    const int n = static_cast<int>(kw - k0 < 16 ? kw - k0 : 16);
    __m512i w[16];
    transpose_words_16x16(base + k0 * 4, row_bytes, rows, n, w);
    for (int c = 0; c < n; ++c) _mm512_mask_storeu_epi32(dst + (k0 + c) * kMR, out_mask, w[c]);
  }
}

// One B panel of bf16 pairs from 32 columns contiguous along K: a pair of K values is one 32-bit
// word of a column, so the panel is the transpose of a cols x (kce / 2) word matrix, in 16 x 16
// word blocks.
TPU_GEMM_AVX512 void pack_b_panel_bf16_pairs_transposed_avx512(const uint16_t* src, int64_t cs, int cols,
                                                               int64_t kce, uint32_t* dst) {
  const int64_t words = kce / 2;
  for (int c0 = 0; c0 < 32; c0 += 16) {
    const int rows = std::clamp(cols - c0, 0, 16);
    for (int64_t p0 = 0; p0 < words; p0 += 16) {
      const int n = static_cast<int>(std::min<int64_t>(16, words - p0));
      __m512i w[16];
      transpose_words_16x16(reinterpret_cast<const char*>(src + c0 * cs + 2 * p0), cs * 2, rows, n, w);
      for (int c = 0; c < n; ++c) _mm512_storeu_si512(dst + (p0 + c) * 32 + c0, w[c]);
    }
  }
  if (kce % 2)
    for (int c = 0; c < 32; ++c) dst[words * 32 + c] = c < cols ? src[c * cs + kce - 1] : 0u;
}
TPU_INTRIN_DIAGNOSTICS_POP

// Interleaves two rows of 32 bf16 into 32 pairs with one two-source word permute per 16
// pairs: output word 2i is word i of the even row, word 2i + 1 word i of the odd row. Two
// adjacent panels go in one pass over K, so that each row is read 128 bytes (two cache lines)
// at a time: measured on the Intel Xeon, packing all of a 1024 x 1024 (2048 x 2048) B took
// 160 us (650 us) so against 250 us (1120 us) one panel (one cache line per row) at a time.
TPU_GEMM_AVX512 void pack_b_panels_bf16_pairs_avx512(const uint16_t* src, int64_t rs, int cols,
                                                     int64_t kce, uint32_t* dst, int64_t panel_words) {
  alignas(64) static const uint16_t kIdx[2][32] = {
      {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
       8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47},
      {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
       24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63}};
  static_assert(kNR == 32, "one zmm of bf16 per panel row");
  const __m512i lo = _mm512_load_si512(kIdx[0]), hi = _mm512_load_si512(kIdx[1]);
  const auto mask_of = [](int c) {
    return c >= 32 ? __mmask32(0xFFFFFFFFu) : (c <= 0 ? __mmask32(0) : __mmask32((1u << c) - 1u));
  };
  const int panels = cols > 32 ? 2 : 1;
  const __mmask32 m[2] = {mask_of(cols), mask_of(cols - 32)};
  const int64_t kfull = kce / 2;
  for (int64_t p = 0; p < kfull; ++p) {
    const uint16_t* s0 = src + 2 * p * rs;
    for (int h = 0; h < panels; ++h) {
      const __m512i r0 = _mm512_maskz_loadu_epi16(m[h], s0 + 32 * h);
      const __m512i r1 = _mm512_maskz_loadu_epi16(m[h], s0 + rs + 32 * h);
      uint32_t* d = dst + h * panel_words + p * kNR;
      _mm512_storeu_si512(d, _mm512_permutex2var_epi16(r0, lo, r1));
      _mm512_storeu_si512(d + 16, _mm512_permutex2var_epi16(r0, hi, r1));
    }
  }
  if (kce % 2) {
    const __m512i z = _mm512_setzero_si512();
    for (int h = 0; h < panels; ++h) {
      const __m512i r0 = _mm512_maskz_loadu_epi16(m[h], src + 2 * kfull * rs + 32 * h);
      uint32_t* d = dst + h * panel_words + kfull * kNR;
      _mm512_storeu_si512(d, _mm512_permutex2var_epi16(r0, lo, z));
      _mm512_storeu_si512(d + 16, _mm512_permutex2var_epi16(r0, hi, z));
    }
  }
}

}  // namespace tpu::kernels::detail
