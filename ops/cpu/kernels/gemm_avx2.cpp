// AVX2 + FMA micro-kernel for the host f32 GEMM (also used for bf16 inputs, widened to f32
// panels by the driver), for x86-64 CPUs without AVX-512 (AMD Zen 1-3, Intel Haswell and
// later client parts).
//
// This translation unit is compiled for the baseline CPU like the rest of the library; only
// the functions below carry a target attribute, and the driver calls them only after
// tpu::cpu_features() reported AVX2 and FMA.
//
// Register tile: MR = 6 rows x NR = 16 columns (two ymm per row) = 12 accumulators, plus two
// B vectors and one broadcast A value: 15 of the 16 ymm registers. Per packed k-step the
// kernel loads two B vectors and broadcasts six A values, for 12 FMAs (two FMA pipes on
// Zen and Haswell-class cores: the 12 independent accumulators cover the 4-5 cycle FMA
// latency).
#include <immintrin.h>

#include "ops/cpu/kernels/gemm.h"
#include "tpucore/core/half.h"

// F16C too (every AVX2 CPU has it): the f16 packers widen with vcvtph2ps. The f32 and bf16 code
// emits no F16C instruction.
#define TPU_GEMM_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tpu::kernels::detail {
namespace {

constexpr int kMR = 6;
constexpr int kNR = 16;

// Lane mask with the first `n` (0..8) lanes set.
TPU_GEMM_AVX2 inline __m256i lane_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <int R>
TPU_GEMM_AVX2 void tile_f32(int64_t kc, const float* Ap, const float* Bp, float* C, int64_t ldc,
                            int cols, bool load_c) {
  __m256 acc0[kMR], acc1[kMR];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm256_setzero_ps();
    acc1[r] = _mm256_setzero_ps();
    _mm_prefetch(reinterpret_cast<const char*>(C + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(C + r * ldc + kNR - 1), _MM_HINT_T0);
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(Bp);
    const __m256 b1 = _mm256_loadu_ps(Bp + 8);
    _mm_prefetch(reinterpret_cast<const char*>(Ap + 8 * kMR), _MM_HINT_T0);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(Ap + r);
      acc0[r] = _mm256_fmadd_ps(a, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(a, b1, acc1[r]);
    }
    Ap += kMR;
    Bp += kNR;
  }
  if (cols == kNR) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      float* c = C + r * ldc;
      if (load_c) {
        acc0[r] = _mm256_add_ps(acc0[r], _mm256_loadu_ps(c));
        acc1[r] = _mm256_add_ps(acc1[r], _mm256_loadu_ps(c + 8));
      }
      _mm256_storeu_ps(c, acc0[r]);
      _mm256_storeu_ps(c + 8, acc1[r]);
    }
    return;
  }
  // Ragged right edge: masked loads and stores (masked-off lanes are never touched).
  const __m256i m0 = lane_mask(cols < 8 ? cols : 8);
  const __m256i m1 = lane_mask(cols > 8 ? cols - 8 : 0);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    float* c = C + r * ldc;
    if (load_c) {
      acc0[r] = _mm256_add_ps(acc0[r], _mm256_maskload_ps(c, m0));
      acc1[r] = _mm256_add_ps(acc1[r], _mm256_maskload_ps(c + 8, m1));
    }
    _mm256_maskstore_ps(c, m0, acc0[r]);
    _mm256_maskstore_ps(c + 8, m1, acc1[r]);
  }
}

}  // namespace

// The register tile; mc, kc and nc here are only the values the driver's derivation from the
// caches gives on a Zen 2 core (32 KiB L1d, 512 KiB L2, 4 MiB L3 share) with the B micro-panel
// in half the L1d (kAvx2L1dPanel): it derives them at run time (detail::derive_blocking).
const GemmBlocking kAvx2BlockingF32 = {kMR, kNR, 6 * 21, 256, 2048};

