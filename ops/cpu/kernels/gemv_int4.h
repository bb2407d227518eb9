// Products with packed int4 weights read in place: C[i, j] = sum_k A[i, k] * Wd[j, k] for an f32
// A of M rows (row stride lda), Wd[j, k] = (nibble(j, k) - 8) * scale[j, k / group] being the
// dequantized weight of N rows and K columns.
//
// Layout (tpucore/quantize.h): each weight row is K / 2 bytes in blocks of 16 bytes per 32
// weights; byte b of a block holds weight b of the block in its low nibble and weight b + 16 in
// its high nibble, each stored as q + 8 with q in [-7, 7] (offset binary: 8 is zero). scale is
// f32 or f16 [N, K / group] (Int4Scales, int4_scales.h); K is a multiple of 32 and of group
// (group a multiple of 32).
//
// Each weight is unpacked in registers, converted to f32 and multiplied by its group's scale,
// which gives exactly the dequantized f32 weight; the sums accumulate in f32, so the result
// matches the dequantize-then-float product to the accumulation order. The vnni path (the best
// one on CPUs with AVX-512 VNNI) instead quantizes A in blocks of 32 and multiplies bytes
// (gemv_int8.h, gemv_vnni.cpp), for any number of rows; so does the avx2q8 path (the best one on
// other AVX2 CPUs, gemv_q8_avx2.cpp) below kInt4Q8ManyRows rows. From kInt4ManyRows rows on
// (avx2q8: from kInt4Q8ManyRows) the product dequantizes panels of the weight to f32 and
// multiplies them by the float GEMM (gemm.h), except in batch-invariant mode
// (tpucore/core/batch_invariant.h), where every row takes the few-row kernel and so the same
// summation order whatever the number of rows.
#pragma once

#include <cstdint>

#include "ops/cpu/kernels/gemv_int8.h"
#include "ops/cpu/kernels/int4_scales.h"

namespace tpu::kernels {

// Rows of A from which the product goes through dequantized panels and the float GEMM: on the
// float paths, and on the avx2q8 path (whose byte products per row cost more than an FMA's
// share, so the GEMM's amortized dequantization wins later).
constexpr int64_t kInt4ManyRows = 16;
constexpr int64_t kInt4Q8ManyRows = 64;

// The unpacked value (q in [-7, 7], or -8) of weight k of a packed row.
inline int int4_at(const uint8_t* row, int64_t k) {
  const uint8_t b = row[(k / 32) * 16 + (k % 32) % 16];
  return ((k % 32) < 16 ? (b & 0xF) : (b >> 4)) - 8;
}

// Any M; the columns are split over the pool threads; C has row stride ldc. `path` selects the
// few-row kernel (the paths of gemv_int8.h); the many-row path ignores it. The vnni path (A
// quantized in blocks of 32, gemv_int8.h) takes every M, so a row's result never depends on
// the number of rows.
void gemv_int4(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
               Int4Scales scale, float* C, int64_t ldc, Int8GemvPath path = Int8GemvPath::best);

// Whether gemv_int4 of M rows on `path` quantizes the rows of A (vnni: always; avx2q8: below
// kInt4Q8ManyRows rows, or any number in batch-invariant mode), else keeps them in f32.
bool int4_gemv_quantizes_rows(Int8GemvPath path, int64_t M);

// The avx2q8 path itself (only call when AVX2 and FMA are present): A quantized in blocks of 32
// as by the vnni path, vpmaddubsw on the nibbles (gemv_q8_avx2.cpp); any M.
void gemv_int4_q8avx2(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
                      Int4Scales scale, float* C, int64_t ldc);

// The vnni path itself (only call when int8_vnni_available()).
void gemv_int4_vnni(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* W,
                    Int4Scales scale, float* C, int64_t ldc);

// The vnni product on a repacked copy of the weight ("panel layout", gemv_int4_panel.cpp): panels
// of 16 weight rows (the last one padded with zero weights and scales), each per group the 16
// rows' scales (f16 or f32, as given) followed by the group's blocks of 32 weights, 256 bytes per
// block (per 32-bit lane of each 64-byte vector four consecutive weights of one row). A is
// quantized in blocks of 32 as by gemv_int4_vnni; each output sums its blocks in order, so a
// row's result does not depend on M. The copy is int4_panel_bytes(N, K, group, f16) bytes.
bool int4_panel_supported(int64_t K, int64_t group);  // VNNI present, K and group fit
int64_t int4_panel_bytes(int64_t N, int64_t K, int64_t group, bool f16_scales);
void int4_pack_panels(int64_t N, int64_t K, int64_t group, const uint8_t* W, Int4Scales scale, uint8_t* P);
void gemv_int4_panels(int64_t M, int64_t N, int64_t K, int64_t group, const float* A, int64_t lda, const uint8_t* P,
                      bool f16_scales, float* C, int64_t ldc);

// The same for fp8 e4m3 weights [N, K] (raw bytes, no NaN pattern) with one f32 scale per output
// channel: C[i, j] = scale[j] * sum_k A[i, k] * e4m3(W[j, k]). Each byte is turned into its exact
// f32 value in registers (AVX-512: as an f16 of 2^-8 times the value, converted by vcvtph2ps;
// AVX2: by rebiasing the exponent, subnormals through a subtraction); any M, as gemv_int8.
void gemv_fp8(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint8_t* W, const float* scale,
              float* C, int64_t ldc, Int8GemvPath path = Int8GemvPath::best);

// fp8 e4m3 weights [N, K] with one f32 scale per block of bn rows by bk columns (DeepSeek-V3's
// fine-grained fp8): scale is [ceil(N / bn), ceil(K / bk)] row-major, the last blocks of a row
// or column partial, and C[i, j] = sum_k A[i, k] * (e4m3(W[j, k]) * scale[j / bn, k / bk]).
// Few rows: the bytes are read in place and widened in registers as gemv_fp8 does, and each
// widened vector is multiplied by its block's scale (one multiply per 16 (8) weights, shared by
// the up to four rows of A; the product is the dequantized f32 weight exactly); the sums
// accumulate in f32. From kFp8BlockManyRows rows on (unless batch-invariant), panels of the
// weight are dequantized to f32 and multiplied by the float GEMM.
constexpr int64_t kFp8BlockManyRows = 32;
void gemv_fp8_block(int64_t M, int64_t N, int64_t K, int64_t bn, int64_t bk, const float* A, int64_t lda,
                    const uint8_t* W, const float* scale, float* C, int64_t ldc, Int8GemvPath path = Int8GemvPath::best);

}  // namespace tpu::kernels
