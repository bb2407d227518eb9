// Many-row products with int8 and int4 weights (prefill): C = (A quantized) x (W dequantized)^T
// by an AVX-512 VNNI register-tiled GEMM (gemm.h, gemm_int8_vnni / gemm_int4_vnni). int4 weights
// are unpacked to int8 while a panel is packed, and each block's sums are scaled by the column's
// group scale (panels carry per-block column scales; 1 for int8, whose channel scale multiplies
// at the end).
//
// A is quantized exactly as the vnni GEMV path does it (gemv_vnni.cpp): per row, blocks of 32
// values along K, d = max |a| / 127, q = round(a * 127 / max |a|) (to nearest even), offset to
// unsigned q + 128. W [N, K] (int8, per-channel f32 scale) is packed per thread into panels of
// 32 columns: for each 4 consecutive k one 32-bit word per column (the 4 weights), so one
// vpdpbusd multiplies a broadcast word of 4 quantized activations of one row by 16 columns and
// adds the 4 products into each column's int32 lane. Per block of 32 k the int32 sums start
// from -128 times the block's weight sums (the offset's share, packed with the panel), so they
// are the exact sums of q w; they are then converted to f32 and accumulated times the row's
// block scale d; the column's weight scale multiplies once at the end. Register tile: 6 rows x
// 32 columns (12 int32 and 12 f32 accumulators).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "ops/cpu/kernels/scratch.h"
#include "tpucore/core/batch_invariant.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/parallel.h"

#define TPU_GEMM_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

TPU_INTRIN_DIAGNOSTICS_PUSH

namespace tpu::kernels {
namespace {

constexpr int kVgMR = 6;   // rows of the register tile
constexpr int kVgNR = 32;  // columns of the register tile (two vectors of 16 int32 lanes)
constexpr int kVgBlock = 32;

// Words of one block of a packed panel: 32 int32 start values, 8 groups of 32 weight words, 32
// f32 block scales of the columns.
constexpr int kVgBlockWords = kVgNR * 10;

thread_local detail::ScratchBuffer t_vg_rows;   // quantized A and its block scales
thread_local detail::ScratchBuffer t_vg_panel;  // one packed weight panel

// Quantized rows: q [M][kp] offset bytes (kp = K padded to kVgBlock with zeros, i.e. 128),
// d [M][nb] block scales.
struct VgRows {
  int64_t kp = 0, nb = 0;
  uint8_t* q = nullptr;
  float* d = nullptr;
};

TPU_GEMM_VNNI void vg_quantize_rows(int64_t r0, int64_t r1, int64_t K, const float* A, int64_t lda, const VgRows& v) {
  for (int64_t i = r0; i < r1; ++i) {
    const float* a = A + i * lda;
    for (int64_t b = 0; b < v.nb; ++b) {
      const int64_t k0 = b * kVgBlock, n = std::min<int64_t>(kVgBlock, K - k0);
      const __mmask16 m0 = static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << n) - 1);
      const __mmask16 m1 = static_cast<__mmask16>(n >= 32 ? 0xffffu : n > 16 ? (1u << (n - 16)) - 1 : 0u);
      const __m512 x0 = _mm512_maskz_loadu_ps(m0, a + k0), x1 = _mm512_maskz_loadu_ps(m1, a + k0 + std::min<int64_t>(16, n));
      float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
      // NaN in the block: its scale NaN, so that the outputs it touches are NaN.
      if (_mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q)) amax = __builtin_nanf("");
      v.d[i * v.nb + b] = amax / 127.0f;
      const float id = amax > 0 && amax <= 3.4e38f ? 127.0f / amax : 0.0f;
      const __m512 vid = _mm512_set1_ps(id);
      const __m128i off = _mm_set1_epi8(static_cast<char>(0x80));
      const __m128i q0 = _mm_xor_si128(_mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x0, vid))), off);
      const __m128i q1 = _mm_xor_si128(_mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x1, vid))), off);
      uint8_t* q = v.q + i * v.kp + k0;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q), q0);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), q1);
    }
  }
}

