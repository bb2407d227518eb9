// Few-row products C = A B where column j of B is contiguous in K (linear's x W^T with W
// [N, K] row-major), read in place without packing (see gemv_avx512.cpp). Return false when
// they do not apply (more than kGemvMaxRows rows, other strides, K < 16, no AVX-512): the
// caller then takes the packed GEMM path. Same contract as gemm_f32 / gemm_bf16 otherwise.
#pragma once

#include <cstdint>

namespace tpu::kernels {

constexpr int64_t kGemvMaxRows = 16;

bool gemv_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
              int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);
bool gemv_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t a_rs, int64_t a_cs, const uint16_t* B,
               int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);

}  // namespace tpu::kernels
