// Host matrix-multiply kernels on raw pointers (the CPU matmul op is built on these).
//
// C[m, n] (+)= sum_k A[m, k] * B[k, n]
//
// Strides are in elements and may be anything (transposed, sliced, or broadcast views):
// A element (i, k) is A[i*a_rs + k*a_cs], B element (k, j) is B[k*b_rs + j*b_cs]. C is
// row-major with leading dimension ldc and unit column stride. accumulate == false
// overwrites C; true adds the product to what C holds. M, N or K may be 0 (K == 0 writes
// zeros unless accumulating).
//
// The entry points pick a kernel at run time from tpu::cpu_features(): for bf16 from 2 rows,
// AMX tiles (TDPBF16PS) where the CPU and OS allow them (the weight read in place for 2 to 128
// rows of x W^T, see gemm_bf16_amx_wt; from 16 rows otherwise); a register-blocked AVX-512
// micro-kernel (FMA for f32, vdpbf16ps for bf16) when the CPU has it, else an AVX2+FMA
// one (bf16 widened to f32 panels), otherwise a portable blocked kernel. The *_generic entry
// points always take the portable path and the *_avx2 ones the AVX2 path (tests use them to
// cover each path on any machine that can run it). Large products run on all pool threads; small
// ones stay on the calling thread.
#pragma once

#include <cstdint>

#include "ops/cpu/kernels/int4_scales.h"

namespace tpu::kernels {

void gemm_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs,
              const float* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc,
              bool accumulate);

// bf16 inputs as raw bit patterns (a bf16 is the top 16 bits of an f32); products are
// accumulated in f32 and C is f32.
void gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs,
               int64_t a_cs, const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C,
               int64_t ldc, bool accumulate);

// IEEE f16 inputs as raw bit patterns (gemv_f16.cpp), accumulated in f32, C f32: up to
// kGemvMaxRows rows of x W^T (b_rs 1) read the weight in place and convert it in registers
// (gemv_f16); more rows widen A to f32 once and run the packed f32 kernels with B widened
// while it is packed (gemm_f32a_f16b); in batch-invariant mode, and on CPUs without AVX2,
// both operands are widened to f32 and gemm_f32 runs on them.
void gemm_f16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
              const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);
// The packed f32 GEMM of an f32 A by an f16 B (raw bits): the B panels are widened as they are
// packed (vectorized for B = W^T, b_rs 1), the f32 micro-kernel (AVX-512, or AVX2 with
// `avx2_only` or without AVX-512) runs on them. Returns false (nothing done) on CPUs without
// AVX2 and FMA.
bool gemm_f32a_f16b(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const uint16_t* B,
                    int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate, bool avx2_only = false);

// The portable paths, whatever the CPU.
void gemm_f32_generic(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs,
                      int64_t a_cs, const float* B, int64_t b_rs, int64_t b_cs, float* C,
                      int64_t ldc, bool accumulate);
void gemm_bf16_generic(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs,
                       int64_t a_cs, const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C,
                       int64_t ldc, bool accumulate);

// The AVX2+FMA paths, whatever the best kernel of the CPU is. Only call them when
// gemm_avx2_available() (they use AVX2 and FMA instructions unconditionally).
bool gemm_avx2_available();
void gemm_f32_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs,
                   const float* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc,
                   bool accumulate);
void gemm_bf16_avx2(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs,
                    int64_t a_cs, const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C,
                    int64_t ldc, bool accumulate);

// The AMX path of gemm_bf16 (TDPBF16PS tiles; gemm_amx.cpp): available when the CPU has
// amx_bf16, the OS granted the tile state and TPU_CPU_AMX is not 0. gemm_bf16_amx returns false
// (and does nothing) when it is not available or a size is 0.
bool gemm_bf16_amx_available();
bool gemm_bf16_amx(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                   const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);
// The AMX path for few rows of x W^T (b_rs 1: B's columns, the weight's rows, contiguous along
// K): the weight is read in place as the tiles' A operand (nothing of it is packed or copied, but
// the last N % 16 rows and the K % 32 tail of each 16 rows), against the rows of A packed once
// per call; the threads split N. gemm_bf16 takes it up to kAmxWeightInPlaceMaxRows rows. Returns
// false (and does nothing) when AMX is not available, b_rs != 1 or a size is 0.
constexpr int64_t kAmxWeightInPlaceMaxRows = 128;
bool gemm_bf16_amx_wt(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                      const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);

// Products with int8 weights from kGemmInt8MinRows rows on (prefill; gemm_vnni.cpp): C[i, j] =
// scale[j] * sum_k q(A)[i, k] * W[j, k], A f32 [M, K] (row stride lda), W int8 [N, K] row-major,
// C row stride ldc (overwritten). A is quantized as the vnni GEMV path does it (gemv_int8.h: blocks
// of 32 along K, one f32 scale each, round to nearest even), so the result is the dequantized
// weight times that quantized A, computed by an AVX-512 VNNI register-tiled GEMM. Returns false
// (and does nothing) with fewer rows, without AVX-512 VNNI, or in batch-invariant mode (a row's
// sum order would depend on the row count's path); the caller then runs gemv_int8.
constexpr int64_t kGemmInt8MinRows = 32;
bool gemm_int8_vnni_available();
bool gemm_int8_vnni(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const int8_t* W, const float* scale,
                    float* C, int64_t ldc);