// Fills block b of a panel from the 32 weights of each column (32 bytes per column at w[c], zero
// for c >= cols) and the columns' block scales: the 32 start values (-128 times the column's
// weight sum over the block), the 8 groups of 4 k (word c = weights 4g..4g+3 of column c), the
// scales.
TPU_GEMM_VNNI void vg_fill_block(const __m256i (&w)[kVgNR], const float* bs, int32_t* blk) {
  const __m512i ones = _mm512_set1_epi8(1);
  for (int c = 0; c < kVgNR; ++c) {
    alignas(32) int32_t words[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(words), w[c]);
    for (int g = 0; g < 8; ++g) blk[kVgNR * (1 + g) + c] = words[g];
    const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_castsi256_si512(w[c]));
    blk[c] = -128 * _mm512_reduce_add_epi32(s);
  }
  std::memcpy(blk + kVgNR * 9, bs, sizeof(float) * kVgNR);
}

// Packs columns [j0, j0 + cols) of an int8 W [N, K] (cols <= 32) into a panel; block scales 1.
TPU_GEMM_VNNI void vg_pack_panel_int8(const int8_t* W, int64_t K, int64_t j0, int cols, int64_t nb, int32_t* dst) {
  float bs[kVgNR];
  for (int c = 0; c < kVgNR; ++c) bs[c] = 1.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t k0 = b * kVgBlock, n = std::min<int64_t>(kVgBlock, K - k0);
    const __mmask32 m = n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1;
    __m256i w[kVgNR];
    for (int c = 0; c < kVgNR; ++c) w[c] = c < cols ? _mm256_maskz_loadu_epi8(m, W + (j0 + c) * K + k0) : _mm256_setzero_si256();
    vg_fill_block(w, bs, dst + b * kVgBlockWords);
  }
}

// The same from packed int4 rows (gemv_int4.h: 16 bytes per 32 weights, low nibbles weights
// 0-15, high nibbles 16-31, stored as q + 8; K a multiple of 32): the weights unpacked to int8
// q, the block scales the columns' group scales (scale [N, K / group], group a multiple of 32).
TPU_GEMM_VNNI void vg_pack_panel_int4(const uint8_t* W, Int4Scales scale, int64_t K, int64_t group, int64_t j0, int cols,
                                      int64_t nb, int32_t* dst) {
  const int64_t groups = K / group;
  const __m128i low4 = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i w[kVgNR];
    float bs[kVgNR];
    for (int c = 0; c < kVgNR; ++c) {
      if (c >= cols) {
        w[c] = _mm256_setzero_si256();
        bs[c] = 0.0f;
        continue;
      }
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(W + (j0 + c) * (K / 2) + b * 16));
      const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, low4), eight);
      const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), eight);
      w[c] = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
      bs[c] = scale[(j0 + c) * groups + b * kVgBlock / group];
    }
    vg_fill_block(w, bs, dst + b * kVgBlockWords);
  }
}

template <int R>
TPU_GEMM_VNNI void vg_tile(int64_t nb, const VgRows& v, int64_t i0, const int32_t* panel, const float* scale, float* C,
                           int64_t ldc, int cols) {
  __m512 f0[R], f1[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) f0[r] = f1[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int32_t* blk = panel + b * kVgBlockWords;
    const __m512i s0 = _mm512_loadu_si512(blk), s1 = _mm512_loadu_si512(blk + 16);
    __m512i a0[R], a1[R];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) a0[r] = s0, a1[r] = s1;
    const uint8_t* q = v.q + i0 * v.kp + b * kVgBlock;
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m512i w0 = _mm512_loadu_si512(blk + kVgNR * (1 + g)), w1 = _mm512_loadu_si512(blk + kVgNR * (1 + g) + 16);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        int32_t word;
        __builtin_memcpy(&word, q + r * v.kp + 4 * g, 4);
        const __m512i x = _mm512_set1_epi32(word);
        a0[r] = _mm512_dpbusd_epi32(a0[r], x, w0);
        a1[r] = _mm512_dpbusd_epi32(a1[r], x, w1);
      }
    }
    const __m512 bs0 = _mm512_loadu_ps(reinterpret_cast<const float*>(blk + kVgNR * 9)),
                 bs1 = _mm512_loadu_ps(reinterpret_cast<const float*>(blk + kVgNR * 9 + 16));
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_set1_ps(v.d[(i0 + r) * v.nb + b]);
      f0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0[r]), _mm512_mul_ps(d, bs0), f0[r]);
      f1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[r]), _mm512_mul_ps(d, bs1), f1[r]);
    }
  }
  const __mmask16 m0 = static_cast<__mmask16>(cols >= 16 ? 0xffffu : (1u << cols) - 1);
  const __mmask16 m1 = static_cast<__mmask16>(cols >= 32 ? 0xffffu : cols > 16 ? (1u << (cols - 16)) - 1 : 0u);
  // scale: the columns' channel scales (int8), or none (int4: in the block scales).
  const __m512 sc0 = scale ? _mm512_maskz_loadu_ps(m0, scale) : _mm512_set1_ps(1.0f),
               sc1 = scale ? _mm512_maskz_loadu_ps(m1, scale + 16) : _mm512_set1_ps(1.0f);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(C + r * ldc, m0, _mm512_mul_ps(f0[r], sc0));
    _mm512_mask_storeu_ps(C + r * ldc + 16, m1, _mm512_mul_ps(f1[r], sc1));
  }
}

