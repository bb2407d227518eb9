// The host GEMM driver: cache blocking (derived from the detected caches, see
// detail::derive_blocking in gemm.h), packing of A and B panels, threading, and the choice of
// micro-kernel (AVX-512, AVX2 or portable) at run time.
//
// Loop nest per thread (Goto's order): column blocks of B (nc) -> K blocks (kc) -> pack the
// kc x nc block of B into nr-wide panels -> row blocks of A (mc) -> pack the mc x kc block of
// A into mr-tall panels -> micro-kernel over every mr x nr tile. Packing reads A and B
// through their strides, so transposed and strided views cost nothing extra, and it pads
// the ragged edges with zeros so the micro-kernel always sees full panels.
//
// Threads split the rows of C and share each packed B block (packed cooperatively by a team
// of threads that meet at one barrier per block); short wide products split columns and pack
// privately.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/scratch.h"
#include "ops/cpu/kernels/gemv.h"
#include "tpucore/core/batch_invariant.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/half.h"
#include "tpucore/core/parallel.h"

namespace tpu::kernels {
namespace {

using detail::GemmBlocking;

// ---- Per-thread packing buffers (64-byte aligned, grown on demand, kept for reuse). ----

thread_local detail::ScratchBuffer t_pack_a;
thread_local detail::ScratchBuffer t_pack_b;

inline float bf16_to_f32(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// ---- Packing. `kce` counts k elements of the block; the packed layout has
// ceil(kce / kPerStep) k-steps per panel. ----

// f32 in, f32 panels.
struct PackF32 {
  using In = float;
  using Packed = float;
  static constexpr int kPerStep = 1;
  static float value(float v) { return v; }

  static void pack_a(const float* A, int64_t rs, int64_t cs, int64_t mc, int64_t kce, int mr,
                     float* dst) {
    for (int64_t i0 = 0; i0 < mc; i0 += mr) {
      const int rows = static_cast<int>(std::min<int64_t>(mr, mc - i0));
      float* d = dst + i0 * kce;
      if (cs == 1) {  // rows of A are contiguous: read along k
        for (int r = 0; r < rows; ++r) {
          const float* s = A + (i0 + r) * rs;
          for (int64_t k = 0; k < kce; ++k) d[k * mr + r] = s[k];
        }
      } else {
        for (int64_t k = 0; k < kce; ++k) {
          const float* s = A + i0 * rs + k * cs;
          for (int r = 0; r < rows; ++r) d[k * mr + r] = s[r * rs];
        }
      }
      for (int r = rows; r < mr; ++r)
        for (int64_t k = 0; k < kce; ++k) d[k * mr + r] = 0.0f;
    }
  }

  static void pack_b(const float* B, int64_t rs, int64_t cs, int64_t kce, int64_t nc, int nr,
                     float* dst) {
    for (int64_t j0 = 0; j0 < nc; j0 += nr) {
      const int cols = static_cast<int>(std::min<int64_t>(nr, nc - j0));
      float* d = dst + j0 * kce;
      if (cs == 1) {
        for (int64_t k = 0; k < kce; ++k) {
          std::memcpy(d + k * nr, B + k * rs + j0, sizeof(float) * cols);
          for (int c = cols; c < nr; ++c) d[k * nr + c] = 0.0f;
        }
      } else {
        for (int c = 0; c < cols; ++c) {
          const float* s = B + (j0 + c) * cs;
          for (int64_t k = 0; k < kce; ++k) d[k * nr + c] = s[k * rs];
        }
        for (int64_t k = 0; k < kce; ++k)
          for (int c = cols; c < nr; ++c) d[k * nr + c] = 0.0f;
      }
    }
  }
};

// bf16 in, f32 panels (for CPUs without avx512_bf16: the f32 micro-kernels then run on the
// widened values, which is exact since every bf16 is an f32).
struct PackBf16AsF32 {
  using In = uint16_t;
  using Packed = float;
  static constexpr int kPerStep = 1;
  static float value(uint16_t v) { return bf16_to_f32(v); }

  static void pack_a(const uint16_t* A, int64_t rs, int64_t cs, int64_t mc, int64_t kce,
                     int mr, float* dst) {
    for (int64_t i0 = 0; i0 < mc; i0 += mr) {
      const int rows = static_cast<int>(std::min<int64_t>(mr, mc - i0));
      float* d = dst + i0 * kce;
      for (int r = 0; r < rows; ++r) {
        const uint16_t* s = A + (i0 + r) * rs;
        for (int64_t k = 0; k < kce; ++k) d[k * mr + r] = bf16_to_f32(s[k * cs]);
      }
      for (int r = rows; r < mr; ++r)
        for (int64_t k = 0; k < kce; ++k) d[k * mr + r] = 0.0f;
    }
  }

  static void pack_b(const uint16_t* B, int64_t rs, int64_t cs, int64_t kce, int64_t nc,
                     int nr, float* dst) {
    for (int64_t j0 = 0; j0 < nc; j0 += nr) {
      const int cols = static_cast<int>(std::min<int64_t>(nr, nc - j0));
      float* d = dst + j0 * kce;
      for (int64_t k = 0; k < kce; ++k) {
        const uint16_t* s = B + k * rs + j0 * cs;
        for (int c = 0; c < cols; ++c) d[k * nr + c] = bf16_to_f32(s[c * cs]);
        for (int c = cols; c < nr; ++c) d[k * nr + c] = 0.0f;
      }
    }
  }
};

// bf16 in, panels of bf16 pairs along K (what vdpbf16ps multiplies): the low half of each
// 32-bit value is the even k, the high half the odd k (zero past the end of K).
struct PackBf16Pairs {
  using In = uint16_t;
  using Packed = uint32_t;
  static constexpr int kPerStep = 2;
  static float value(uint16_t v) { return bf16_to_f32(v); }

  static uint32_t pair(uint16_t lo, uint16_t hi) {
    return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }

  static void pack_a(const uint16_t* A, int64_t rs, int64_t cs, int64_t mc, int64_t kce,
                     int mr, uint32_t* dst) {
    const int64_t kp = (kce + 1) / 2, kfull = kce / 2;
    for (int64_t i0 = 0; i0 < mc; i0 += mr) {
      const int rows = static_cast<int>(std::min<int64_t>(mr, mc - i0));
      uint32_t* d = dst + i0 * kp;
      for (int r = 0; r < rows; ++r) {
        const uint16_t* s = A + (i0 + r) * rs;
        if (cs == 1) {
          for (int64_t p = 0; p < kfull; ++p) d[p * mr + r] = pair(s[2 * p], s[2 * p + 1]);
        } else {
          for (int64_t p = 0; p < kfull; ++p)
            d[p * mr + r] = pair(s[2 * p * cs], s[(2 * p + 1) * cs]);
        }
        if (kp > kfull) d[kfull * mr + r] = pair(s[2 * kfull * cs], 0);
      }
      for (int r = rows; r < mr; ++r)
        for (int64_t p = 0; p < kp; ++p) d[p * mr + r] = 0;
    }
  }

  static void pack_b(const uint16_t* B, int64_t rs, int64_t cs, int64_t kce, int64_t nc,
                     int nr, uint32_t* dst) {
    const int64_t kp = (kce + 1) / 2;
    for (int64_t j0 = 0; j0 < nc; j0 += nr) {
      const int cols = static_cast<int>(std::min<int64_t>(nr, nc - j0));
      uint32_t* d = dst + j0 * kp;
      for (int64_t p = 0; p < kp; ++p) {
        const uint16_t* s0 = B + 2 * p * rs + j0 * cs;
        uint32_t* dp = d + p * nr;
        if (2 * p + 1 < kce) {
          const uint16_t* s1 = s0 + rs;
          if (cs == 1) {
            for (int c = 0; c < cols; ++c) dp[c] = pair(s0[c], s1[c]);
          } else {
            for (int c = 0; c < cols; ++c) dp[c] = pair(s0[c * cs], s1[c * cs]);
          }
        } else {
          for (int c = 0; c < cols; ++c) dp[c] = pair(s0[c * cs], 0);
        }
        for (int c = cols; c < nr; ++c) dp[c] = 0;
      }
    }
  }
};

// The same layouts, with the A panels of K-contiguous rows transposed by AVX-512 code.
// B = W^T (columns contiguous along K), 32-wide panels: each panel as two 16-column halves packed by
// `half` (the AVX2 8 x 8 transposes; every AVX-512 CPU has AVX2), for f32 and f16 weights alike.
// False, packing nothing, for any other layout or panel width.
template <class T>
bool pack_b_wt_halves(const T* B, int64_t rs, int64_t cs, int64_t kce, int64_t nc, int nr, float* dst,
                      void (*half)(const T*, int64_t, int, int64_t, float*, int64_t)) {
  if (rs != 1 || cs == 1 || nr != 32) return false;
  for (int64_t j0 = 0; j0 < nc; j0 += nr) {
    const int cols = static_cast<int>(std::min<int64_t>(nr, nc - j0));
    float* d = dst + j0 * kce;
    half(B + j0 * cs, cs, std::min(cols, 16), kce, d, 32);
    half(cols > 16 ? B + (j0 + 16) * cs : B, cs, std::max(cols - 16, 0), kce, d + 16, 32);
  }
  return true;
}

struct PackF32Avx512 : PackF32 {
  static void pack_a(const float* A, int64_t rs, int64_t cs, int64_t mc, int64_t kce, int mr,
                     float* dst) {
    if (cs != 1 || mr != detail::kAvx512BlockingF32.mr) return PackF32::pack_a(A, rs, cs, mc, kce, mr, dst);
    for (int64_t i0 = 0; i0 < mc; i0 += mr) {
      const int rows = static_cast<int>(std::min<int64_t>(mr, mc - i0));
      detail::pack_a_panel_words_avx512(A + i0 * rs, rs * int64_t(sizeof(float)), rows, kce,
                                        reinterpret_cast<uint32_t*>(dst + i0 * kce));
    }
  }
  // Columns contiguous along K (B = W^T of a linear layer): each 32-wide panel as two 16-column
  // halves by the AVX2 8 x 8 transposes (every AVX-512 CPU has AVX2).
  static void pack_b(const float* B, int64_t rs, int64_t cs, int64_t kce, int64_t nc, int nr, float* dst) {
    if (!pack_b_wt_halves(B, rs, cs, kce, nc, nr, dst, detail::pack_b_half_panel_f32_avx2))
      PackF32::pack_b(B, rs, cs, kce, nc, nr, dst);
  }
};

struct PackF32Avx2 : PackF32 {
  static void pack_a(const float* A, int64_t rs, int64_t cs, int64_t mc, int64_t kce, int mr,
                     float* dst) {
    if (cs != 1 || mr != detail::kAvx2BlockingF32.mr) return PackF32::pack_a(A, rs, cs, mc, kce, mr, dst);
    for (int64_t i0 = 0; i0 < mc; i0 += mr) {
      const int rows = static_cast<int>(std::min<int64_t>(mr, mc - i0));
      detail::pack_a_panel_f32_avx2(A + i0 * rs, rs, rows, kce, dst + i0 * kce);
    }
  }
  static void pack_b(const float* B, int64_t rs, int64_t cs, int64_t kce, int64_t nc, int nr,
                     float* dst) {
    if ((cs != 1 && rs != 1) || nr != detail::kAvx2BlockingF32.nr) return PackF32::pack_b(B, rs, cs, kce, nc, nr, dst);
    for (int64_t j0 = 0; j0 < nc; j0 += nr) {
      const int cols = static_cast<int>(std::min<int64_t>(nr, nc - j0));
      if (cs == 1) detail::pack_b_panel_rows_f32_avx2(B + j0, rs, cols, kce, dst + j0 * kce);
      else detail::pack_b_panel_f32_avx2(B + j0 * cs, cs, cols, kce, dst + j0 * kce);
    }
  }
};

struct PackBf16AsF32Avx2 : PackBf16AsF32 {
  static void pack_a(const uint16_t* A, int64_t rs, int64_t cs, int64_t mc, int64_t kce, int mr,
                     float* dst) {
    if (cs != 1 || mr != detail::kAvx2BlockingF32.mr) return PackBf16AsF32::pack_a(A, rs, cs, mc, kce, mr, dst);
    for (int64_t i0 = 0; i0 < mc; i0 += mr)
      detail::pack_a_panel_bf16_avx2(A + i0 * rs, rs, static_cast<int>(std::min<int64_t>(mr, mc - i0)),
                                     kce, dst + i0 * kce);
  }
  static void pack_b(const uint16_t* B, int64_t rs, int64_t cs, int64_t kce, int64_t nc, int nr,
                     float* dst) {
    if ((cs != 1 && rs != 1) || nr != detail::kAvx2BlockingF32.nr) return PackBf16AsF32::pack_b(B, rs, cs, kce, nc, nr, dst);
    for (int64_t j0 = 0; j0 < nc; j0 += nr)
      detail::pack_b_panel_bf16_avx2(B + j0 * cs, rs, cs, static_cast<int>(std::min<int64_t>(nr, nc - j0)),
                                     kce, dst + j0 * kce);
  }
};

// bf16 widened to f32 for the AVX-512 f32 kernel (CPUs without avx512_bf16): B = W^T packed by
// the AVX2 transposes, 32-wide panels as two 16-column halves; other layouts as the portable packer.
struct PackBf16AsF32Avx512 : PackBf16AsF32 {
  static void pack_b(const uint16_t* B, int64_t rs, int64_t cs, int64_t kce, int64_t nc, int nr, float* dst) {
    if (!pack_b_wt_halves(B, rs, cs, kce, nc, nr, dst, detail::pack_b_half_panel_bf16_avx2))
      PackBf16AsF32::pack_b(B, rs, cs, kce, nc, nr, dst);
  }
};

struct PackBf16PairsAvx512 : PackBf16Pairs {
  static void pack_a(const uint16_t* A, int64_t rs, int64_t cs, int64_t mc, int64_t kce,
                     int mr, uint32_t* dst) {
    if (cs != 1 || mr != detail::kAvx512BlockingBf16.mr)
      return PackBf16Pairs::pack_a(A, rs, cs, mc, kce, mr, dst);
    const int64_t kp = (kce + 1) / 2, kfull = kce / 2;
    for (int64_t i0 = 0; i0 < mc; i0 += mr) {
      const int rows = static_cast<int>(std::min<int64_t>(mr, mc - i0));
      uint32_t* d = dst + i0 * kp;
      // Whole pairs are the 32-bit words of each row; an odd last k is paired with zero.
      detail::pack_a_panel_words_avx512(A + i0 * rs, rs * int64_t(sizeof(uint16_t)), rows,
                                        kfull, d);
      if (kp > kfull)
        for (int r = 0; r < mr; ++r)
          d[kfull * mr + r] = r < rows ? pair(A[(i0 + r) * rs + 2 * kfull], 0) : 0;
    }
  }
  static void pack_b(const uint16_t* B, int64_t rs, int64_t cs, int64_t kce, int64_t nc,
                     int nr, uint32_t* dst) {
    if ((cs != 1 && rs != 1) || nr != detail::kAvx512BlockingBf16.nr)
      return PackBf16Pairs::pack_b(B, rs, cs, kce, nc, nr, dst);
    const int64_t kp = (kce + 1) / 2;
    if (cs != 1) {  // columns contiguous along K (B = W^T of a linear layer)
      for (int64_t j0 = 0; j0 < nc; j0 += nr)
        detail::pack_b_panel_bf16_pairs_transposed_avx512(B + j0 * cs, cs, static_cast<int>(std::min<int64_t>(nr, nc - j0)),
                                                          kce, dst + j0 * kp);
      return;
    }
    for (int64_t j0 = 0; j0 < nc; j0 += 2 * nr)  // two panels per pass
      detail::pack_b_panels_bf16_pairs_avx512(B + j0, rs, static_cast<int>(std::min<int64_t>(2 * nr, nc - j0)),
                                              kce, dst + j0 * kp, kp * nr);
  }
};

// f32 A, IEEE f16 B (raw bits; gemm_f16's weight), f32 panels: B is widened exactly while it
// is packed, so no f32 copy of the weight is ever made. InB names B's element type (the trait
// BSide below).
struct PackF32F16 : PackF32 {
  using InB = uint16_t;
  static float value_b(uint16_t v) { return f16::from_bits(v).to_f32(); }
  static void pack_b(const uint16_t* B, int64_t rs, int64_t cs, int64_t kce, int64_t nc, int nr, float* dst) {
    for (int64_t j0 = 0; j0 < nc; j0 += nr) {
      const int cols = static_cast<int>(std::min<int64_t>(nr, nc - j0));
      float* d = dst + j0 * kce;
      for (int64_t k = 0; k < kce; ++k)
        for (int c = 0; c < nr; ++c) d[k * nr + c] = c < cols ? value_b(B[k * rs + (j0 + c) * cs]) : 0.0f;
    }
  }
};

struct PackF32F16Avx512 : PackF32F16 {
  static void pack_a(const float* A, int64_t rs, int64_t cs, int64_t mc, int64_t kce, int mr, float* dst) {
    PackF32Avx512::pack_a(A, rs, cs, mc, kce, mr, dst);
  }
  // B = W^T (columns contiguous along K): each 32-wide panel as two 16-column halves.
  static void pack_b(const uint16_t* B, int64_t rs, int64_t cs, int64_t kce, int64_t nc, int nr, float* dst) {
    if (!pack_b_wt_halves(B, rs, cs, kce, nc, nr, dst, detail::pack_b_half_panel_f16_avx2))
      PackF32F16::pack_b(B, rs, cs, kce, nc, nr, dst);
  }
};

struct PackF32F16Avx2 : PackF32F16 {
  static void pack_a(const float* A, int64_t rs, int64_t cs, int64_t mc, int64_t kce, int mr, float* dst) {
    PackF32Avx2::pack_a(A, rs, cs, mc, kce, mr, dst);
  }
  static void pack_b(const uint16_t* B, int64_t rs, int64_t cs, int64_t kce, int64_t nc, int nr, float* dst) {
    if (rs != 1 || cs == 1 || nr != detail::kAvx2BlockingF32.nr) return PackF32F16::pack_b(B, rs, cs, kce, nc, nr, dst);
    for (int64_t j0 = 0; j0 < nc; j0 += nr)
      detail::pack_b_panel_f16_avx2(B + j0 * cs, cs, static_cast<int>(std::min<int64_t>(nr, nc - j0)), kce,
                                    dst + j0 * kce);
  }
};

// B's element type and value of a packer: In and value, unless it names InB and value_b.
template <class Pack, class = void>
struct BSide {
  using type = typename Pack::In;
  static float value(type v) { return Pack::value(v); }
};
template <class Pack>
struct BSide<Pack, std::void_t<typename Pack::InB>> {
  using type = typename Pack::InB;
  static float value(type v) { return Pack::value_b(v); }
};

// ---- Portable micro-kernel (auto-vectorized for the baseline ISA). ----
// 6 x 8: twelve 4-lane accumulators fit the 16 vector registers of baseline x86-64.

constexpr int kGenericMR = 6;
constexpr int kGenericNR = 8;
const GemmBlocking kGenericBlocking = {kGenericMR, kGenericNR, 120, 256, 2048};

void micro_kernel_f32_generic(int64_t kc, const float* Ap, const float* Bp, float* C,
                              int64_t ldc, int rows, int cols, bool load_c) {
  float acc[kGenericMR][kGenericNR] = {};
  for (int64_t k = 0; k < kc; ++k) {
    const float* a = Ap + k * kGenericMR;
    const float* b = Bp + k * kGenericNR;
    for (int r = 0; r < kGenericMR; ++r)
      for (int c = 0; c < kGenericNR; ++c) acc[r][c] += a[r] * b[c];
  }
  for (int r = 0; r < rows; ++r) {
    float* crow = C + r * ldc;
    if (load_c) {
      for (int c = 0; c < cols; ++c) crow[c] += acc[r][c];
    } else {
      for (int c = 0; c < cols; ++c) crow[c] = acc[r][c];
    }
  }
}

// ---- Driver. ----

struct Problem {
  int64_t M, N, K;
  const void* A;
  int64_t a_rs, a_cs;
  const void* B;
  int64_t b_rs, b_cs;
  float* C;
  int64_t ldc;
  bool accumulate;
};

template <class Pack>
int64_t ksteps_of(int64_t kce) {
  return (kce + Pack::kPerStep - 1) / Pack::kPerStep;
}

// Packed A scratch of the calling thread, large enough for any row block of this problem.
template <class Pack>
typename Pack::Packed* a_buffer(const Problem& p, const GemmBlocking& bl, int64_t rows) {
  const int64_t mc = std::min<int64_t>(bl.mc, (rows + bl.mr - 1) / bl.mr * bl.mr);
  const int64_t ks = std::min<int64_t>(bl.kc, ksteps_of<Pack>(p.K));
  return static_cast<typename Pack::Packed*>(
      t_pack_a.get(sizeof(typename Pack::Packed) * static_cast<size_t>((mc + bl.mr) * ks)));
}

// Packed B scratch of the calling thread for column blocks of up to `cols` columns.
template <class Pack>
typename Pack::Packed* b_buffer(const Problem& p, const GemmBlocking& bl, int64_t cols) {
  const int64_t nc = std::min<int64_t>(bl.nc, (cols + bl.nr - 1) / bl.nr * bl.nr);
  const int64_t ks = std::min<int64_t>(bl.kc, ksteps_of<Pack>(p.K));
  return static_cast<typename Pack::Packed*>(
      t_pack_b.get(sizeof(typename Pack::Packed) * static_cast<size_t>((nc + bl.nr) * ks)));
}

// Packs columns [j0, j0 + cols) of the K block [pc, pc + kce) into the nr-wide panels of
// the B block that starts at column jc (panel q at pb + q * nr * ksteps; j0 - jc is a
// multiple of nr).
template <class Pack>
void pack_b_block(const Problem& p, const GemmBlocking& bl, int64_t pc, int64_t kce,
                  int64_t jc, int64_t j0, int64_t cols, typename Pack::Packed* pb) {
  const auto* B = static_cast<const typename BSide<Pack>::type*>(p.B);
  Pack::pack_b(B + pc * p.b_rs + j0 * p.b_cs, p.b_rs, p.b_cs, kce, cols, bl.nr,
               pb + (j0 - jc) * ksteps_of<Pack>(kce));
}

// C[m0:m1, jc:jc+nc] (+)= A[m0:m1, pc:pc+kce] * (the packed B block pb).
template <class Pack, class Kernel>
void multiply_rows(const Problem& p, const GemmBlocking& bl, Kernel kernel, int64_t m0,
                   int64_t m1, int64_t jc, int64_t nc, int64_t pc, int64_t kce,
                   const typename Pack::Packed* pb, typename Pack::Packed* pa) {
  using Packed = typename Pack::Packed;
  const auto* A = static_cast<const typename Pack::In*>(p.A);
  const int mr = bl.mr, nr = bl.nr;
  const int64_t ksteps = ksteps_of<Pack>(kce);
  const bool load_c = p.accumulate || pc > 0;
  for (int64_t ic = m0; ic < m1; ic += bl.mc) {
    const int64_t mc = std::min(bl.mc, m1 - ic);
    Pack::pack_a(A + ic * p.a_rs + pc * p.a_cs, p.a_rs, p.a_cs, mc, kce, mr, pa);
    for (int64_t jr = 0; jr < nc; jr += nr) {
      const int cols = static_cast<int>(std::min<int64_t>(nr, nc - jr));
      const Packed* bp = pb + jr * ksteps;
      float* cblock = p.C + ic * p.ldc + jc + jr;
      for (int64_t ir = 0; ir < mc; ir += mr) {
        const int rows = static_cast<int>(std::min<int64_t>(mr, mc - ir));
        kernel(ksteps, pa + ir * ksteps, bp, cblock + ir * p.ldc, p.ldc, rows, cols, load_c);
      }
    }
  }
}

// Computes C[m0:m1, n0:n1] on the calling thread with its own packed panels.
template <class Pack, class Kernel>
void gemm_range(const Problem& p, const GemmBlocking& bl, Kernel kernel, int64_t m0,
                int64_t m1, int64_t n0, int64_t n1) {
  const int64_t kc_elems = bl.kc * Pack::kPerStep;
  auto* pb = b_buffer<Pack>(p, bl, n1 - n0);
  auto* pa = a_buffer<Pack>(p, bl, m1 - m0);
  for (int64_t jc = n0; jc < n1; jc += bl.nc) {
    const int64_t nc = std::min(bl.nc, n1 - jc);
    for (int64_t pc = 0; pc < p.K; pc += kc_elems) {
      const int64_t kce = std::min(kc_elems, p.K - pc);
      pack_b_block<Pack>(p, bl, pc, kce, jc, jc, nc, pb);
      multiply_rows<Pack>(p, bl, kernel, m0, m1, jc, nc, pc, kce, pb, pa);
    }
  }
}

// Rows of C split over a team of threads (tpu::parallel_team: one dispatch per product) that
// share each packed B block: per block, every thread packs its share of the block's panels,
// the team meets at a barrier, then each thread multiplies its own rows by the whole block.
// The B blocks alternate between two buffers, so one barrier per block suffices: a thread
// packs block i + 1 only after passing barrier i, which every thread reaches only after it
// has multiplied block i - 1 (the block that buffer held). Rows are split in whole register
// tiles. A product of a single B block skips the sharing (see below).
template <class Pack, class Kernel>
void gemm_rows_shared_b(const Problem& p, const GemmBlocking& bl, Kernel kernel, int want) {
  using Packed = typename Pack::Packed;
  const int64_t kc_elems = bl.kc * Pack::kPerStep;
  const int64_t ncap = std::min<int64_t>(bl.nc, (p.N + bl.nr - 1) / bl.nr * bl.nr);
  const int64_t block_size = (ncap + bl.nr) * std::min<int64_t>(bl.kc, ksteps_of<Pack>(p.K));
  const bool one_block = p.N <= bl.nc && p.K <= kc_elems;
  Packed* pb_base = one_block ? nullptr : static_cast<Packed*>(t_pack_b.get(sizeof(Packed) * static_cast<size_t>(2 * block_size)));
  std::atomic<bool> failed{false};
  tpu::parallel_team(want, [&](int t, int team, Barrier& bar) {
    const int64_t units = (p.M + bl.mr - 1) / bl.mr;
    const int64_t m0 = std::min(p.M, units * t / team * bl.mr);
    const int64_t m1 = std::min(p.M, units * (t + 1) / team * bl.mr);
    if (one_block) {
      // A single B block: each thread packs it whole into its own buffer and needs no
      // barrier (with vectorized packing, cheaper than a wait for the other thread).
      if (m0 < m1) gemm_range<Pack>(p, bl, kernel, m0, m1, 0, p.N);
      return;
    }
    Packed* pa = nullptr;
    try {
      pa = a_buffer<Pack>(p, bl, std::max<int64_t>(m1 - m0, 1));
    } catch (...) {  // the others must not wait for this thread at the barriers
      failed.store(true);
      bar.arrive_and_wait();
      throw;
    }
    int64_t block = 0;
    for (int64_t jc = 0; jc < p.N; jc += bl.nc) {
      const int64_t nc = std::min(bl.nc, p.N - jc);
      const int64_t panels = (nc + bl.nr - 1) / bl.nr;
      for (int64_t pc = 0; pc < p.K; pc += kc_elems, ++block) {
        const int64_t kce = std::min(kc_elems, p.K - pc);
        Packed* pb = pb_base + (block % 2) * block_size;
        const int64_t q0 = panels * t / team, q1 = panels * (t + 1) / team;
        const int64_t j0 = jc + q0 * bl.nr, j1 = std::min(jc + nc, jc + q1 * bl.nr);
        if (j0 < j1) pack_b_block<Pack>(p, bl, pc, kce, jc, j0, j1 - j0, pb);
        bar.arrive_and_wait();
        if (failed.load()) return;  // a thread could not allocate: it throws, the others stop
        if (m0 < m1) multiply_rows<Pack>(p, bl, kernel, m0, m1, jc, nc, pc, kce, pb, pa);
      }
    }
  });
}

// Few rows in batch-invariant mode when B is not W^T (x W^T takes the broadcast kernels of
// gemv.h, gemv_chain_*): the same packing, micro-kernel and K blocking as
// gemm_range (so every output is summed in exactly the same order), but A is packed once for
// all of K and B one nr-wide panel at a time into a buffer that stays in the L1d, consumed at
// once: B (the weight) is read from memory once, as by the GEMV kernels, instead of being
// packed into an L2-sized block and read back. Column panels [n0, n1) of C (n0 a multiple of nr
// past the first column); `pa` is A packed by pack_a_all.
template <class Pack>
int64_t a_all_stride(const GemmBlocking& bl, int64_t M) {
  return ((M + bl.mr - 1) / bl.mr * bl.mr + bl.mr) * bl.kc;
}

template <class Pack>
void pack_a_all(const Problem& p, const GemmBlocking& bl, typename Pack::Packed* pa) {
  const auto* A = static_cast<const typename Pack::In*>(p.A);
  const int64_t kc_elems = bl.kc * Pack::kPerStep, stride = a_all_stride<Pack>(bl, p.M);
  for (int64_t pc = 0, b = 0; pc < p.K; pc += kc_elems, ++b)
    Pack::pack_a(A + pc * p.a_cs, p.a_rs, p.a_cs, p.M, std::min(kc_elems, p.K - pc), bl.mr, pa + b * stride);
}

template <class Pack, class Kernel>
void few_rows_panels(const Problem& p, const GemmBlocking& bl, Kernel kernel, const typename Pack::Packed* pa,
                     int64_t n0, int64_t n1) {
  using Packed = typename Pack::Packed;
  const auto* B = static_cast<const typename BSide<Pack>::type*>(p.B);
  const int64_t kc_elems = bl.kc * Pack::kPerStep, stride = a_all_stride<Pack>(bl, p.M);
  auto* pb = static_cast<Packed*>(t_pack_b.get(sizeof(Packed) * static_cast<size_t>(2 * bl.nr * bl.kc)));
  for (int64_t jr = n0; jr < n1; jr += bl.nr) {
    const int cols = static_cast<int>(std::min<int64_t>(bl.nr, n1 - jr));
    for (int64_t pc = 0, b = 0; pc < p.K; pc += kc_elems, ++b) {
      const int64_t kce = std::min(kc_elems, p.K - pc), ksteps = ksteps_of<Pack>(kce);
      Pack::pack_b(B + pc * p.b_rs + jr * p.b_cs, p.b_rs, p.b_cs, kce, cols, bl.nr, pb);
      const bool load_c = p.accumulate || pc > 0;
      for (int64_t ir = 0; ir < p.M; ir += bl.mr) {
        const int rows = static_cast<int>(std::min<int64_t>(bl.mr, p.M - ir));
        kernel(ksteps, pa + b * stride + ir * ksteps, pb, p.C + ir * p.ldc + jr, p.ldc, rows, cols, load_c);
      }
    }
  }
}

// C's columns in whole register tiles over up to `want` pool tasks: run(lo, hi) per task
// (on the calling thread alone when one task suffices).
template <class Run>
void split_columns(const Problem& p, const GemmBlocking& bl, int64_t want, Run run) {
  const int64_t units = (p.N + bl.nr - 1) / bl.nr;
  const int64_t tasks = std::min<int64_t>(want, units);
  if (tasks <= 1) {
    run(int64_t{0}, p.N);
    return;
  }
  tpu::parallel_for(0, tasks, 1, [&](int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t) {
      const int64_t lo = std::min(p.N, units * t / tasks * bl.nr), hi = std::min(p.N, units * (t + 1) / tasks * bl.nr);
      if (lo < hi) run(lo, hi);
    }
  });
}

// Below this many multiply-adds a product stays on the calling thread (about 10 us of work
// on one AVX-512 core, where a thread hand-off starts to pay for itself).
constexpr int64_t kParallelMacs = int64_t{1} << 20;
// Up to this many multiply-adds, plain loops beat packing.
constexpr int64_t kDirectMacs = 512;

// Tiny products: direct loops through the strides, no packing.
template <class Pack>
void gemm_direct(const Problem& p) {
  using In = typename Pack::In;
  using InB = typename BSide<Pack>::type;
  const In* A = static_cast<const In*>(p.A);
  const InB* B = static_cast<const InB*>(p.B);
  for (int64_t i = 0; i < p.M; ++i) {
    float* c = p.C + i * p.ldc;
    for (int64_t j = 0; j < p.N; ++j) {
      float acc = 0.0f;
      for (int64_t k = 0; k < p.K; ++k)
        acc += Pack::value(A[i * p.a_rs + k * p.a_cs]) * BSide<Pack>::value(B[k * p.b_rs + j * p.b_cs]);
      c[j] = p.accumulate ? c[j] + acc : acc;
    }
  }
}

template <class Pack, class Kernel>
void gemm_run(const Problem& p, const GemmBlocking& bl, Kernel kernel) {
  if (p.M <= 0 || p.N <= 0) return;
  if (p.K <= 0) {
    if (!p.accumulate)
      for (int64_t i = 0; i < p.M; ++i) std::fill(p.C + i * p.ldc, p.C + i * p.ldc + p.N, 0.0f);
    return;
  }
  const int64_t macs = p.M * p.N * p.K;
  // Batch-invariant mode: no direct loops (their order differs from the micro-kernel's), so a
  // row's sum does not depend on how many rows share the product.
  if (macs <= kDirectMacs && !batch_invariant()) {
    gemm_direct<Pack>(p);
    return;
  }
  const int nt = tpu::num_threads();
  if (batch_invariant() && p.M <= 2 * int64_t{bl.mr}) {
    using Packed = typename Pack::Packed;
    const int64_t blocks = (p.K + bl.kc * Pack::kPerStep - 1) / (bl.kc * Pack::kPerStep);
    auto* pa = static_cast<Packed*>(t_pack_a.get(sizeof(Packed) * static_cast<size_t>(a_all_stride<Pack>(bl, p.M) * blocks)));
    pack_a_all<Pack>(p, bl, pa);
    split_columns(p, bl, nt <= 1 || macs < kParallelMacs ? 1 : nt,
                  [&](int64_t lo, int64_t hi) { few_rows_panels<Pack>(p, bl, kernel, pa, lo, hi); });
    return;
  }
  if (nt <= 1 || macs < kParallelMacs) {
    gemm_range<Pack>(p, bl, kernel, 0, p.M, 0, p.N);
    return;
  }
  // Rows of C are split evenly over the threads, which share the packed B blocks. When C
  // is wide and short, columns are split instead (in whole register tiles), each thread
  // packing its own panels (repeating the packing of the small A).
  if (p.M >= p.N || p.M >= int64_t{nt} * 4 * bl.mr) {
    gemm_rows_shared_b<Pack>(p, bl, kernel, static_cast<int>(std::min<int64_t>(nt, (p.M + bl.mr - 1) / bl.mr)));
    return;
  }
  split_columns(p, bl, nt, [&](int64_t lo, int64_t hi) { gemm_range<Pack>(p, bl, kernel, 0, p.M, lo, hi); });
}

// Register tiles with the cache blocking of this CPU.
GemmBlocking with_caches(const GemmBlocking& tile, double l1d_panel = 1.0) {
  const CpuCaches& c = cpu_caches();
  return detail::derive_blocking(tile.mr, tile.nr, 4, c.l1d, c.l2, c.l3, l1d_panel);
}
const GemmBlocking& blocking_avx512_f32() {
  static const GemmBlocking b = with_caches(detail::kAvx512BlockingF32, detail::kAvx512L1dPanel);
  return b;
}
const GemmBlocking& blocking_avx512_bf16() {
  static const GemmBlocking b = with_caches(detail::kAvx512BlockingBf16, detail::kAvx512L1dPanel);
  return b;
}
const GemmBlocking& blocking_avx2() {
  static const GemmBlocking b = with_caches(detail::kAvx2BlockingF32, detail::kAvx2L1dPanel);
  return b;
}
const GemmBlocking& blocking_generic() {
  static const GemmBlocking b = with_caches(kGenericBlocking);
  return b;
}

bool have_avx512() {
  const CpuFeatures& f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.fma;
}
bool have_avx512_bf16() { return have_avx512() && cpu_features().avx512_bf16; }
bool have_avx2() { return cpu_features().avx2 && cpu_features().fma; }

}  // namespace

void gemm_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs,
              const float* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc,
              bool accumulate) {
  // Few rows of x W^T by the GEMV kernels, unless batch-invariant (their sum order differs).
  if (!batch_invariant() && gemv_f32(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate)) return;
  // Batch-invariant: few rows of x W^T by the broadcast kernel in the micro-kernel's order.
  if (batch_invariant() &&
      (have_avx512() ? gemv_chain_f32(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate, blocking_avx512_f32().kc)
                     : have_avx2() && gemv_chain_f32_avx2(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate,
                                                          blocking_avx2().kc)))
    return;
  const Problem p{M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate};
  if (have_avx512())
    gemm_run<PackF32Avx512>(p, blocking_avx512_f32(), detail::micro_kernel_f32_avx512);
  else if (have_avx2())
    gemm_run<PackF32Avx2>(p, blocking_avx2(), detail::micro_kernel_f32_avx2);
  else
    gemm_run<PackF32>(p, blocking_generic(), micro_kernel_f32_generic);
}

void gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs,
               int64_t a_cs, const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C,
               int64_t ldc, bool accumulate) {
  const bool invariant = batch_invariant();
  // AMX with the weight read in place: 2 to kAmxWeightInPlaceMaxRows rows of x W^T (one row stays
  // with the GEMV kernel); not batch-invariant.
  if (!invariant && M >= 2 && M <= kAmxWeightInPlaceMaxRows &&
      gemm_bf16_amx_wt(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate))
    return;
  if (!invariant && gemv_bf16(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate)) return;  // few rows, W^T
  // AMX tiles: from 16 rows (a tile's height) and one K step of 32 on; not batch-invariant.
  if (!invariant && M >= 16 && K >= 32 && gemm_bf16_amx(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate)) return;
  // Batch-invariant: few rows of x W^T by the broadcast kernels in the micro-kernel's order.
  if (invariant && (have_avx512() ? gemv_chain_bf16(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate,
                                                    have_avx512_bf16() ? blocking_avx512_bf16().kc : blocking_avx512_f32().kc)
                                  : have_avx2() && gemv_chain_bf16_avx2(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc,
                                                                        accumulate, blocking_avx2().kc)))
    return;
  const Problem p{M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate};
  if (have_avx512_bf16())
    gemm_run<PackBf16PairsAvx512>(p, blocking_avx512_bf16(), detail::micro_kernel_bf16_avx512);
  else if (have_avx512())
    gemm_run<PackBf16AsF32Avx512>(p, blocking_avx512_f32(), detail::micro_kernel_f32_avx512);
  else if (have_avx2())
    gemm_run<PackBf16AsF32Avx2>(p, blocking_avx2(), detail::micro_kernel_f32_avx2);
  else
    gemm_run<PackBf16AsF32>(p, blocking_generic(), micro_kernel_f32_generic);
}

