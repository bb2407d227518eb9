// MXU functional model: weights are converted once per load into the array's input numerics
// (bf16-rounded f32, exact f32, e4m3 values, or small integers held exactly in f32), the LHS
// tile is converted the same way, and each output of the tile product is one chain of f32
// multiply-adds along K in a fixed order (int8: exact integer products and sums, added into i32
// or f32 results).
#include <cmath>
#include <cstring>

#include "sim/kernels.h"

namespace tpu::sim::detail {
namespace {

inline float load_elem(const uint8_t* p, DType t) {
  switch (t) {
    case DType::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::bf16: { uint16_t b; std::memcpy(&b, p, 2); return bf16_bits_to_f32(b); }
    case DType::i32: { int32_t v; std::memcpy(&v, p, 4); return float(v); }
    case DType::i8: return float(int8_t(*p));
    case DType::f8e4m3: return e4m3_bits_to_f32(*p);
  }
  return 0;
}

// A float input in the numerics of `mode` (isa.h, MxuMode): bf16 rounding, the nearest integer
// saturated to int8 (ties to even), or the nearest e4m3 value saturated to +-448.
inline float to_mode(float v, MxuMode mode) {
  switch (mode) {
    case MxuMode::bf16: return round_to_bf16(v);
    case MxuMode::i8: return std::isnan(v) ? 0.0f : std::fmin(127.0f, std::fmax(-128.0f, std::nearbyint(v)));
    case MxuMode::fp8: return round_to_e4m3(v);
    default: return v;
  }
}

// Copies a rows x cols matrix into a dense row-major f32 buffer in the MXU's input numerics.
void convert_tile(const MatRef& src, int64_t rows, int64_t cols, MxuMode mode, float* out) {
  const int64_t es = dtype_size(src.dtype);
  // Only float storage is converted: i8 and e4m3 values are exact in every mode that takes them.
  const bool round = (mode == MxuMode::bf16 && src.dtype == DType::f32) ||
                     ((mode == MxuMode::i8 || mode == MxuMode::fp8) && (src.dtype == DType::f32 || src.dtype == DType::bf16));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = src.base + r * src.rs * es;
    float* o = out + r * cols;
    if (src.cs == 1 && src.dtype == DType::f32) {
      std::memcpy(o, row, size_t(cols) * 4);
      if (round)
        for (int64_t c = 0; c < cols; ++c) o[c] = to_mode(o[c], mode);
    } else if (src.cs == 1 && src.dtype == DType::bf16) {
      const uint16_t* b = reinterpret_cast<const uint16_t*>(row);
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t v;
        std::memcpy(&v, b + c, 2);
        o[c] = round ? to_mode(bf16_bits_to_f32(v), mode) : bf16_bits_to_f32(v);
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        float v = load_elem(row + c * src.cs * es, src.dtype);
        o[c] = round ? to_mode(v, mode) : v;
      }
    }
  }
}

// bf16x3: a rows x cols tile as bf16 hi parts followed by bf16 lo parts (lo = bf16(v - hi)).
void split_tile(const MatRef& src, int64_t rows, int64_t cols, float* out) {
  const size_t n = size_t(rows * cols);
  convert_tile(src, rows, cols, MxuMode::f32, out);
  for (size_t i = 0; i < n; ++i) {
    const float hi = round_to_bf16(out[i]);
    out[n + i] = round_to_bf16(out[i] - hi);
    out[i] = hi;
  }
}

// T (m x n, row-major) = A (m x k) W (k x n), or T += A W with `add`: every output is one chain
// of f32 multiply-then-add steps along k in order, as the array accumulates down a column,
// whatever m and wherever the output sits in the tile (a general GEMM library sums a row in an
// order that depends on the row count and the row's place in its blocks, so a row's result
// would depend on the rows streamed with it). Blocks of RB rows x 2 vectors of 8 columns keep
// their sums in registers; narrower column tails use one vector, then scalars, with the same
// steps. Products and sums are rounded separately (neither the baseline nor the avx2 target
// has fused multiply-add), so both give the same bits.
using V8 = float __attribute__((vector_size(32)));
using V8u = float __attribute__((vector_size(32), aligned(4), may_alias));  // unaligned access
#define TPU_V8_AT(p) (*reinterpret_cast<const V8u*>(p))