// The same for packed int4 weights (the layout of gemv_int4.h, group scales [N, K / group]): the
// weights unpacked to int8 in the packed panels, each block's sums scaled by d times the
// column's group scale (as the vnni GEMV path does). Also false when K or group is not a
// multiple of 32 (or group does not divide K). The group scales may be f32 or f16 (Int4Scales).
bool gemm_int4_vnni(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
                    Int4Scales scale, float* C, int64_t ldc);

// The same products on AMX int8 tiles (TDPBSSD; gemm_amx_int8.cpp), with A quantized the same way
// and the same exact int32 sums per block of 32: available when the CPU has amx_int8 and the tile
// state is granted (gemm_bf16_amx_available(); TPU_CPU_AMX=0 turns it off). They take any M >= 1
// (the callers use them from kGemmInt8AmxMinRows rows on) and return false (doing nothing) when
// not available, in batch-invariant mode, or when K (int4: or group) is not a multiple of 32.
constexpr int64_t kGemmInt8AmxMinRows = 8;
bool gemm_int8_amx_available();
bool gemm_int8_amx(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const int8_t* W, const float* scale,
                   float* C, int64_t ldc);
bool gemm_int4_amx(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
                   Int4Scales scale, float* C, int64_t ldc);

// Name of the kernel gemm_f32 / gemm_bf16 use on this CPU ("avx512", "avx2", "generic"), for
// logs and benchmark labels.
const char* gemm_f32_kernel_name();
const char* gemm_bf16_kernel_name();