TPU_GEMM_VNNI void vg_panel_rows(int64_t M, int64_t nb, const VgRows& v, const int32_t* panel, const float* scale,
                                 float* C, int64_t ldc, int cols) {
  for (int64_t i = 0; i < M; i += kVgMR) {
    float* c = C + i * ldc;
    switch (std::min<int64_t>(kVgMR, M - i)) {
      case 6: vg_tile<6>(nb, v, i, panel, scale, c, ldc, cols); break;
      case 5: vg_tile<5>(nb, v, i, panel, scale, c, ldc, cols); break;
      case 4: vg_tile<4>(nb, v, i, panel, scale, c, ldc, cols); break;
      case 3: vg_tile<3>(nb, v, i, panel, scale, c, ldc, cols); break;
      case 2: vg_tile<2>(nb, v, i, panel, scale, c, ldc, cols); break;
      default: vg_tile<1>(nb, v, i, panel, scale, c, ldc, cols); break;
    }
  }
}

bool vg_available() {
  const CpuFeatures& f = cpu_features();
  static const bool vnni = __builtin_cpu_supports("avx512vnni");
  return f.avx512f && f.avx512bw && f.avx512vl && f.fma && vnni;
}

}  // namespace

bool gemm_int8_vnni_available() { return vg_available(); }

namespace {

// Quantizes the rows of A, then runs the column panels over the pool threads, each packed by
// pack(j0, cols, panel) into the thread's buffer; `scale` the channel scales or nullptr.
template <class Pack>
void vg_run(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* scale, float* C, int64_t ldc,
            Pack pack) {
  VgRows v;
  v.nb = (K + kVgBlock - 1) / kVgBlock;
  v.kp = v.nb * kVgBlock;
  auto* base = static_cast<uint8_t*>(t_vg_rows.get(static_cast<size_t>(M * v.kp + M * v.nb * 4)));
  v.q = base;
  v.d = reinterpret_cast<float*>(base + M * v.kp);
  tpu::parallel_for(0, M, std::max<int64_t>(1, 4096 / v.kp), [&](int64_t r0, int64_t r1) {
    vg_quantize_rows(r0, r1, K, A, lda, v);
  });
  const int64_t panels = (N + kVgNR - 1) / kVgNR;
  const size_t panel_words = static_cast<size_t>(v.nb * kVgBlockWords);
  tpu::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    auto* panel = static_cast<int32_t*>(t_vg_panel.get(panel_words * sizeof(int32_t)));
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t j0 = p * kVgNR;
      const int cols = static_cast<int>(std::min<int64_t>(kVgNR, N - j0));
      pack(j0, cols, v.nb, panel);
      vg_panel_rows(M, v.nb, v, panel, scale ? scale + j0 : nullptr, C + j0, ldc, cols);
    }
  });
}

}  // namespace

bool gemm_int8_vnni(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const int8_t* W, const float* scale,
                    float* C, int64_t ldc) {
  if (M < kGemmInt8MinRows || N <= 0 || K <= 0 || batch_invariant() || !vg_available()) return false;
  vg_run(M, N, K, A, lda, scale, C, ldc,
         [&](int64_t j0, int cols, int64_t nb, int32_t* panel) { vg_pack_panel_int8(W, K, j0, cols, nb, panel); });
  return true;
}

bool gemm_int4_vnni(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
                    Int4Scales scale, float* C, int64_t ldc) {
  if (M < kGemmInt8MinRows || N <= 0 || K <= 0 || K % 32 != 0 || group <= 0 || group % 32 != 0 || K % group != 0 ||
      batch_invariant() || !vg_available())
    return false;
  vg_run(M, N, K, A, lda, nullptr, C, ldc, [&](int64_t j0, int cols, int64_t nb, int32_t* panel) {
    vg_pack_panel_int4(W, scale, K, group, j0, cols, nb, panel);
  });
  return true;
}

}  // namespace tpu::kernels

TPU_INTRIN_DIAGNOSTICS_POP
