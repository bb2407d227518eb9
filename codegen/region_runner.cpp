#include "codegen/region_runner.h"

#include <algorithm>
#include <optional>
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

// Regions with several outputs lower too: elementwise ones as one program that stores them all,
// matmul and rowwise ones as two programs (see run_head_then_elementwise).
bool region_on_sim(const Graph& g, const Region& r) {
  if (r.outputs.empty()) return false;
  for (ValueId v : r.outputs)
    if (!runs_generated_programs(g.meta(v).device)) return false;
  return true;
}

// One ElementwiseKernel for the region: its spec, device operands and cache key.
struct ElementwisePlan {
  ElementwiseSpec spec;
  std::vector<Tensor> args;
  std::string key;
};

// Every output must span the region's domain on the same device (else nullopt: the region
// runs node by node). Values read from outside must be in `vals`.
std::optional<ElementwisePlan> plan_elementwise_region(const Graph& g, const Region& r, std::vector<Tensor>& vals) {
  const graph::ValueMeta& om = g.meta(r.outputs[0]);
  if (!(om.shape == r.domain) || om.shape.numel() == 0) return std::nullopt;
  std::vector<sim::DType> odts;
  for (ValueId v : r.outputs) {
    const graph::ValueMeta& m = g.meta(v);
    if (!(m.shape == om.shape) || m.device != om.device) return std::nullopt;
    const auto odt = chip_dtype(m.dtype);
    if (!odt || m.dtype == DType::i32 || m.dtype == DType::i8) return std::nullopt;
    odts.push_back(*odt);
  }
  ElementwisePlan plan;
  ElementwiseSpec& spec = plan.spec;
  RegionExprBuilder eb{g, vals, om.shape, om.device, spec.expr, spec.inputs, plan.args};
  for (int32_t ni : r.nodes)
    if (!eb.add(g.nodes[size_t(ni)])) return std::nullopt;
  for (size_t k = 0; k < r.outputs.size(); ++k) {
    auto it = eb.known.find(r.outputs[k]);
    if (it == eb.known.end()) return std::nullopt;
    if (k == 0) spec.expr.result = it->second;
    else spec.expr.extra_results.push_back(it->second);
  }
  // A region needing more registers or semaphores than the chip has runs node by node.
  const sim::ChipConfig& cfg = chip_config(om.device);
  if (!elementwise_fits(cfg, int(spec.inputs.size()), int(r.outputs.size()))) return std::nullopt;
  spec.out_dtype = odts[0];
  spec.extra_out_dtypes.assign(odts.begin() + 1, odts.end());
  spec.name = "region";
  fold_domain(spec, om.shape, cfg);
  plan.key = "region:" + eb.key + elementwise_key(spec);
  return plan;
}

void launch_elementwise_region(const Graph& g, const Region& r, const ElementwisePlan& plan, std::vector<Tensor>& vals) {
  const graph::ValueMeta& om = g.meta(r.outputs[0]);
  const Device dev = om.device;
  const sim::ChipConfig& cfg = chip_config(dev);
  std::vector<Tensor> outs;
  for (ValueId v : r.outputs) outs.push_back(ops::empty_tensor(om.shape, g.meta(v).dtype, om.device));
  std::vector<int64_t> a;
  for (const Tensor& t : plan.args) a.push_back(hbm_address(t));
  for (const Tensor& t : outs) a.push_back(hbm_address(t));
  const LoadedProgram& p = cached_program(dev, plan.key, [&] { return make_elementwise_program(cfg, plan.spec); });
  launch(dev, p, "region:elementwise", std::move(a));
  for (size_t k = 0; k < r.outputs.size(); ++k) vals[size_t(r.outputs[k])] = outs[k];
}

bool run_elementwise_region(const Graph& g, const Region& r, std::vector<Tensor>& vals) {
  auto plan = plan_elementwise_region(g, r, vals);
  if (!plan) return false;
  launch_elementwise_region(g, r, *plan, vals);
  return true;
}