TPU_GEMM_AVX2 void micro_kernel_f32_avx2(int64_t kc, const float* Ap, const float* Bp, float* C,
                                         int64_t ldc, int rows, int cols, bool load_c) {
  switch (rows) {
    case 6: tile_f32<6>(kc, Ap, Bp, C, ldc, cols, load_c); break;
    case 5: tile_f32<5>(kc, Ap, Bp, C, ldc, cols, load_c); break;
    case 4: tile_f32<4>(kc, Ap, Bp, C, ldc, cols, load_c); break;
    case 3: tile_f32<3>(kc, Ap, Bp, C, ldc, cols, load_c); break;
    case 2: tile_f32<2>(kc, Ap, Bp, C, ldc, cols, load_c); break;
    case 1: tile_f32<1>(kc, Ap, Bp, C, ldc, cols, load_c); break;
    default: break;
  }
}

namespace {

// In-register transpose of an 8 x 8 block: r[i] lane j becomes r[j] lane i.
TPU_GEMM_AVX2 inline void transpose8(__m256 (&r)[8]) {
  // Pairs, then quads within 128-bit lanes, then across lanes.
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

}  // namespace

// One packed B panel from rows of B contiguous along N (row k at src + k * rs):
// dst[k * 16 + c] = B(k, c), zero for c >= cols. Two vector copies per k (masked when ragged).
TPU_GEMM_AVX2 void pack_b_panel_rows_f32_avx2(const float* src, int64_t rs, int cols, int64_t kce,
                                              float* dst) {
  if (cols == kNR) {
    for (int64_t k = 0; k < kce; ++k) {
      _mm256_storeu_ps(dst + k * kNR, _mm256_loadu_ps(src + k * rs));
      _mm256_storeu_ps(dst + k * kNR + 8, _mm256_loadu_ps(src + k * rs + 8));
    }
    return;
  }
  const __m256i m0 = lane_mask(cols < 8 ? cols : 8);
  const __m256i m1 = lane_mask(cols > 8 ? cols - 8 : 0);
  for (int64_t k = 0; k < kce; ++k) {
    _mm256_storeu_ps(dst + k * kNR, _mm256_maskload_ps(src + k * rs, m0));
    _mm256_storeu_ps(dst + k * kNR + 8, _mm256_maskload_ps(src + k * rs + 8, m1));
  }
}

// bf16 (raw bits) to f32 panels for gemm_bf16 on AVX2: the same layouts as the f32 packers,
// each bf16 widened exactly (its bits become the high half of the f32).
namespace {
TPU_GEMM_AVX2 inline __m256 widen8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float widen1(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}
// Eight (or one) f32 values from f32 or bf16 memory: the packers serve both element types.
TPU_GEMM_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
TPU_GEMM_AVX2 inline __m256 load8(const uint16_t* p) { return widen8(p); }
// IEEE f16 (gemm_f16's B): vcvtph2ps, exact.
TPU_GEMM_AVX2 inline __m256 load8(const f16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline float load1(float v) { return v; }
inline float load1(uint16_t v) { return widen1(v); }
inline float load1(f16 v) { return v.to_f32(); }

// One packed A panel from `rows` (<= 6) rows contiguous along K (f32, or bf16 widened
// exactly): dst[k * 6 + r] = row r, element k (zero for r >= rows). Eight k at a time: the
// 6 (+2 zero) x 8 block is transposed in registers and its columns are written back to back,
// each 8-lane store overlapping the next column's start (the last one is written as 4 + 2 lanes).

template <class T>
TPU_GEMM_AVX2 void pack_a_panel(const T* src, int64_t rs, int rows, int64_t kce, float* dst) {
  int64_t k0 = 0;
  for (; k0 + 8 <= kce; k0 += 8) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) r[i] = _mm256_setzero_ps();
    for (int i = 0; i < rows; ++i) r[i] = load8(src + i * rs + k0);
    transpose8(r);  // r[k] = (row 0 .. row 7) at k0 + k
    float* d = dst + k0 * kMR;
#pragma GCC unroll 7
    for (int k = 0; k < 7; ++k) _mm256_storeu_ps(d + k * kMR, r[k]);
    _mm_storeu_ps(d + 7 * kMR, _mm256_castps256_ps128(r[7]));
    _mm_storel_pi(reinterpret_cast<__m64*>(d + 7 * kMR + 4), _mm256_extractf128_ps(r[7], 1));
  }
  for (; k0 < kce; ++k0)
    for (int i = 0; i < kMR; ++i) dst[k0 * kMR + i] = i < rows ? load1(src[i * rs + k0]) : 0.0f;
}

// One packed B panel from `cols` (<= 16) columns contiguous along K (B = W^T of a linear
// layer; f32, or bf16 widened exactly): dst[k * 16 + c] = column c, element k (zero for
// c >= cols). Eight k at a time, as two 8 x 8 transposes (columns 0-7 and 8-15).
// `ds`: the distance between two k rows of dst (kNR for this kernel's own panels; the
// AVX-512 kernel's 32-wide panels take two 16-column halves with ds = 32).
template <class T>
TPU_GEMM_AVX2 void pack_b_panel_columns(const T* src, int64_t cs, int cols, int64_t kce, float* dst, int64_t ds = kNR) {
  int64_t k0 = 0;
  for (; k0 + 8 <= kce; k0 += 8) {
    float* d = dst + k0 * ds;
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m256 r[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) r[i] = _mm256_setzero_ps();
      const int n = cols - 8 * h < 8 ? cols - 8 * h : 8;
      for (int i = 0; i < n; ++i) r[i] = load8(src + (8 * h + i) * cs + k0);
      transpose8(r);  // r[k] = (column 8h .. 8h + 7) at k0 + k
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) _mm256_storeu_ps(d + k * ds + 8 * h, r[k]);
    }
  }
  for (; k0 < kce; ++k0)
    for (int c = 0; c < kNR; ++c) dst[k0 * ds + c] = c < cols ? load1(src[c * cs + k0]) : 0.0f;
}
}  // namespace

