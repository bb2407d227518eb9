// Products with int8 weights read in place: C[i, j] = scale[j] * sum_k A[i, k] * W[j, k] for
// an f32 A of M rows (row stride lda) and a symmetric per-output-channel int8 weight W [N, K]
// (row-major) with f32 scales. Each weight is widened to f32 in registers and multiplied
// exactly; the sums accumulate in f32 (no quantization of A), so the result matches the
// dequantize-then-float product to the accumulation order.
#pragma once

#include <cstdint>

namespace tpu::kernels {

// The implementations: the best the CPU has (AVX-512, AVX2+FMA, portable loops), or one named.
enum class Int8GemvPath { best, avx512, avx2, scalar };

// True when `p` can run on this CPU (best and scalar always can).
bool int8_gemv_path_available(Int8GemvPath p);
// The path `best` takes: "avx512", "avx2" or "scalar".
const char* int8_gemv_best_path();
// `p` itself, or for `best` the path this CPU takes (the other weight-only GEMV kernels, int4 and
// fp8, pick their paths the same way).
Int8GemvPath int8_gemv_resolve(Int8GemvPath p);

// Any M (rows are processed in groups of up to 4 sharing each loaded weight vector); the
// columns are split over the pool threads. C has row stride ldc.
void gemv_int8(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const int8_t* W, const float* scale,
               float* C, int64_t ldc, Int8GemvPath path = Int8GemvPath::best);

}  // namespace tpu::kernels