bool gemm_f32a_f16b(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const uint16_t* B,
                    int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate, bool avx2_only) {
  const Problem p{M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate};
  if (have_avx512() && !avx2_only)
    gemm_run<PackF32F16Avx512>(p, blocking_avx512_f32(), detail::micro_kernel_f32_avx512);
  else if (have_avx2())
    gemm_run<PackF32F16Avx2>(p, blocking_avx2(), detail::micro_kernel_f32_avx2);
  else
    return false;
  return true;
}

void gemm_f32_generic(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs,
                      int64_t a_cs, const float* B, int64_t b_rs, int64_t b_cs, float* C,
                      int64_t ldc, bool accumulate) {
  const Problem p{M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate};
  gemm_run<PackF32>(p, blocking_generic(), micro_kernel_f32_generic);
}

void gemm_bf16_generic(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs,
                       int64_t a_cs, const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C,
                       int64_t ldc, bool accumulate) {
  const Problem p{M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate};
  gemm_run<PackBf16AsF32>(p, blocking_generic(), micro_kernel_f32_generic);
}

bool gemm_avx2_available() { return have_avx2(); }

void gemm_f32_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs,
                   const float* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc,
                   bool accumulate) {
  const Problem p{M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate};
  gemm_run<PackF32Avx2>(p, blocking_avx2(), detail::micro_kernel_f32_avx2);
}

