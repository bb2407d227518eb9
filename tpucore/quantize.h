/// @file
/// Weight quantization: symmetric int8 per output channel, and the linear layer that reads
/// such weights in place.
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

}  // namespace tpu
