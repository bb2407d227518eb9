#include "tpucore/nn/quantized.h"

#include "tpucore/autograd.h"

namespace tpu::nn {

const char* weight_quant_name(WeightQuant q) {
  switch (q) {
    case WeightQuant::int8: return "int8";
    case WeightQuant::int4: return "int4";
    case WeightQuant::fp8: return "fp8";
    case WeightQuant::none: break;
  }
  return "none";
}

WeightQuant parse_weight_quant(const std::string& name) {
  if (name == "none") return WeightQuant::none;
  if (name == "int8") return WeightQuant::int8;
  if (name == "int4") return WeightQuant::int4;
  if (name == "fp8") return WeightQuant::fp8;
  fail("unknown weight quantization '{}' (expected none, int8, int4 or fp8)", name);
}

QuantizedLinear::QuantizedLinear(const Linear& src, WeightQuant k, int64_t g) : kind(k) {
  TPU_CHECK(k != WeightQuant::none, "QuantizedLinear: a quantized format is needed (int8, int4 or fp8)");
  TPU_CHECK(src.weight.defined() && src.weight.dim() == 2 && is_floating(src.weight.dtype()),
            "QuantizedLinear: the source must be a Linear with a float weight");
  in_features = src.weight.size(1);
  NoGradGuard ng;
  const Tensor w = src.weight.detach();
  if (k == WeightQuant::int8) {
    Int8Weight q = quantize_int8(w);
    weight = std::move(q.q);
    weight_scale = std::move(q.scale);
  } else if (k == WeightQuant::fp8) {
    Fp8Weight q = quantize_fp8(w);
    weight = std::move(q.q);
    weight_scale = std::move(q.scale);
  } else {
    TPU_CHECK(in_features % g == 0,
              "QuantizedLinear: in_features {} is not a multiple of the int4 group size {} (weight {})", in_features, g,
              w.shape().str());
    Int4Weight q = quantize_int4(w, g, DType::f16);  // f16 group scales: Q4_0's bytes per weight
    weight = std::move(q.q);
    weight_scale = std::move(q.scale);
    group = g;
  }
  register_buffer("weight", weight);
  register_buffer("weight_scale", weight_scale);
  if (src.bias.defined()) {
    bias = src.bias.detach();
    register_parameter("bias", bias, false);
  }
}

QuantizedLinear::QuantizedLinear(Tensor q, Tensor scale, Tensor b, int64_t bn, int64_t bk)
    : kind(WeightQuant::fp8), block_n(bn), block_k(bk) {
  TPU_CHECK(q.defined() && q.dim() == 2 && q.dtype() == DType::u8, "QuantizedLinear: fp8 weight bytes must be u8 "
            "[out, in], got {}", q.defined() ? q.shape().str() : std::string("undefined"));
  TPU_CHECK(bn >= 0 && bk >= 0 && (bn > 0) == (bk > 0), "QuantizedLinear: fp8 scale blocks {}x{} must both be "
            "positive (or both 0 for per-row scales)", bn, bk);
  if (bn > 0) {
    const Shape want{(q.size(0) + bn - 1) / bn, (q.size(1) + bk - 1) / bk};
    TPU_CHECK(scale.defined() && scale.dtype() == DType::f32 && scale.shape() == want,
              "QuantizedLinear: fp8 block scales for blocks of {}x{} over a weight of {} must be f32 {}, got {} {}", bn,
              bk, q.shape().str(), want.str(), scale.defined() ? dtype_name(scale.dtype()) : "undefined",
              scale.defined() ? scale.shape().str() : std::string());
  } else {
    TPU_CHECK(scale.defined() && scale.dtype() == DType::f32 && scale.dim() == 1 && scale.size(0) == q.size(0),
              "QuantizedLinear: fp8 scales must be f32 [{}]", q.size(0));
  }
  TPU_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == q.size(0)), "QuantizedLinear: the bias must be [{}]",
            q.size(0));
  in_features = q.size(1);
  weight = std::move(q);
  weight_scale = std::move(scale);
  register_buffer("weight", weight);
  register_buffer("weight_scale", weight_scale);
  if (b.defined()) {
    bias = b.detach();
    register_parameter("bias", bias, false);
  }
}

Tensor QuantizedLinear::forward(const Tensor& x) {
  TPU_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_features,
            "QuantizedLinear: expected an input with {} features in the last dim, got shape {}", in_features,
            x.defined() ? x.shape().str() : std::string("undefined"));
  Tensor y = kind == WeightQuant::int8  ? linear_int8(x, weight, weight_scale)
             : kind == WeightQuant::fp8 ? (block_n > 0 ? linear_fp8(x, weight, weight_scale, block_n, block_k)
                                                       : linear_fp8(x, weight, weight_scale))
                                        : linear_int4(x, weight, weight_scale);
  return bias.defined() ? add(y, bias.to(y.dtype())) : y;
}

void quantize_linear(Module& parent, const std::string& name, std::shared_ptr<Linear>& slot, WeightQuant kind,
                     int64_t group) {
  if (kind == WeightQuant::none || !slot || dynamic_cast<QuantizedLinear*>(slot.get())) return;
  auto q = std::make_shared<QuantizedLinear>(*slot, kind, group);
  parent.replace_child(name, q);
  slot = std::move(q);
}

}  // namespace tpu::nn