void gemm_bf16_avx2(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs,
                    int64_t a_cs, const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C,
                    int64_t ldc, bool accumulate) {
  const Problem p{M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate};
  gemm_run<PackBf16AsF32Avx2>(p, blocking_avx2(), detail::micro_kernel_f32_avx2);
}

namespace detail {

GemmBlocking derive_blocking(int mr, int nr, int64_t step_bytes, int64_t l1d, int64_t l2, int64_t l3,
                             double l1d_panel) {
  if (l1d <= 0) l1d = int64_t{32} << 10;
  if (!(l1d_panel > 0)) l1d_panel = 1.0;
  // The B micro-panel fills this share of the L1d (or this many L1d sizes).
  l1d = static_cast<int64_t>(static_cast<double>(l1d) * l1d_panel);
  if (l2 <= 0) l2 = int64_t{512} << 10;
  const int64_t s = std::max<int64_t>(1, step_bytes);
  auto down = [](int64_t v, int64_t m) { return v / m * m; };
  GemmBlocking b{mr, nr, 0, 0, 0};
  b.kc = std::clamp<int64_t>(down(l1d / (nr * s), 16), 64, 1024);
  const int64_t a_block = static_cast<int64_t>(static_cast<double>(l2 / 2) * std::min(1.0, l1d_panel));
  b.mc = std::clamp<int64_t>(down(a_block / (b.kc * s), mr), mr, int64_t{128} * mr);
  const int64_t outer = l3 > 0 ? l3 : l2;
  b.nc = std::clamp<int64_t>(down(outer / 2 / (b.kc * s), nr), int64_t{4} * nr, std::max<int64_t>(4 * nr, down(4096, nr)));
  return b;
}

const GemmBlocking& gemm_blocking_f32() {
  if (have_avx512()) return blocking_avx512_f32();
  return have_avx2() ? blocking_avx2() : blocking_generic();
}
const GemmBlocking& gemm_blocking_bf16() {
  if (have_avx512_bf16()) return blocking_avx512_bf16();
  return gemm_blocking_f32();
}

}  // namespace detail

const char* gemm_f32_kernel_name() {
  return have_avx512() ? "avx512" : (have_avx2() ? "avx2" : "generic");
}
const char* gemm_bf16_kernel_name() {
  if (gemm_bf16_amx_available()) return "amx_bf16 (avx512_bf16 for one row)";
  if (have_avx512_bf16()) return "avx512_bf16";
  if (have_avx512()) return "avx512_f32";
  return have_avx2() ? "avx2_f32" : "generic";
}

}  // namespace tpu::kernels
