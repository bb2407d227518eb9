// The rows of A as the vnni and avx2q8 paths of the int8 / int4 weight kernels see them
// (ops/cpu/kernels/gemv_int8.h), written independently of the kernel: blocks of 32 along K, each
// value replaced by q d with d = max |a| / 127 (f32) and q = a (127 / max |a|) rounded to nearest,
// ties to even. On other paths (the float ones) the rows are returned unchanged.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/cpu/kernels/gemv_int4.h"
#include "ops/cpu/kernels/gemv_int8.h"

namespace tpu::testing {

inline std::vector<float> blockwise_q8_rows(const std::vector<float>& x, int64_t M, int64_t K) {
  std::vector<float> r(x);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
      const int64_t k1 = std::min(K, k0 + 32);
      float amax = 0;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(x[static_cast<size_t>(i * K + k)]));
      const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
      for (int64_t k = k0; k < k1; ++k) {
        const float q = std::nearbyint(x[static_cast<size_t>(i * K + k)] * id);
        r[static_cast<size_t>(i * K + k)] = static_cast<float>(static_cast<double>(q) * d);
      }
    }
  return r;
}

// x as gemv_int8 of M rows on path `p` sees it: quantized in blocks on vnni, and on avx2q8
// below its many-row threshold (int8_gemv_quantizes_rows).
inline std::vector<float> rows_as_seen(const std::vector<float>& x, int64_t M, int64_t K,
                                       kernels::Int8GemvPath p = kernels::Int8GemvPath::best) {
  return kernels::int8_gemv_quantizes_rows(p, M) ? blockwise_q8_rows(x, M, K) : x;
}

// The same for gemv_int4 of M rows on path `p` (whose avx2q8 path keeps many rows in f32).
inline std::vector<float> int4_rows_as_seen(const std::vector<float>& x, int64_t M, int64_t K,
                                            kernels::Int8GemvPath p = kernels::Int8GemvPath::best) {
  return kernels::int4_gemv_quantizes_rows(p, M) ? blockwise_q8_rows(x, M, K) : x;
}

}  // namespace tpu::testing
