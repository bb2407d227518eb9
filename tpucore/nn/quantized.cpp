#include "tpucore/nn/quantized.h"

#include <typeinfo>

#include "tpucore/autograd.h"
#include "tpucore/nn/fused_path.h"

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

namespace {

// x times the quantized weight w (int8, fp8 with per-row or, with block_n / block_k, block
// scales, or int4) plus the float bias when defined: QuantizedLinear's product, for one layer or a
// pack of them.
Tensor quantized_product(WeightQuant kind, const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& bias,
                         int64_t block_n, int64_t block_k) {
  Tensor y = kind == WeightQuant::int8  ? linear_int8(x, w, scale)
             : kind == WeightQuant::fp8 ? (block_n > 0 ? linear_fp8(x, w, scale, block_n, block_k)
                                                       : linear_fp8(x, w, scale))
                                        : linear_int4(x, w, scale);
  return bias.defined() ? add(y, bias.to(y.dtype())) : y;
}

}  // namespace

Tensor QuantizedLinear::forward(const Tensor& x) {
  TPU_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_features,
            "QuantizedLinear: expected an input with {} features in the last dim, got shape {}", in_features,
            x.defined() ? x.shape().str() : std::string("undefined"));
  return quantized_product(kind, x, weight, weight_scale, bias, block_n, block_k);
}

namespace {

// The exact QuantizedLinear (a subclass may compute otherwise), or null.
QuantizedLinear* plain_quantized(Linear* l) {
  return l != nullptr && typeid(*l) == typeid(QuantizedLinear) ? static_cast<QuantizedLinear*>(l) : nullptr;
}

// Whether t is rows [r0, r0 + n) of the packed tensor p (same storage, offset, strides).
bool views_rows(const Tensor& t, const Tensor& p, int64_t r0, int64_t n) {
  if (!t.defined() || t.storage() != p.storage() || t.dim() != p.dim() || t.strides() != p.strides()) return false;
  if (t.size(0) != n || t.offset() != p.offset() + r0 * p.strides()[0]) return false;
  for (int d = 1; d < p.dim(); ++d)
    if (t.size(d) != p.size(d)) return false;
  return true;
}

}  // namespace

PackedProjections pack_projections(const std::vector<Linear*>& parts) {
  if (parts.size() < 2) return {};
  std::vector<QuantizedLinear*> q;
  for (Linear* l : parts) {
    QuantizedLinear* ql = plain_quantized(l);
    if (ql == nullptr || ql->block_n != 0 || !ql->weight.defined() || !ql->weight_scale.defined() ||
        !ql->weight.device().is_cpu())
      return {};
    q.push_back(ql);
  }
  const QuantizedLinear& a = *q[0];
  for (const QuantizedLinear* ql : q)
    if (ql->kind != a.kind || ql->group != a.group || ql->in_features != a.in_features ||
        ql->weight.dtype() != a.weight.dtype() || ql->weight_scale.dtype() != a.weight_scale.dtype() ||
        ql->weight.dim() != 2 || ql->weight.size(1) != a.weight.size(1) ||
        ql->weight_scale.dim() != a.weight_scale.dim() || ql->weight_scale.size(0) != ql->weight.size(0) ||
        (a.weight_scale.dim() == 2 && ql->weight_scale.size(1) != a.weight_scale.size(1)) ||
        ql->bias.defined() != a.bias.defined() ||
        (a.bias.defined() && (ql->bias.dtype() != a.bias.dtype() || ql->bias.dim() != 1)))
      return {};
  NoGradGuard ng;
  std::vector<Tensor> w, s, b;
  PackedProjections p;
  for (const QuantizedLinear* ql : q) {
    w.push_back(ql->weight);
    s.push_back(ql->weight_scale);
    if (ql->bias.defined()) b.push_back(ql->bias);
    p.rows.push_back(ql->weight.size(0));
  }
  p.weight = cat(w, 0);
  p.weight_scale = cat(s, 0);
  if (!b.empty()) p.bias = cat(b, 0);
  int64_t r0 = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    const int64_t n = p.rows[i];
    q[i]->weight = narrow(p.weight, 0, r0, n);
    q[i]->weight_scale = narrow(p.weight_scale, 0, r0, n);
    if (p.bias.defined()) q[i]->bias = narrow(p.bias, 0, r0, n);
    r0 += n;
  }
  return p;
}

std::vector<Tensor> packed_forward(const PackedProjections& pack, const std::vector<Linear*>& parts,
                                   const Tensor& x) {
  if (!pack.defined() || parts.size() != pack.rows.size() || !detail::fused_path_ok({&x})) return {};
  int64_t r0 = 0;
  const QuantizedLinear* first = plain_quantized(parts[0]);
  for (size_t i = 0; i < parts.size(); ++i) {
    const QuantizedLinear* ql = plain_quantized(parts[i]);
    const int64_t n = pack.rows[i];
    if (ql == nullptr || ql->has_forward_hooks() || ql->kind != first->kind || ql->group != first->group ||
        !views_rows(ql->weight, pack.weight, r0, n) || !views_rows(ql->weight_scale, pack.weight_scale, r0, n) ||
        ql->bias.defined() != pack.bias.defined() || (pack.bias.defined() && !views_rows(ql->bias, pack.bias, r0, n)))
      return {};
    r0 += n;
  }
  if (x.dim() < 1 || x.size(-1) != first->in_features) return {};  // the parts' own check reports it
  // Packing takes per-row fp8 scales only (block_n == 0).
  const Tensor y = quantized_product(first->kind, x, pack.weight, pack.weight_scale, pack.bias, 0, 0);
  std::vector<Tensor> out;
  r0 = 0;
  for (const int64_t n : pack.rows) {
    out.push_back(narrow(y, -1, r0, n));
    r0 += n;
  }
  return out;
}

void quantize_linear(Module& parent, const std::string& name, std::shared_ptr<Linear>& slot, WeightQuant kind,
                     int64_t group) {
  if (kind == WeightQuant::none || !slot || dynamic_cast<QuantizedLinear*>(slot.get())) return;
  auto q = std::make_shared<QuantizedLinear>(*slot, kind, group);
  parent.replace_child(name, q);
  slot = std::move(q);
}

}  // namespace tpu::nn
