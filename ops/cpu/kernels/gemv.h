// Few-row products C = A B where column j of B is contiguous in K (linear's x W^T with W
// [N, K] row-major), read in place without packing (see gemv_avx512.cpp, gemv_avx2.cpp). Return
// false when they do not apply (more than kGemvMaxRows rows, other strides, K < 16, neither
// AVX-512 nor AVX2+FMA): the caller then takes the packed GEMM path. Same contract as gemm_f32 /
// gemm_bf16 otherwise.
#pragma once

#include <cstdint>

namespace tpu::kernels {

constexpr int64_t kGemvMaxRows = 16;
// Up to this many rows the AVX-512 path takes dot products along K; more rows the broadcast
// kernel (a [K][16] panel of A, one FMA per weight element).
constexpr int64_t kGemvDotRows = 4;

inline bool gemv_applies(int64_t M, int64_t N, int64_t K, int64_t a_cs, int64_t b_rs) {
  return M >= 1 && M <= kGemvMaxRows && N >= 1 && K >= 16 && a_cs == 1 && b_rs == 1;
}

bool gemv_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
              int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);
bool gemv_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs, const uint16_t* B,
               int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);

// The AVX2+FMA paths whatever the best kernel of the CPU is (tests use them to cover that path
// on AVX-512 machines). Only call them when gemm_avx2_available(); same return contract.
bool gemv_f32_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                   int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);
bool gemv_bf16_avx2(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs,
                    const uint16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);

}  // namespace tpu::kernels
