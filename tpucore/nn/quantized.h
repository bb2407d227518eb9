/// @file
/// Weight-only quantized linear layers for inference: nn::QuantizedLinear holds an int8 or fp8
/// e4m3 (per output channel) or packed int4 (per group of columns) weight made by
/// tpucore/quantize.h and runs linear_int8 / linear_fp8 / linear_int4, which read it in place;
/// the bias stays in float.
/// quantize_linear() swaps a module's Linear child for its quantized form.
#pragma once

#include <string>
#include <vector>

#include "tpucore/nn/layers.h"
#include "tpucore/quantize.h"

namespace tpu::nn {

/// The weight formats of QuantizedLinear.
enum class WeightQuant {
  none,  ///< float weights (no quantization)
  int8,  ///< symmetric int8, one scale per output channel
  int4,  ///< symmetric packed int4, one scale per group of input columns
  fp8,   ///< fp8 e4m3, one scale per output channel
};
/// "none", "int8", "int4", "fp8".
const char* weight_quant_name(WeightQuant q);
/// The format named "none", "int8", "int4" or "fp8"; another name is a tpu::Error listing them.
WeightQuant parse_weight_quant(const std::string& name);

/// y = x Wq^T + b with a quantized weight (inference only: no gradient reaches the weight).
/// Its members, as the checkpoint-style buffers "weight" (i8 [out, in], u8 e4m3 bit patterns
/// [out, in], or packed u8 [out, in / 2])
/// and "weight_scale" (f32 [out], f16 [out, in / group] for int4, or [ceil(out / block_n),
/// ceil(in / block_k)] for block-scaled fp8), and the float parameter "bias".
class QuantizedLinear : public Linear {
 public:
  /// The quantized form of `src`'s weight (its bias is shared); group: int4's columns per scale
  /// (32 or 128). A Linear whose in_features the group does not divide is a tpu::Error.
  QuantizedLinear(const Linear& src, WeightQuant kind, int64_t group = 32);
  /// An fp8 linear over given e4m3 bytes q (u8 [out, in]) and f32 scales [out], as a quantized
  /// checkpoint stores them, and an optional float bias [out]. With block_n and block_k (> 0)
  /// the scales are per block: [ceil(out / block_n), ceil(in / block_k)] (fine-grained fp8);
  /// scales of another shape are a tpu::Error naming both shapes.
  QuantizedLinear(Tensor q, Tensor scale, Tensor bias, int64_t block_n = 0, int64_t block_k = 0);
  /// x [..., in_features] -> [..., out_features] in x's dtype.
  Tensor forward(const Tensor& x) override;
  /// "QuantizedLinear".
  std::string type_name() const override { return "QuantizedLinear"; }
  WeightQuant kind;       ///< int8, int4 or fp8
  int64_t group = 0;      ///< int4: columns per scale (0 for int8)
  int64_t in_features;    ///< the input width
  Tensor weight_scale;    ///< the scales
  int64_t block_n = 0;    ///< fp8 block scales: rows per block (0: per-row scales)
  int64_t block_k = 0;    ///< fp8 block scales: columns per block
};

/// Quantized projections of one input (an attention's q, k and v; a gated MLP's gate and up)
/// whose weights, scales and biases sit in one buffer each, their rows one after another, so that
/// one product computes them all: one pass over the input and one thread dispatch instead of one
/// per projection. Each projection's members are views of these buffers (its checkpoint names,
/// shapes and values are unchanged).
struct PackedProjections {
  Tensor weight;                ///< every projection's weight rows, in order
  Tensor weight_scale;          ///< their scales, in the same order
  Tensor bias;                  ///< their biases (undefined when they have none)
  std::vector<int64_t> rows;    ///< each projection's output features
  /// Whether the projections were packed.
  bool defined() const { return weight.defined(); }
};

/// Packs `parts` (QuantizedLinear layers of one format: int8, int4 with one group size, or fp8
/// with per-row scales; one input width; scales and weights of one dtype; all with a bias or
/// none) into one buffer and points their weights, scales and biases at views of it. Returns an
/// undefined pack, changing nothing, when they do not qualify (float layers, fp8 block scales,
/// mixed formats), so callers may try any set.
PackedProjections pack_projections(const std::vector<Linear*>& parts);

/// The outputs of `parts` for input x through one product over `pack`, equal to each part's own
/// forward: when every part still views the pack (a weight replaced since, e.g. by loading or
/// moving the model, ends it), none has forward hooks, and x is an eager cpu tensor outside
/// tracing and autograd (nn/fused_path.h). Otherwise empty: the caller runs the parts one by one.
std::vector<Tensor> packed_forward(const PackedProjections& pack, const std::vector<Linear*>& parts,
                                   const Tensor& x);

/// Replaces `parent`'s Linear child `name` (held in `slot`) by its QuantizedLinear of `kind`
/// (nothing for WeightQuant::none or a child that is already quantized).
void quantize_linear(Module& parent, const std::string& name, std::shared_ptr<Linear>& slot, WeightQuant kind,
                     int64_t group = 32);

}  // namespace tpu::nn