namespace detail {

// A micro-kernel computes one rows x cols tile of C (rows <= mr, cols <= nr) from packed
// panels: Ap holds, for each of the kc packed k-steps, mr consecutive A values (rows past
// `rows` are zero); Bp holds, for each k-step, nr consecutive B values (columns past `cols`
// are zero). load_c == false overwrites the tile, true adds to it. For bf16 one packed
// "value" is a 32-bit pair of bf16 along K (low half = even k), so a k-step covers two k.
using MicroKernelF32 = void (*)(int64_t kc, const float* Ap, const float* Bp, float* C,
                                int64_t ldc, int rows, int cols, bool load_c);
using MicroKernelBf16 = void (*)(int64_t kc, const uint32_t* Ap, const uint32_t* Bp,
                                 float* C, int64_t ldc, int rows, int cols, bool load_c);

// Register tile and cache blocking of one kernel family.
struct GemmBlocking {
  int mr, nr;      // register tile
  int64_t mc, kc;  // A block (mc x kc packed k-steps) kept in L2
  int64_t nc;      // B block width
};

// Cache blocking for a register tile of mr x nr from the data caches of one thread (bytes;
// tpu::cpu_caches()), `step_bytes` bytes per packed value (4: an f32, or a pair of bf16):
// - kc: the B micro-panel (kc x nr values) fills l1d_panel times the L1d (0 or less counts
//   as 1). With 1 it stays in the L1d, reused there by every A micro-panel of the block, which
//   stream from the L2 (kc x mr, prefetched). A kernel with few loads per FMA (the AVX-512
//   14 x 32 tile: 16 loads per 28 FMAs) can stream part of the B micro-panel from the L2 as
//   well, and takes 2: twice the k-steps per C tile update halves the loads and stores of C
//   per FMA, which dominate once C no longer fits the L2 (each C tile is read and written
//   K / kc times). A kernel with many loads per FMA (the AVX2 6 x 16 tile: 8 loads per 12
//   FMAs) takes 0.5: the B micro-panel in half the L1d, the other half for the A micro-panels
//   and C passing through (filling the whole L1d, kc 768 instead of 384 on a 48 KiB L1d, was
//   3% slower at n = 1024 and 2048 on the Intel Xeon);
// - mc: the A block (mc x kc) takes half of the L2 (the rest for B panels and C), or with
//   l1d_panel under 1 that share of the half (the AVX2 tile: a quarter of the L2; at half,
//   mc 678 instead of 336 on a 2 MiB L2, n = 1024 and 2048 ran 2-5% slower on the Intel Xeon);
// - nc: the B block (kc x nc) takes half of the thread's share of the L3 (of the L2 without
//   an L3), at most 4096 columns.
// Multiples of 16 (kc), mr (mc) and nr (nc), clamped to kc 64..1024, mc mr..128 mr, nc
// 4 nr..4096; a size of 0 (unknown) counts as 32 KiB L1d, 512 KiB L2, no L3.
GemmBlocking derive_blocking(int mr, int nr, int64_t step_bytes, int64_t l1d, int64_t l2, int64_t l3,
                             double l1d_panel = 1.0);

// The blocking the dispatched gemm_f32 / gemm_bf16 use on this CPU (from its caches).
const GemmBlocking& gemm_blocking_f32();
const GemmBlocking& gemm_blocking_bf16();

// AVX-512 micro-kernels (defined in gemm_avx512.cpp; only call when the CPU has them). The
// kAvx* constants give the register tiles (mr, nr); the driver derives mc, kc and nc.
extern const GemmBlocking kAvx512BlockingF32;
extern const GemmBlocking kAvx512BlockingBf16;
constexpr double kAvx512L1dPanel = 2.0;  // derive_blocking's l1d_panel for these tiles
void micro_kernel_f32_avx512(int64_t kc, const float* Ap, const float* Bp, float* C,
                             int64_t ldc, int rows, int cols, bool load_c);
void micro_kernel_bf16_avx512(int64_t kc, const uint32_t* Ap, const uint32_t* Bp, float* C,
                              int64_t ldc, int rows, int cols, bool load_c);

// One A panel (mr = kAvx512BlockingF32.mr rows) from rows of 32-bit words that are
// contiguous along K: dst[k * mr + r] = word k of row r (row r at src + r * row_bytes),
// zero for r >= rows.
void pack_a_panel_words_avx512(const void* src, int64_t row_bytes, int rows, int64_t kw,
                               uint32_t* dst);

// B panels of bf16 pairs (nr = kAvx512BlockingBf16.nr columns each) from rows contiguous along
// N (row k at src + k * rs): columns [0, 32) go to the panel at dst, [32, 64) (when cols > 32;
// at most 64) to the one at dst + panel_words; dst[p * nr + c] = bf16 k = 2p in the low half,
// k = 2p + 1 in the high half (zero for k >= kce), zero for c >= cols; ceil(kce / 2) pairs.
// Needs avx512bw.
void pack_b_panels_bf16_pairs_avx512(const uint16_t* src, int64_t rs, int cols, int64_t kce,
                                     uint32_t* dst, int64_t panel_words);

// One B panel of bf16 pairs (32 columns, the layout above) from columns contiguous along K
// (B = W^T of a linear layer: column j at src + j * cs, its K values consecutive): the pair
// (2p, 2p + 1) of a column is one 32-bit word there; zero for c >= cols, an odd kce's last pair
// holds the last value alone. Writes ceil(kce / 2) pairs. Needs avx512f.
void pack_b_panel_bf16_pairs_transposed_avx512(const uint16_t* src, int64_t cs, int cols, int64_t kce,
                                               uint32_t* dst);

// AVX2+FMA micro-kernel (defined in gemm_avx2.cpp; only call when the CPU has AVX2 and FMA),
// its A-panel packer for rows contiguous along K (mr = kAvx2BlockingF32.mr) and its B-panel
// packers (nr = kAvx2BlockingF32.nr) for rows contiguous along N and for columns contiguous
// along K (B = W^T of a linear layer).
extern const GemmBlocking kAvx2BlockingF32;
constexpr double kAvx2L1dPanel = 0.5;  // derive_blocking's l1d_panel for this tile
void micro_kernel_f32_avx2(int64_t kc, const float* Ap, const float* Bp, float* C, int64_t ldc,
                           int rows, int cols, bool load_c);
void pack_a_panel_f32_avx2(const float* src, int64_t rs, int rows, int64_t kce, float* dst);
void pack_b_panel_rows_f32_avx2(const float* src, int64_t rs, int cols, int64_t kce, float* dst);
void pack_b_panel_f32_avx2(const float* src, int64_t cs, int cols, int64_t kce, float* dst);
// 16 (or fewer, zero-filled to 16) columns contiguous along K into dst[k * ds + c]: one half of
// a 32-wide panel of the AVX-512 f32 kernel (ds = 32).
void pack_b_half_panel_f32_avx2(const float* src, int64_t cs, int cols, int64_t kce, float* dst, int64_t ds);
// The same panels from bf16 bits, widened to f32 (A: rs as above, K contiguous; B: cs == 1,
// or rs == 1).
void pack_a_panel_bf16_avx2(const uint16_t* src, int64_t rs, int rows, int64_t kce, float* dst);
void pack_b_panel_bf16_avx2(const uint16_t* src, int64_t rs, int64_t cs, int cols, int64_t kce,
                            float* dst);
// A half of the AVX-512 f32 kernel's panel from bf16 columns (rs == 1), as the f16 one below:
// the bf16 products of AVX-512 CPUs without avx512_bf16.
void pack_b_half_panel_bf16_avx2(const uint16_t* src, int64_t cs, int cols, int64_t kce, float* dst, int64_t ds);
// The column panels (rs == 1: B = W^T of a linear layer) from IEEE f16 bits, widened exactly by
// vcvtph2ps (the AVX2 kernel's 16-wide panel, and a half of the AVX-512 kernel's with ds = 32).
void pack_b_panel_f16_avx2(const uint16_t* src, int64_t cs, int cols, int64_t kce, float* dst);
void pack_b_half_panel_f16_avx2(const uint16_t* src, int64_t cs, int cols, int64_t kce, float* dst, int64_t ds);

}  // namespace detail
}  // namespace tpu::kernels
