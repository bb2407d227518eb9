// The int4 product on a repacked copy of the weight (gemv_int4.h, "panel layout"), AVX-512 VNNI.
//
// Panels of 16 weight rows; per block of 32 weights the 16 rows' nibbles fill four 64-byte
// vectors. In vector s, 32-bit lane l holds row l: its four bytes carry in their low nibbles the
// row's weights 8s..8s+3 of the block and in their high nibbles weights 8s+4..8s+7, as n = w + 8.
// A mask keeps the low nibbles (per lane four consecutive weights of one row), another the high
// ones (16 times the next four); one vpdpbusd multiplies either by a broadcast dword of four
// values of the quantized row of A (the same Q8_0-like blocks of 32 as gemv_vnni.cpp:
// d = max |a| / 127, q = round(a / d)). The 16 lanes are the 16 outputs: no horizontal sums. The
// lanes start from -8 times the block's sum of q (the weight's offset); after the four low-nibble
// products they are multiplied by 16 (a shift) and the four high-nibble ones added, which gives 16
// times the exact integer sums of w q; one conversion to f32 and one multiply-add by d / 16 times
// the 16 rows' group scales (stored before the group's blocks, f16 or f32 as in the canonical
// layout) finish the block. Rows of A in groups of up to four share every unpacked vector; panels
// go over the pool threads.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "ops/cpu/kernels/gemv.h"
#include "ops/cpu/kernels/gemv_int4.h"
#include "ops/cpu/kernels/gemv_int8.h"
#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "ops/cpu/kernels/scratch.h"

#define TPU_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

TPU_INTRIN_DIAGNOSTICS_PUSH

namespace tpu::kernels {
namespace {

constexpr int64_t kPanel = 16;     // weight rows per panel
constexpr int64_t kBlockBytes = 256;  // one block of 32 weights of the panel's 16 rows
constexpr int kPanelRowsA = 4;     // rows of A per pass
// How far ahead (bytes of the panel stream) the first pass over a panel prefetches.
constexpr int64_t kPrefetchBytes = 4096;

int64_t scale_bytes(bool f16_scales) { return kPanel * (f16_scales ? 2 : 4); }

// The quantized rows of A: q [M][K] (natural order), d16 (the blocks' d / 16) and init (-8 times
// the blocks' sums of q) [M][K / 32].
struct PanelRows {
  const int8_t* q = nullptr;
  const float* d16 = nullptr;
  const int32_t* init = nullptr;
};

thread_local detail::ScratchBuffer t_panel_rows;

TPU_VNNI PanelRows quantize_rows(int64_t M, int64_t K, const float* A, int64_t lda) {
  const int64_t nb = K / 32;
  const size_t qbytes = static_cast<size_t>(M * K), lanes = static_cast<size_t>(M * nb);
  auto* base = static_cast<uint8_t*>(t_panel_rows.get(qbytes + lanes * 8 + 64));
  auto* q = reinterpret_cast<int8_t*>(base);
  auto* d = reinterpret_cast<float*>(base + (qbytes + 63) / 64 * 64);
  auto* init = reinterpret_cast<int32_t*>(d + lanes);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t b = 0; b < nb; ++b) {
      const float* a = A + i * lda + b * 32;
      const __m512 x0 = _mm512_loadu_ps(a), x1 = _mm512_loadu_ps(a + 16);
      float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
      // A NaN makes the block's scale NaN, and so every output it touches.
      if (_mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q)) amax = __builtin_nanf("");
      const float id = amax > 0 && amax <= 3.4e38f ? 127.0f / amax : 0.0f;
      const __m512 vid = _mm512_set1_ps(id);
      const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)), i1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid));
      const __m128i q0 = _mm512_cvtsepi32_epi8(i0), q1 = _mm512_cvtsepi32_epi8(i1);
      int8_t* qd = q + i * K + b * 32;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qd), q0);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qd + 16), q1);
      const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_cvtepi8_epi32(q0), _mm512_cvtepi8_epi32(q1)));
      d[i * nb + b] = amax / 127.0f / 16.0f;
      init[i * nb + b] = -8 * sum;
    }
  return {q, d, init};
}

