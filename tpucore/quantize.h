/// @file
/// Weight quantization: symmetric int8 per output channel and packed int4 per group of input
/// columns, and the linear layers that read such weights in place.
///
/// `quantize_int8(w)` of a 2-D float weight [N, K] (f32, bf16 or f16) gives
/// - `q`, int8 [N, K]: round-to-nearest-even of w / scale, clamped to [-127, 127];
/// - `scale`, f32 [N]: max |w[j, :]| / 127 per row (1 for a row of zeros, so that nothing
///   divides by zero and the row dequantizes to zeros).
/// A non-finite weight is a tpu::Error naming its row.
///
/// `linear_int8(x, q, scale)` computes x q^T scaled per output column, i.e. x (q * scale)^T,
/// for x [..., K] in f32, bf16 or f16: every int8 weight is widened to f32 and multiplied
/// exactly, the sums accumulate in f32, the result has x's dtype. On the cpu the weight is
/// read in place (AVX-512, AVX2 + FMA or portable loops, chosen at run time); other devices run
/// the cpu kernel through the host fallback.
///
/// `quantize_int4(w, group, scale_dtype)` (group 32 or 128, dividing K; scale_dtype f32 or f16)
/// gives
/// - `q`, u8 [N, K / 2]: two weights per byte. Each row is cut into blocks of 32 weights stored
///   in 16 bytes: byte b of a block holds weight b of the block in its low nibble and weight
///   b + 16 in its high nibble (so that one 16-byte load unpacks into two vectors of 16
///   consecutive weights). A nibble holds q + 8 for q = round-to-nearest-even(w / scale)
///   clamped to [-7, 7] (8 encodes zero; 0 is never written);
/// - `scale` [N, K / group] of scale_dtype: max |w| / 7 over each group of `group` consecutive
///   columns of a row (1 for a group of zeros). With f16 scales (18 bytes per 32 weights at
///   group 32, the size of llama.cpp's Q4_0 block; f32 takes 20) the scale is rounded to f16
///   first and q is computed against the rounded scale; a scale above f16's largest finite
///   value is a tpu::Error, and one below its smallest subnormal is stored as that subnormal.
///   The scale's dtype is the format: every int4 consumer takes f32 and f16 scales.
/// `linear_int4(x, q, scale)` computes x Wd^T with Wd[j, k] = q[j, k] * scale[j, k / group]
/// (the group size is K / scale.size(1); f32, f16 or bf16 scales, the f16 ones read as they are
/// on the cpu, the others widened to f32 first): each weight is unpacked in registers and
/// multiplied by its scale, which is exactly the dequantized f32 weight, and the sums accumulate
/// in f32. From 16 rows of x on, panels of the weight are dequantized and multiplied by the
/// float GEMM.
///
/// `quantize_fp8(w)` gives `q`, u8 [N, K] holding OCP E4M3 bit patterns (the saturating
/// conversion of w / scale, round to nearest even; f8e4m3::from_bits decodes one; a u8 tensor
/// because the f8e4m3 dtype is a storage type that computing ops refuse)
/// and `scale`, f32 [N]: max |w[j, :]| / 448 per row.
/// `linear_fp8(x, q, scale)` widens each fp8 weight to its exact f32 value in registers.
///
/// Block scales (fine-grained fp8 as DeepSeek-V3 and Qwen3-FP8 publish it): `linear_fp8(x, q,
/// scale, block_n, block_k)` and `dequantize_fp8(q, scale, block_n, block_k)` take f32 scales
/// [ceil(N / block_n), ceil(K / block_k)], one per block of block_n rows by block_k columns (the
/// last blocks partial when block_n or block_k does not divide N or K); the weight is
/// e4m3(q[j, k]) * scale[j / block_n, k / block_k]. Scales of another shape are a tpu::Error
/// naming both shapes. The cpu reads the bytes in place for few rows and multiplies each widened
/// vector by its block's scale, giving the dequantized f32 weight exactly; from 32 rows on it
/// dequantizes panels for the float GEMM. The chip has no block-scaled kernel: there the op runs
/// on the host (a counted fallback) with the same values.
#pragma once

#include "tpucore/core/tensor.h"

namespace tpu {

/// An int8 weight and its per-row scales (see the file comment).
struct Int8Weight {
  Tensor q;      ///< int8 [N, K]
  Tensor scale;  ///< f32 [N]
};

/// Symmetric per-output-channel int8 quantization of a 2-D float weight.
Int8Weight quantize_int8(const Tensor& weight);
/// q * scale[:, None] as f32 (the dequantized weight).
Tensor dequantize_int8(const Tensor& q, const Tensor& scale);
/// x (q * scale)^T with f32 accumulation; the result has x's dtype.
Tensor linear_int8(const Tensor& x, const Tensor& q, const Tensor& scale);
/// linear_int8 of an Int8Weight.
inline Tensor linear_int8(const Tensor& x, const Int8Weight& w) { return linear_int8(x, w.q, w.scale); }

/// A packed int4 weight and its per-group scales (see the file comment).
struct Int4Weight {
  Tensor q;            ///< u8 [N, K / 2], two weights per byte
  Tensor scale;        ///< f32 or f16 [N, K / group]
  int64_t group = 32;  ///< columns per scale
};

/// Symmetric int4 quantization per group of `group` (32 or 128) columns of a 2-D float weight,
/// with scales of `scale_dtype` (f32 or f16).
Int4Weight quantize_int4(const Tensor& weight, int64_t group = 32, DType scale_dtype = DType::f32);
/// The dequantized weight [N, K] as f32.
Tensor dequantize_int4(const Tensor& q, const Tensor& scale);
/// x Wd^T with the packed weight unpacked in registers, f32 accumulation; the result has x's dtype.
Tensor linear_int4(const Tensor& x, const Tensor& q, const Tensor& scale);
/// linear_int4 of an Int4Weight.
inline Tensor linear_int4(const Tensor& x, const Int4Weight& w) { return linear_int4(x, w.q, w.scale); }

/// An fp8 e4m3 weight and its per-row scales (see the file comment).
struct Fp8Weight {
  Tensor q;             ///< u8 [N, K]: e4m3 bit patterns
  Tensor scale;         ///< f32 [N], or [ceil(N / block_n), ceil(K / block_k)] for block scales
  int64_t block_n = 0;  ///< rows per scale block (0: one scale per row)
  int64_t block_k = 0;  ///< columns per scale block (0: one scale per row)
};
/// fp8 e4m3 weight-only quantization per output channel of a 2-D float weight.
Fp8Weight quantize_fp8(const Tensor& weight);
/// q * scale[:, None] as f32.
Tensor dequantize_fp8(const Tensor& q, const Tensor& scale);
/// x (q * scale)^T with f32 accumulation; the result has x's dtype.
Tensor linear_fp8(const Tensor& x, const Tensor& q, const Tensor& scale);
/// e4m3(q) times the scale of each block of block_n x block_k, as f32.
Tensor dequantize_fp8(const Tensor& q, const Tensor& scale, int64_t block_n, int64_t block_k);
/// x (e4m3(q) * scale[j / block_n, k / block_k])^T with f32 accumulation; the result has x's dtype.
Tensor linear_fp8(const Tensor& x, const Tensor& q, const Tensor& scale, int64_t block_n, int64_t block_k);
/// linear_fp8 of an Fp8Weight (per-row or block scales).
inline Tensor linear_fp8(const Tensor& x, const Fp8Weight& w) {
  return w.block_n > 0 ? linear_fp8(x, w.q, w.scale, w.block_n, w.block_k) : linear_fp8(x, w.q, w.scale);
}

}  // namespace tpu
