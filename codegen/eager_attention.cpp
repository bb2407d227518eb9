// scaled_dot_product_attention on sim tensors: one AttentionKernel program (bf16 inputs on the
// MXUs in bf16 mode, f32 inputs in the exact f32 mode). q/k/v views are read in place when their
// last dim is contiguous (e.g. heads split out of a projection by reshape + transpose); other
// views are made contiguous on the device first. A bool mask is read as bytes, broadcast over
// batch/head dims and queries in place (other broadcasts are expanded on the device first); a
// query row with every key masked gives NaN, as on the cpu and in PyTorch. Declines (host
// fallback): dtypes other than f32/bf16, a scale <= 0, no keys, an empty head dim. A single
// query over grouped KV heads (a decode step) runs with the group's heads folded into query rows
// (decode_attention.h) and is named "decode_attention" in the stats and the profiler. On a
// megacore device the KV heads are split between the TensorCores (attention_cores).
#include <cmath>

#include <fmt/format.h>

#include "codegen/attention_kernel.h"
#include "codegen/cached_attention.h"
#include "codegen/decode_attention.h"
#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "codegen/megacore.h"
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

// An arithmetic progression from 0 (offsets of evenly strided heads).
bool uniform_from_zero(const std::vector<int64_t>& off) {
  for (size_t i = 0; i < off.size(); ++i)
    if (off[i] != int64_t(i) * (off.size() > 1 ? off[1] : 0)) return false;
  return true;
}

// Megacore: the KV heads (each with its group of query heads) split between the TensorCores
// when every operand's heads are evenly strided (so a core's heads are the first ones of the
// spec with its registers advanced) and the kernel is long enough to pay.
int attention_cores(const sim::ChipConfig& cfg, const AttentionSpec& s) {
  const int64_t kvh = s.heads / s.group;
  if (kvh < 2 || s.heads % s.group != 0) return 1;
  if (!uniform_from_zero(s.q_off) || !uniform_from_zero(s.k_off) || !uniform_from_zero(s.v_off) ||
      (s.has_mask && !uniform_from_zero(s.m_off)))
    return 1;
  const double macs = double(s.heads) * double(s.lq) * double(s.lk) * double(s.d + s.dv) / (s.causal ? 2.0 : 1.0);
  const double one_core = macs / (double(cfg.mxu.count) * double(cfg.mxu.rows) * double(cfg.mxu.cols));
  return megacore_cores(cfg, one_core);
}

}  // namespace

bool flash_attention_on_chip(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& mask_in,
                             const Tensor& out, double scale, bool causal, int64_t window, int64_t q_pos0,
                             double softcap) {
  const DType dt = out.dtype();
  if (dt != DType::f32 && dt != DType::bf16) return false;
  if (out.numel() == 0) return true;
  const int n = q0.dim();
  if (!(scale > 0) || k0.size(-2) == 0 || q0.size(-1) == 0 || window < 0 || softcap < 0 || (causal && q_pos0 != 0))
    return false;
  auto q = rows_operand(q0), kk = rows_operand(k0), v = rows_operand(v0);
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
  s.causal = causal;
  s.window = window;
  s.q_pos0 = q_pos0;
  s.softcap = float(softcap);
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
  if (mask_in.defined()) {
    Shape scores = q->shape();
    scores[n - 1] = s.lk;
    const Tensor m = mask_in.expand(scores);
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
  const int cores = decode ? 1 : attention_cores(cfg, s);
  const LoadedProgram& p = cached_program(dev, attention_key(s) + fmt::format(":cores{}", cores), [&] {
    if (cores == 1) return make_attention_program(cfg, s);
    // Whole KV heads (with their query heads) per core: each core's registers advance to its
    // first head; its program is the spec of its heads (offsets from its first).
    const int64_t es = sim::dtype_size(s.dtype), kvh = s.heads / s.group;
    std::vector<RowOperand> regs{{0, (s.heads > s.group ? s.q_off[size_t(s.group)] : 0) * es},
                                 {1, (kvh > 1 ? s.k_off[1] : 0) * es},
                                 {2, (kvh > 1 ? s.v_off[1] : 0) * es},
                                 {3, s.group * s.lq * s.dv * es}};
    if (s.has_mask) regs.push_back({4, s.heads > s.group ? s.m_off[size_t(s.group)] : 0});
    return split_rows("sdpa", cores, kvh, 1, regs, [&](int64_t n) {
      AttentionSpec part = s;
      part.heads = n * s.group;
      part.q_off.resize(size_t(part.heads));
      part.k_off.resize(size_t(n));
      part.v_off.resize(size_t(n));
      if (s.has_mask) part.m_off.resize(size_t(part.heads));
      return make_attention_program(cfg, part);
    });
  });
  std::vector<int64_t> args{hbm_address(*q), hbm_address(*kk), hbm_address(*v), hbm_address(out)};
  if (mask) args.push_back(hbm_address(*mask));
  launch(dev, p, decode ? "decode_attention" : "scaled_dot_product_attention", std::move(args));
  return true;
}

namespace {

bool sdpa_eager(const ops::KernelArgs& k) {
  return flash_attention_on_chip(k.inputs[0], k.inputs[1], k.inputs[2],
                                 k.attrs.get_bool("has_mask") ? k.inputs[3] : Tensor(), k.outputs[0],
                                 k.attrs.get_float("scale"), k.attrs.get_bool("causal"));
}

const Lowering kSdpaRule{.eager = &sdpa_eager};

[[maybe_unused]] const bool g_sdpa_rules_installed = (install_lowering("scaled_dot_product_attention", &kSdpaRule), true);

}  // namespace
}  // namespace tpu::codegen