TPU_VNNI __attribute__((always_inline)) inline __m512 load_scales16(const uint8_t* p, bool f16_scales) {
  return f16_scales ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))
                    : _mm512_loadu_ps(reinterpret_cast<const float*>(p));
}

TPU_VNNI __attribute__((always_inline)) inline __m512i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// R rows of A (from row i0) by one panel P; C's columns [0, cols).
template <int R, bool F16, bool Prefetch>
TPU_VNNI void panel_rows(int64_t K, int64_t group, const uint8_t* P, const PanelRows& v, int64_t i0, int cols,
                         float* C, int64_t ldc) {
  const int64_t nb = K / 32, bpg = group / 32, groups = K / group;
  const __m512i low4 = _mm512_set1_epi8(0x0F), high4 = _mm512_set1_epi8(static_cast<char>(0xF0));
  __m512 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const uint8_t* p = P;
  for (int64_t g = 0; g < groups; ++g) {
    const __m512 sv = load_scales16(p, F16);
    p += scale_bytes(F16);
    for (int64_t b = g * bpg; b < (g + 1) * bpg; ++b, p += kBlockBytes) {
      __m512i lo[4], hi[4];
#pragma GCC unroll 4
      for (int s = 0; s < 4; ++s) {
        if (Prefetch) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + 64 * s), _MM_HINT_T0);
        const __m512i raw = _mm512_loadu_si512(p + 64 * s);
        lo[s] = _mm512_and_si512(raw, low4);
        hi[s] = _mm512_and_si512(raw, high4);  // 16 times the high nibbles
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int64_t row = (i0 + r) * nb + b;
        const int8_t* q = v.q + (i0 + r) * K + b * 32;
        // The low nibbles' sums from the offset's start value, times 16, then the high nibbles'
        // (16 times theirs): 16 times the block's exact sum of w q (|.| < 2^21).
        __m512i x = _mm512_set1_epi32(v.init[row]);
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) x = _mm512_dpbusd_epi32(x, lo[s], bcast32(q + 8 * s));
        x = _mm512_slli_epi32(x, 4);
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) x = _mm512_dpbusd_epi32(x, hi[s], bcast32(q + 8 * s + 4));
        // d16: d / 16 (exact), undoing the factor 16.
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), _mm512_mul_ps(sv, _mm512_set1_ps(v.d16[row])), acc[r]);
      }
    }
  }
  const __mmask16 m = static_cast<__mmask16>(cols >= 16 ? 0xffffu : (1u << cols) - 1);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(C + r * ldc, m, acc[r]);
}

template <bool F16>
void run_panels(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* P,
                float* C, int64_t ldc) {
  const PanelRows v = quantize_rows(M, K, A, lda);
  const int64_t panels = (N + kPanel - 1) / kPanel, pbytes = int4_panel_bytes(kPanel, K, group, F16);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 17) / std::max<int64_t>(1, K * M * kPanel));
  const tpu::detail::NextWeight next = tpu::detail::follow_weight(P, static_cast<size_t>(panels * pbytes));
  detail::gemv_for_blocks(panels, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t j = p * kPanel;
      const int cols = static_cast<int>(std::min<int64_t>(kPanel, N - j));
      const uint8_t* panel = P + p * pbytes;
      for (int64_t i = 0; i < M; i += kPanelRowsA) {
        float* out = C + i * ldc + j;
        // Later passes over the panel find it in the cache: no prefetch.
        const bool pf = i == 0;
        switch (std::min<int64_t>(kPanelRowsA, M - i)) {
          case 1: pf ? panel_rows<1, F16, true>(K, group, panel, v, i, cols, out, ldc)
                     : panel_rows<1, F16, false>(K, group, panel, v, i, cols, out, ldc); break;
          case 2: pf ? panel_rows<2, F16, true>(K, group, panel, v, i, cols, out, ldc)
                     : panel_rows<2, F16, false>(K, group, panel, v, i, cols, out, ldc); break;
          case 3: pf ? panel_rows<3, F16, true>(K, group, panel, v, i, cols, out, ldc)
                     : panel_rows<3, F16, false>(K, group, panel, v, i, cols, out, ldc); break;
          default: pf ? panel_rows<4, F16, true>(K, group, panel, v, i, cols, out, ldc)
                      : panel_rows<4, F16, false>(K, group, panel, v, i, cols, out, ldc); break;
        }
      }
    }
  }, next);
}

}  // namespace

