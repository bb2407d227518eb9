// Products with int8 weights read in place: C[i, j] = scale[j] * sum_k A[i, k] * W[j, k] for
// an f32 A of M rows (row stride lda) and a symmetric per-output-channel int8 weight W [N, K]
// (row-major) with f32 scales. On the float paths each weight is widened to f32 in registers and
// multiplied exactly; the sums accumulate in f32 (no quantization of A), so the result matches the
// dequantize-then-float product to the accumulation order. The vnni path (the best one where the
// CPU has it) quantizes A (below).
#pragma once

#include <cstdint>

namespace tpu::kernels {

// The implementations: the best the CPU has (AVX-512 VNNI, else AVX2 + FMA with A quantized,
// else portable loops), or one named. vnni (gemv_vnni.cpp) quantizes the rows of A to int8 in
// blocks of 32 (one f32 scale per block, as llama.cpp's Q8_0) and multiplies by vpdpbusd: the
// result is the product of the dequantized weight with that quantized A, not with A itself (each
// value of A moves by at most half its block's step, max |a| / 254). avx2q8 (gemv_q8_avx2.cpp)
// quantizes A the same way and multiplies by vpmaddubsw / vpmaddwd (below kInt8Q8ManyRows rows). avx512, avx2 and scalar
// keep A in f32 (widening each weight in registers). fp8 weights have no kernel with A
// quantized: vnni runs their AVX-512 path, avx2q8 their AVX2 one.
enum class Int8GemvPath { best, avx512, avx2, scalar, vnni, avx2q8 };

// Rows of A from which the avx2q8 path multiplies by the float GEMM over panels of the weight
// dequantized to f32 (outside batch-invariant mode): there the GEMM's FMAs, with the
// dequantization amortized over the rows, beat the byte products.
constexpr int64_t kInt8Q8ManyRows = 64;

// Whether gemv_int8 of M rows on path `p` (best: the path this CPU takes) quantizes the rows of
// A: vnni always, avx2q8 below kInt8Q8ManyRows rows (any number in batch-invariant mode).
bool int8_gemv_quantizes_rows(Int8GemvPath p, int64_t M);

// True when `p` can run on this CPU (best and scalar always can).
bool int8_gemv_path_available(Int8GemvPath p);
// The path `best` takes: "vnni", "avx512", "avx2" or "scalar".
const char* int8_gemv_best_path();
// `p` itself, or for `best` the path this CPU takes (the other weight-only GEMV kernels, int4 and
// fp8, pick their paths the same way).
Int8GemvPath int8_gemv_resolve(Int8GemvPath p);

// Whether the vnni path can run (AVX-512 with VNNI).
bool int8_vnni_available();

// Any M (rows are processed in groups of up to 4 sharing each loaded weight vector); the
// columns are split over the pool threads. C has row stride ldc.
void gemv_int8(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const int8_t* W, const float* scale,
               float* C, int64_t ldc, Int8GemvPath path = Int8GemvPath::best);

// The avx2q8 path itself (only call when AVX2 and FMA are present): any M, C row stride ldc.
void gemv_int8_q8avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const int8_t* W,
                      const float* scale, float* C, int64_t ldc);

// The vnni path itself (only call when int8_vnni_available()): any M, C row stride ldc.
void gemv_int8_vnni(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const int8_t* W, const float* scale,
                    float* C, int64_t ldc);

}  // namespace tpu::kernels
