#include "codegen/region_runner.h"

#include <unordered_map>

#include <fmt/format.h>

#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "codegen/matmul_plan.h"
#include "codegen/mlp_fusion.h"
#include "codegen/operand_layout.h"
#include "codegen/region_expr.h"
#include "codegen/rowwise_region.h"
#include "codegen/sim_tensors.h"
#include "device/sim_driver.h"
#include "ops/fallback.h"

namespace tpu::codegen {
namespace {

using graph::Graph;
using graph::Node;
using graph::Region;
using graph::ValueId;

bool region_on_sim(const Graph& g, const Region& r) {
  for (ValueId v : r.outputs)
    if (g.meta(v).device.type != DeviceType::sim) return false;
  return r.outputs.size() == 1;
}

bool run_elementwise_region(const Graph& g, const Region& r, std::vector<Tensor>& vals) {
  const ValueId outv = r.outputs[0];
  const graph::ValueMeta& om = g.meta(outv);
  if (!(om.shape == r.domain) || om.shape.numel() == 0) return false;
  const auto odt = chip_dtype(om.dtype);
  if (!odt || om.dtype == DType::i32 || om.dtype == DType::i8) return false;
  ElementwiseSpec spec;
  std::vector<Tensor> args;
  RegionExprBuilder eb{g, vals, om.shape, om.device, spec.expr, spec.inputs, args};
  for (int32_t ni : r.nodes)
    if (!eb.add(g.nodes[size_t(ni)])) return false;
  auto it = eb.known.find(outv);
  if (it == eb.known.end()) return false;
  spec.expr.result = it->second;
  spec.out_dtype = *odt;
  spec.name = "region";
  const int dev = om.device.index;
  const sim::ChipConfig& cfg = device::sim_device(dev).config();
  fold_domain(spec, om.shape, cfg);
  Tensor out = ops::empty_tensor(om.shape, om.dtype, om.device);
  std::vector<int64_t> a;
  for (const Tensor& t : args) a.push_back(hbm_address(t));
  a.push_back(hbm_address(out));
  const std::string key = "region:" + eb.key + elementwise_key(spec);
  const LoadedProgram& p = cached_program(dev, key, [&] { return make_elementwise_program(cfg, spec); });
  launch(dev, p, "region:elementwise", std::move(a));
  vals[size_t(outv)] = out;
  return true;
}

bool run_matmul_region(const Graph& g, const Region& r, std::vector<Tensor>& vals) {
  const Node& mm = g.nodes[size_t(r.nodes[0])];
  if (mm.op->name != "matmul" && mm.op->name != "linear") return false;
  const ValueId outv = r.outputs[0];
  const graph::ValueMeta& om = g.meta(outv);
  const graph::ValueMeta& mmo = g.meta(mm.outputs[0]);
  if (!(om.shape == mmo.shape) || om.shape.numel() == 0) return false;
  std::vector<Tensor> ins;
  for (ValueId v : mm.inputs) {
    if (!vals[size_t(v)].defined()) return false;
    ins.push_back(vals[size_t(v)]);
  }
  auto plan = plan_matmul(mm.op->name, ins, mm.attrs, mmo.shape, mmo.dtype);
  if (!plan) return false;
  MatmulSpec& s = plan->spec;
  // Epilogue operands are laid out against the [M, N] view of each batch's output.
  RegionExprBuilder eb{g, vals, mmo.shape, om.device, s.epilogue, s.epilogue_inputs, plan->epilogue_args};
  eb.first_input = 1;  // input 0 is the accumulator; the bias (if any) is already inputs[0]
  eb.known[mm.outputs[0]] = plan->value;
  for (size_t i = 1; i < r.nodes.size(); ++i)
    if (!eb.add(g.nodes[size_t(r.nodes[i])])) return false;
  auto it = eb.known.find(outv);
  if (it == eb.known.end()) return false;
  const auto odt = chip_dtype(om.dtype);
  if (!odt || (om.dtype != DType::f32 && om.dtype != DType::bf16)) return false;
  s.epilogue.result = it->second;
  s.out_dtype = *odt;
  s.name = "region_matmul";
  Tensor out = ops::empty_tensor(om.shape, om.dtype, om.device);
  run_matmul_plan(*plan, out, "region:matmul");
  vals[size_t(outv)] = out;
  return true;
}

}  // namespace

bool run_region_on_chip(const Graph& g, const Region& r, std::vector<Tensor>& vals) {
  if (!region_on_sim(g, r)) return false;
  if (vals[size_t(r.outputs[0])].defined()) return true;  // computed with its producer (MlpKernel)
  switch (r.kind) {
    case graph::RegionKind::elementwise: return run_elementwise_region(g, r, vals);
    case graph::RegionKind::matmul_epilogue: return run_mlp_pair(g, r, vals) || run_matmul_region(g, r, vals);
    case graph::RegionKind::rowwise: return run_rowwise_region(g, r, vals);
  }
  return false;
}

}  // namespace tpu::codegen