// `out`: the output's tensor when the caller allocated it (else allocated here).
bool run_matmul_region(const Graph& g, const Region& r, std::vector<Tensor>& vals, Tensor out = {}) {
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
  // A cast written on a bf16 matmul's result sees the bf16 value eager computes, not the f32
  // accumulator (other epilogue ops may keep f32).
  if (g.emulate_precision_casts) {
    eb.known[mm.outputs[0]] = eb.round_as_eager(mm.outputs[0], plan->value);
  } else if (mmo.dtype == DType::bf16) {
    for (size_t i = 1; i < r.nodes.size(); ++i) {
      const Node& n = g.nodes[size_t(r.nodes[i])];
      if (n.op->name == "to_dtype" && !n.inputs.empty() && n.inputs[0] == mm.outputs[0]) {
        eb.known[mm.outputs[0]] = s.epilogue.round_bf16(plan->value);
        break;
      }
    }
  }
  for (size_t i = 1; i < r.nodes.size(); ++i)
    if (!eb.add(g.nodes[size_t(r.nodes[i])])) return false;
  auto it = eb.known.find(outv);
  if (it == eb.known.end()) return false;
  if (matmul_registers(int(s.epilogue_inputs.size())) > chip_config(om.device).scalar.registers)
    return false;  // runs node by node
  const auto odt = chip_dtype(om.dtype);
  if (!odt || (om.dtype != DType::f32 && om.dtype != DType::bf16)) return false;
  s.epilogue.result = it->second;
  s.out_dtype = *odt;
  s.name = "region_matmul";
  if (!out.defined()) out = ops::empty_tensor(om.shape, om.dtype, om.device);
  run_matmul_plan(*plan, out, "region:matmul");
  vals[size_t(outv)] = out;
  return true;
}

// A matmul or rowwise region with several outputs (e.g. a weight gradient and the optimizer's
// use of it, a log_softmax and its backward): the head (the matmul alone; the row op with its
// prologue) as its kernel with one output, then the other nodes as one multi-output
// ElementwiseKernel reading it. The tail is planned first (against the head's output buffer,
// allocated here), so a region that does not lower runs nothing.
bool run_head_then_elementwise(const Graph& g, const Region& r, std::vector<Tensor>& vals) {
  const int k = r.kind == graph::RegionKind::matmul_epilogue ? 0 : rowwise_op_position(g, r);
  if (k < 0 || size_t(k) + 1 >= r.nodes.size()) return false;
  const ValueId hv = g.nodes[size_t(r.nodes[size_t(k)])].outputs[0];
  const graph::ValueMeta& hm = g.meta(hv);
  Region head{.kind = r.kind, .nodes = {r.nodes.begin(), r.nodes.begin() + k + 1}, .domain = r.domain,
              .tile_dim_limit = r.tile_dim_limit, .inputs = {}, .outputs = {hv}};
  Region tail{.kind = graph::RegionKind::elementwise, .nodes = {r.nodes.begin() + k + 1, r.nodes.end()},
              .domain = hm.shape, .tile_dim_limit = r.tile_dim_limit, .inputs = {}, .outputs = {}};
  for (ValueId o : r.outputs) {
    if (o == hv) continue;
    const graph::Value& val = g.value(o);
    if (val.kind != graph::ValueKind::node ||
        std::find(tail.nodes.begin(), tail.nodes.end(), val.producer) == tail.nodes.end())
      return false;  // computed in the head (a prologue value)
    tail.outputs.push_back(o);
  }
  if (tail.outputs.empty() || hm.shape.numel() == 0 || !runs_generated_programs(hm.device)) return false;
  Tensor hout = ops::empty_tensor(hm.shape, hm.dtype, hm.device);
  vals[size_t(hv)] = hout;
  auto plan = plan_elementwise_region(g, tail, vals);
  const bool head_ok = plan && (r.kind == graph::RegionKind::matmul_epilogue ? run_matmul_region(g, head, vals, hout)
                                                                              : run_rowwise_region(g, head, vals, hout));
  if (!head_ok) {
    vals[size_t(hv)] = Tensor();
    return false;
  }
  launch_elementwise_region(g, tail, *plan, vals);
  return true;
}

}  // namespace

bool run_region_on_chip(const Graph& g, const Region& r, std::vector<Tensor>& vals) {
  if (!region_on_sim(g, r)) return false;
  if (r.outputs.size() == 1 && vals[size_t(r.outputs[0])].defined()) return true;  // computed with its producer (MlpKernel)
  switch (r.kind) {
    case graph::RegionKind::elementwise: return run_elementwise_region(g, r, vals);
    case graph::RegionKind::matmul_epilogue:
      if (r.outputs.size() > 1) return run_head_then_elementwise(g, r, vals);
      return run_mlp_pair(g, r, vals) || run_matmul_region(g, r, vals);
    case graph::RegionKind::rowwise:
      if (r.outputs.size() > 1) return run_head_then_elementwise(g, r, vals);
      return run_rowwise_region(g, r, vals);
  }
  return false;
}

}  // namespace tpu::codegen