bool int4_panel_supported(int64_t K, int64_t group) {
  return K > 0 && group > 0 && group % 32 == 0 && K % group == 0 && int8_vnni_available();
}

int64_t int4_panel_bytes(int64_t N, int64_t K, int64_t group, bool f16_scales) {
  const int64_t panels = (N + kPanel - 1) / kPanel;
  return panels * ((K / group) * scale_bytes(f16_scales) + (K / 32) * kBlockBytes);
}

void int4_pack_panels(int64_t N, int64_t K, int64_t group, const uint8_t* W, Int4Scales scale, uint8_t* P) {
  const int64_t panels = (N + kPanel - 1) / kPanel, groups = K / group, bpg = group / 32;
  const bool f16_scales = scale.is_f16();
  const int64_t pbytes = int4_panel_bytes(kPanel, K, group, f16_scales);
  detail::gemv_for_blocks(panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint8_t* out = P + p * pbytes;
      for (int64_t g = 0; g < groups; ++g) {
        // Rows past N: scale 0 and nibble 8 (weight 0).
        for (int64_t l = 0; l < kPanel; ++l) {
          const int64_t row = p * kPanel + l;
          if (f16_scales) {
            const f16 s = row < N ? scale.half()[row * groups + g] : f16(0.0f);
            std::memcpy(out + l * 2, &s, 2);
          } else {
            const float s = row < N ? scale.f32()[row * groups + g] : 0.0f;
            std::memcpy(out + l * 4, &s, 4);
          }
        }
        out += scale_bytes(f16_scales);
        for (int64_t b = g * bpg; b < (g + 1) * bpg; ++b, out += kBlockBytes)
          for (int64_t l = 0; l < kPanel; ++l) {
            const int64_t row = p * kPanel + l;
            // Canonical: byte i of the block holds weights i (low nibble) and i + 16 (high). Lane
            // l of vector s wants weights 8s..8s+3 low and 8s+4..8s+7 high: from the words
            // w0..w3 of bytes 0-3, 4-7, 8-11, 12-15, their low nibbles (s = 0, 1) or high (2, 3).
            uint32_t w[4] = {0x88888888u, 0x88888888u, 0x88888888u, 0x88888888u};  // past N: zeros
            if (row < N) std::memcpy(w, W + row * (K / 2) + b * 16, 16);
            const uint32_t lo = 0x0F0F0F0Fu, hi = 0xF0F0F0F0u;
            const uint32_t o[4] = {(w[0] & lo) | ((w[1] & lo) << 4), (w[2] & lo) | ((w[3] & lo) << 4),
                                   ((w[0] >> 4) & lo) | (w[1] & hi), ((w[2] >> 4) & lo) | (w[3] & hi)};
            for (int s = 0; s < 4; ++s) std::memcpy(out + 64 * s + 4 * l, &o[s], 4);
          }
      }
    }
  });
}

void gemv_int4_panels(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* P,
                      bool f16_scales, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (f16_scales)
    run_panels<true>(M, N, K, group, A, lda, P, C, ldc);
  else
    run_panels<false>(M, N, K, group, A, lda, P, C, ldc);
}

}  // namespace tpu::kernels

TPU_INTRIN_DIAGNOSTICS_POP
