// Grouped products of few rows against weights read in place, on AMX tiles: the grouped matmul of
// a mixture-of-experts layer (ops/grouped_matmul.cpp), where each expert gets a few rows.
#pragma once

#include <cstdint>

namespace tpu::kernels {

// One group: C_g [rows, N] = X_g [rows, K] W_g^T, W_g [N, K] with K contiguous.
struct WtGroup {
  int64_t rows = 0;             // rows of X_g and C_g (at most kAmxWeightInPlaceMaxRows)
  const uint16_t* x = nullptr;  // X_g's bf16 bits, element (i, k) at x[i * x_rs + k * x_cs]
  const uint16_t* w = nullptr;  // W_g's bf16 bits, row j at w + j * w_rs
  void* c = nullptr;            // C_g, row i at element i * ldc, f32 or bf16 (rounded to nearest even)
};

// Every group's C_g = X_g W_g^T (overwritten) in one pass over the pool's threads: the rows of
// all groups are packed once (in parallel over the groups), then the threads take runs of 16
// consecutive weight rows of the groups one after the other from a shared counter, each run a
// contiguous stretch of one weight, so the weights stream from memory once with no join between
// groups and a thread the machine delays leaves its work to the other. The weight is the tile
// multiply's A operand, loaded in place (as gemm_bf16_amx_wt does); the results are stored
// transposed straight to C_g, f32 or rounded to bf16 (`c_bf16`). Groups with no rows are
// skipped. Returns false (and does nothing) when AMX is not available, N or K is not positive, or
// a group has more than kAmxWeightInPlaceMaxRows rows.
bool gemm_bf16_amx_wt_grouped(int64_t N, int64_t K, const WtGroup* groups, int64_t count, int64_t x_rs, int64_t x_cs,
                              int64_t w_rs, int64_t ldc, bool c_bf16);

}  // namespace tpu::kernels