TPU_GEMM_AVX2 void pack_a_panel_f32_avx2(const float* src, int64_t rs, int rows, int64_t kce, float* dst) {
  pack_a_panel(src, rs, rows, kce, dst);
}
TPU_GEMM_AVX2 void pack_a_panel_bf16_avx2(const uint16_t* src, int64_t rs, int rows, int64_t kce, float* dst) {
  pack_a_panel(src, rs, rows, kce, dst);
}
TPU_GEMM_AVX2 void pack_b_panel_f32_avx2(const float* src, int64_t cs, int cols, int64_t kce, float* dst) {
  pack_b_panel_columns(src, cs, cols, kce, dst);
}
TPU_GEMM_AVX2 void pack_b_half_panel_f32_avx2(const float* src, int64_t cs, int cols, int64_t kce, float* dst,
                                               int64_t ds) {
  pack_b_panel_columns(src, cs, cols, kce, dst, ds);
}

TPU_GEMM_AVX2 void pack_b_panel_f16_avx2(const uint16_t* src, int64_t cs, int cols, int64_t kce, float* dst) {
  pack_b_panel_columns(reinterpret_cast<const f16*>(src), cs, cols, kce, dst);
}
TPU_GEMM_AVX2 void pack_b_half_panel_f16_avx2(const uint16_t* src, int64_t cs, int cols, int64_t kce, float* dst,
                                              int64_t ds) {
  pack_b_panel_columns(reinterpret_cast<const f16*>(src), cs, cols, kce, dst, ds);
}

TPU_GEMM_AVX2 void pack_b_half_panel_bf16_avx2(const uint16_t* src, int64_t cs, int cols, int64_t kce, float* dst,
                                               int64_t ds) {
  pack_b_panel_columns(src, cs, cols, kce, dst, ds);
}

TPU_GEMM_AVX2 void pack_b_panel_bf16_avx2(const uint16_t* src, int64_t rs, int64_t cs, int cols,
                                          int64_t kce, float* dst) {
  if (cs == 1) {  // rows of B contiguous along N
    for (int64_t k = 0; k < kce; ++k) {
      const uint16_t* s = src + k * rs;
      if (cols == kNR) {
        _mm256_storeu_ps(dst + k * kNR, widen8(s));
        _mm256_storeu_ps(dst + k * kNR + 8, widen8(s + 8));
      } else {
        for (int c = 0; c < kNR; ++c) dst[k * kNR + c] = c < cols ? widen1(s[c]) : 0.0f;
      }
    }
    return;
  }
  pack_b_panel_columns(src, cs, cols, kce, dst);  // columns contiguous along K (rs == 1)
}

}  // namespace tpu::kernels::detail