// Columns [c, c + 8 CV) of RB rows: RB x CV vectors of sums held across k.
template <int RB, int CV>
__attribute__((always_inline)) inline void tile_block(const float* A, const float* W, int64_t k, int64_t n, float* T,
                                                      int64_t c, bool add) {
  V8 acc[RB][CV];
  for (int q = 0; q < RB; ++q)
    for (int j = 0; j < CV; ++j) acc[q][j] = add ? TPU_V8_AT(T + q * n + c + 8 * j) : V8{};
  for (int64_t i = 0; i < k; ++i) {
    V8 w[CV];
    for (int j = 0; j < CV; ++j) w[j] = TPU_V8_AT(W + i * n + c + 8 * j);
    for (int q = 0; q < RB; ++q) {
      const float a = A[q * k + i];
      for (int j = 0; j < CV; ++j) acc[q][j] = acc[q][j] + a * w[j];
    }
  }
  for (int q = 0; q < RB; ++q)
    for (int j = 0; j < CV; ++j) std::memcpy(T + q * n + c + 8 * j, &acc[q][j], sizeof(V8));
}

template <int RB>
__attribute__((always_inline)) inline void tile_rows(const float* A, const float* W, int64_t k, int64_t n, float* T,
                                                     bool add) {
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) tile_block<RB, 2>(A, W, k, n, T, c, add);
  for (; c + 8 <= n; c += 8) tile_block<RB, 1>(A, W, k, n, T, c, add);
  for (; c < n; ++c)
    for (int q = 0; q < RB; ++q) {
      float t = add ? T[q * n + c] : 0.0f;
      for (int64_t i = 0; i < k; ++i) t = t + A[q * k + i] * W[i * n + c];
      T[q * n + c] = t;
    }
}

__attribute__((always_inline)) inline void tile_product_body(const float* A, const float* W, int64_t m, int64_t k,
                                                             int64_t n, float* T, bool add) {
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) tile_rows<4>(A + r * k, W, k, n, T + r * n, add);
  for (; r < m; ++r) tile_rows<1>(A + r * k, W, k, n, T + r * n, add);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void tile_product_avx2(const float* A, const float* W, int64_t m, int64_t k,
                                                        int64_t n, float* T, bool add) {
  tile_product_body(A, W, m, k, n, T, add);
}
#endif

void tile_product(const float* A, const float* W, int64_t m, int64_t k, int64_t n, float* T, bool add) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return tile_product_avx2(A, W, m, k, n, T, add);
#endif
  tile_product_body(A, W, m, k, n, T, add);
}

}  // namespace

void mxu_load(MxuWeights& st, int buf, const MatRef& w, int64_t k, int64_t n, MxuMode mode) {
  const int parts = mode == MxuMode::bf16x3 ? 2 : 1;
  st.w[buf].resize(size_t(k * n * parts));
  if (parts == 2) split_tile(w, k, n, st.w[buf].data());
  else convert_tile(w, k, n, mode, st.w[buf].data());
  st.k[buf] = k;
  st.n[buf] = n;
  st.mode[buf] = mode;
}

void mxu_matmul(const MxuWeights& st, const MatRef& out, const MatRef& lhs, int64_t m, bool acc, MxuMode mode,
                std::vector<float>& scratch_a, std::vector<float>& scratch_c) {
  const int buf = st.current;
  const int64_t k = st.k[buf], n = st.n[buf];
  const bool three = mode == MxuMode::bf16x3;
  scratch_a.resize(size_t(m * k * (three ? 2 : 1)));
  if (three) split_tile(lhs, m, k, scratch_a.data());
  else convert_tile(lhs, m, k, mode, scratch_a.data());
  const float* A = scratch_a.data();
  const float* W = st.w[buf].data();
  scratch_c.resize(size_t(m * n));
  float* T = scratch_c.data();
  if (three) {  // each pass accumulates in f32; the small cross terms first
    tile_product(A, W + k * n, m, k, n, T, false);
    tile_product(A + m * k, W, m, k, n, T, true);
    tile_product(A, W, m, k, n, T, true);
  } else {
    tile_product(A, W, m, k, n, T, false);
  }
  if (out.cs == 1 && out.dtype == DType::f32) {
    for (int64_t r = 0; r < m; ++r) {
      float* o = reinterpret_cast<float*>(out.base) + r * out.rs;
      const float* t = T + r * n;
      if (acc)
        for (int64_t c = 0; c < n; ++c) o[c] += t[c];
      else
        std::memcpy(o, t, size_t(n) * sizeof(float));
    }
    return;
  }
  const int64_t es = dtype_size(out.dtype);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      uint8_t* p = out.base + (r * out.rs + c * out.cs) * es;
      float v = scratch_c[size_t(r * n + c)];
      if (out.dtype == DType::i32) {
        int32_t prev = 0;
        if (acc) std::memcpy(&prev, p, 4);
        int64_t sum = int64_t(prev) + int64_t(std::llrint(v));
        int32_t res = int32_t(uint32_t(uint64_t(sum)));  // two's-complement wrap, like hardware
        std::memcpy(p, &res, 4);
      } else {
        float prev = 0;
        if (acc) std::memcpy(&prev, p, 4);
        float res = acc ? prev + v : v;
        std::memcpy(p, &res, 4);
      }
    }
}

}  // namespace tpu::sim::detail
