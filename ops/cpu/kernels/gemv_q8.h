// What the weight kernels that quantize the rows of A (gemv_vnni.cpp: AVX-512 VNNI;
// gemv_q8_avx2.cpp: AVX2) share: the thread's buffer for the quantized rows, the blocks of weight
// rows over the pool threads with the prefetch distance, and reading one weight scale.
// Internal to the kernels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cpu/kernels/gemv.h"
#include "tpucore/core/half.h"

namespace tpu::kernels::q8 {

constexpr int kCols = 4;  // weight rows per block
constexpr int kRows = 4;  // rows of A per group

// The quantized rows of A: q [M][kp] bytes, lane scales ls (the d of the block whose products a
// lane sums) and, for int4, the lanes' start values init; the layouts are the kernels' own.
struct Rows {
  int64_t kp = 0;
  uint8_t* q = nullptr;
  float* ls = nullptr;
  int32_t* init = nullptr;
};

// The thread's buffers (64-byte aligned) for M rows of `chunks` chunks of `chunk` values each:
// q [M][kp], and ls and init [M][chunks][16] each.
void reserve_rows(int64_t M, int64_t chunks, int64_t chunk, Rows& v);

// f(std::integral_constant<int, rows>{}) for rows in 1..kRows: the group kernels are templates on
// their row count.
template <class F>
void with_rows(int rows, F&& f) {
  switch (rows) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, kRows>{}); break;
  }
}

// C[r, c] = (scale[c] times, unless null) sum[r][c] for the block's `cols` columns.
template <int R>
inline void write_sums(const float (&sum)[R][kCols], int cols, const float* scale, float* C, int64_t ldc) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) C[r * ldc + c] = scale ? scale[c] * sum[r][c] : sum[r][c];
}

// Scale i of a row of f32 or f16 scales, as f32.
inline float scale_at(const float* s, int64_t i) { return s[i]; }
inline float scale_at(const f16* s, int64_t i) { return s[i].to_f32(); }

// How far ahead (bytes of weight) the kernels prefetch: the next block alone (1.5 KB of a
// 768-wide int4 row block) leaves part of the L3 / memory latency exposed on the one-row
// product, which is bound by that latency more than by the arithmetic.
constexpr int64_t kPrefetchBytes = 4096;

// Blocks of kCols weight rows over the pool threads; group_fn(j, cols, i, rows, ahead) for every
// group of rows, `ahead` the number of blocks (of row_bytes per weight row) between this one and
// the one to prefetch, at least kPrefetchBytes further on and inside the thread's run (0: none
// left; the hardware prefetchers start over on every row, so the block's first group prefetches).
template <class F>
void run_blocks(int64_t M, int64_t N, int64_t K, int64_t row_bytes, const void* W, F&& group_fn) {
  const int64_t blocks = (N + kCols - 1) / kCols;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 17) / std::max<int64_t>(1, K * M * kCols));
  const int64_t block_bytes = std::max<int64_t>(1, kCols * row_bytes);
  const int64_t dist = std::clamp<int64_t>((kPrefetchBytes + block_bytes - 1) / block_bytes, 1, 8);
  const tpu::detail::NextWeight next = tpu::detail::follow_weight(W, static_cast<size_t>(N * row_bytes));
  detail::gemv_for_blocks(blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j = b * kCols;
      const int cols = static_cast<int>(std::min<int64_t>(kCols, N - j));
      const int64_t ahead = std::min(dist, b1 - 1 - b);
      for (int64_t i = 0; i < M; i += kRows)
        group_fn(j, cols, i, static_cast<int>(std::min<int64_t>(kRows, M - i)), ahead);
    }
  }, next);
}

}  // namespace tpu::kernels::q8
