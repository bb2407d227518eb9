// MXU functional model: weights are converted once per load into the array's input numerics
// (bf16-rounded f32, exact f32, e4m3 values, or small integers held exactly in f32), the LHS
// tile is converted the same way, and the tile product runs as one blocked Eigen GEMM with f32
// accumulation (int8: exact integer products and sums, added into i32 or f32 results).
#include <cmath>
#include <cstring>

#include <Eigen/Core>

#include "sim/kernels.h"

namespace tpu::sim::detail {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

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
  Eigen::Map<const RowMat> A(scratch_a.data(), m, k);
  Eigen::Map<const RowMat> W(st.w[buf].data(), k, n);
  scratch_c.resize(size_t(m * n));
  Eigen::Map<RowMat> T(scratch_c.data(), m, n);
  if (three) {  // each pass accumulates in f32; the small cross terms first
    Eigen::Map<const RowMat> Al(scratch_a.data() + m * k, m, k);
    Eigen::Map<const RowMat> Wl(st.w[buf].data() + k * n, k, n);
    T.noalias() = A * Wl;
    T.noalias() += Al * W;
    T.noalias() += A * W;
  } else if (out.cs == 1 && out.dtype == DType::f32 && out.rs >= n) {
    float* cptr = reinterpret_cast<float*>(out.base);
    Eigen::Map<RowMat, Eigen::Unaligned, Eigen::OuterStride<>> C(cptr, m, n, Eigen::OuterStride<>(out.rs));
    if (acc) C.noalias() += A * W;
    else C.noalias() = A * W;
    return;
  } else {
    T.noalias() = A * W;
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
