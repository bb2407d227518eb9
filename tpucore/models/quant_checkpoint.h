/// @file
/// Quantized checkpoints as published on the Hugging Face Hub, read by load_causal_lm: the
/// config's `quantization_config` (fine-grained FP8, compressed-tensors float8, GPTQ and AWQ int4)
/// and the tensors that hold each quantized linear weight. See docs/quantization.md.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tpucore/core/tensor.h"
#include "tpucore/quantize.h"

namespace tpu::models {

/// The quantized weights of one checkpoint: parts collected while the tensors stream in, each
/// module's weight dequantized (and fp8 weights also kept as their bytes and scales) once all are read.
class QuantizedCheckpoint {
 public:
  /// Parses `quantization_config` (JSON text); an unsupported method, field or value is a
  /// tpu::Error naming it. `where` names the config file.
  QuantizedCheckpoint(const std::string& quantization_config, const std::string& where);
  /// Keeps `t` and returns true when `name` is a part of a quantized weight ("X.qweight",
  /// "X.weight_scale", an fp8 "X.weight", ...); false for an ordinary tensor.
  bool take(const std::string& name, const Tensor& t);
  /// Hands the f32 weight "X.weight" of every quantized module X to `place`; a module with a
  /// missing, misshapen or extra part is a tpu::Error naming it. Fills `fp8_weights` for every
  /// e4m3 weight (scales per output channel, per tensor, or per block).
  void finish(const std::function<void(const std::string&, const Tensor&)>& place);
  /// "fp8", "compressed-tensors", "gptq" or "awq".
  std::string method;
  /// fp8 weights by module name ("model.layers.0.mlp.up_proj"): the e4m3 bytes [N, K] and f32
  /// scales, [N] (one per output row; a per-tensor scale repeated) or, with block_n / block_k set,
  /// [ceil(N / block_n), ceil(K / block_k)]; they give the dequantized weight exactly.
  std::map<std::string, Fp8Weight> fp8_weights;
  /// The number of modules finish() dequantized to float.
  int64_t dequantized = 0;

 private:
  std::string where_;
  std::string ct_strategy_;              // compressed-tensors: channel, tensor or block
  std::vector<int64_t> block_;           // fp8 block scales: rows, columns per block
  int64_t group_ = 0;                    // gptq / awq: input rows per group (0: all)
  bool desc_act_ = false;                // gptq: act-order (g_idx needed)
  int zero_offset_ = 0;                  // gptq v1 stores zero - 1
  std::vector<std::string> not_converted_;  // modules_to_not_convert / ignore
  std::map<std::string, std::map<std::string, Tensor>> parts_;  // module -> part -> tensor
};

}  // namespace tpu::models
