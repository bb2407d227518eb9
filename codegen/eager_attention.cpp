// scaled_dot_product_attention on sim tensors: one AttentionKernel program (bf16 inputs on the
// MXUs in bf16 mode, f32 inputs in the exact f32 mode). q/k/v views are read in place when their
// last dim is contiguous (e.g. heads split out of a projection by reshape + transpose); other
// views are made contiguous on the device first. A bool mask is read as bytes, broadcast over
// batch/head dims and queries in place (other broadcasts are expanded on the device first); a
// query row with every key masked gives NaN, as on the cpu and in PyTorch. Declines (host
// fallback): dtypes other than f32/bf16, a scale <= 0, no keys, an empty head dim. A single
// query over grouped KV heads (a decode step) runs with the group's heads folded into query rows
// (decode_attention.h) and is named "decode_attention" in the stats and the profiler.
#include <cmath>

#include "codegen/attention_kernel.h"
#include "codegen/decode_attention.h"
#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "codegen/precision.h"
#include "codegen/sim_tensors.h"
#include "device/sim_driver.h"
#include "ops/reduce_engine.h"

namespace tpu::codegen {
namespace {

// `t` with a contiguous last dim (made on the device when needed).
std::optional<Tensor> rows_operand(const Tensor& t) {
  if (t.strides()[t.dim() - 1] == 1 || t.size(-1) == 1) return t;
  return materialize_on_device(t);
}

// Element offsets of each [L, C] matrix of t's batch dims (row-major over them).
std::vector<int64_t> matrix_offsets(const Tensor& t) {
  ops::reduce::DimGroup g;
  for (int i = 0; i + 2 < t.dim(); ++i) g.add(t.shape()[i], t.strides()[i]);
  std::vector<int64_t> off(static_cast<size_t>(g.numel()));
  for (size_t b = 0; b < off.size(); ++b) off[b] = g.offset_of(int64_t(b));
  return off;
}

bool sdpa_eager(const ops::KernelArgs& k) {
  const Tensor& out = k.outputs[0];
  const DType dt = out.dtype();
  if (dt != DType::f32 && dt != DType::bf16) return false;
  if (out.numel() == 0) return true;
  const double scale = k.attrs.get_float("scale");
  const Tensor& q0 = k.inputs[0];
  const int n = q0.dim();
  if (!(scale > 0) || k.inputs[1].size(-2) == 0 || q0.size(-1) == 0) return false;
  auto q = rows_operand(k.inputs[0]), kk = rows_operand(k.inputs[1]), v = rows_operand(k.inputs[2]);
  if (!q || !kk || !v) return false;
  AttentionSpec s;
  s.name = "sdpa";
  s.lq = q->size(-2);
  s.lk = kk->size(-2);
  s.d = q->size(-1);
  s.dv = v->size(-1);
  s.heads = q->numel() / (s.lq * s.d);
  const int64_t hq = n >= 3 ? q->size(-3) : 1, hk = n >= 3 ? kk->size(-3) : 1;
  s.group = hq / hk;
  s.causal = k.attrs.get_bool("causal");
  s.scale = float(scale);
  s.dtype = dt == DType::bf16 ? sim::DType::bf16 : sim::DType::f32;
  s.mode = dt == DType::bf16 ? sim::MxuMode::bf16 : f32_matmul_mode();  // precision.h
  s.q_off = matrix_offsets(*q);
  s.k_off = matrix_offsets(*kk);
  s.v_off = matrix_offsets(*v);
  s.q_rs = q->strides()[n - 2];
  s.k_rs = kk->strides()[n - 2];
  s.v_rs = v->strides()[n - 2];
  std::optional<Tensor> mask;
  if (k.attrs.get_bool("has_mask")) {
    Shape scores = q->shape();
    scores[n - 1] = s.lk;
    const Tensor m = k.inputs[3].expand(scores);
    mask = m.strides()[n - 1] == 1 ? std::optional<Tensor>(m) : materialize_on_device(m);
    if (!mask) return false;
    s.has_mask = true;
    s.m_off = matrix_offsets(*mask);
    s.m_rs = s.lq > 1 ? mask->strides()[n - 2] : 0;
  }
  // A single query over a grouped KV cache (decode): the group's query heads become rows of
  // one head, so each cached key/value is read from HBM once per step.
  const bool decode = fold_decode_heads(s);
  const Device dev = out.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  const LoadedProgram& p = cached_program(dev, attention_key(s), [&] { return make_attention_program(cfg, s); });
  std::vector<int64_t> args{hbm_address(*q), hbm_address(*kk), hbm_address(*v), hbm_address(out)};
  if (mask) args.push_back(hbm_address(*mask));
  launch(dev, p, decode ? "decode_attention" : "scaled_dot_product_attention", std::move(args));
  return true;
}

const Lowering kSdpaRule{.eager = &sdpa_eager};

[[maybe_unused]] const bool g_installed = (install_lowering("scaled_dot_product_attention", &kSdpaRule), true);

}  // namespace
}  // namespace tpu::codegen
