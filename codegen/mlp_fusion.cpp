#include "codegen/mlp_fusion.h"

#include <fmt/format.h>

#include "codegen/launch.h"
#include "codegen/matmul_plan.h"
#include "codegen/mlp_kernel.h"
#include "codegen/operand_layout.h"
#include "codegen/region_expr.h"
#include "codegen/sim_tensors.h"
#include "device/sim_driver.h"

namespace tpu::codegen {
namespace {

using graph::Graph;
using graph::Node;
using graph::Region;
using graph::ValueId;

// The region whose first node is the only reader of v (a linear taking v as its input), or null.
const Region* consumer_linear_region(const Graph& g, ValueId v) {
  for (ValueId o : g.outputs)
    if (o == v) return nullptr;
  const Node* user = nullptr;
  int32_t user_index = -1;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.dead) continue;
    for (ValueId in : n.inputs)
      if (in == v) {
        if (user && user != &n) return nullptr;
        user = &n;
        user_index = int32_t(i);
      }
  }
  if (!user || user->op->name != "linear" || user->inputs[0] != v || user->inputs[1] == v || user->region < 0)
    return nullptr;
  const Region& r2 = g.regions[size_t(user->region)];
  if (r2.kind != graph::RegionKind::matmul_epilogue || r2.nodes.empty() || r2.nodes[0] != user_index ||
      r2.outputs.size() != 1)
    return nullptr;
  return &r2;
}

}  // namespace

bool run_mlp_pair(const Graph& g, const Region& r1, std::vector<Tensor>& vals) {
  const Node& l1 = g.nodes[size_t(r1.nodes[0])];
  if (l1.op->name != "linear" || r1.outputs.size() != 1) return false;
  const ValueId hv = r1.outputs[0];
  const Region* r2 = consumer_linear_region(g, hv);
  if (!r2) return false;
  const Node& l2 = g.nodes[size_t(r2->nodes[0])];
  const graph::ValueMeta& hm = g.meta(hv);
  const graph::ValueMeta& om = g.meta(r2->outputs[0]);
  if (!(hm.shape == g.meta(l1.outputs[0]).shape) || !(om.shape == g.meta(l2.outputs[0]).shape)) return false;
  // First linear (its bias in the epilogue) and the rest of its region.
  std::vector<Tensor> ins1;
  for (ValueId v : l1.inputs) {
    if (!vals[size_t(v)].defined()) return false;
    ins1.push_back(vals[size_t(v)]);
  }
  auto p1 = plan_matmul("linear", ins1, l1.attrs, g.meta(l1.outputs[0]).shape, g.meta(l1.outputs[0]).dtype);
  if (!p1 || !p1->spec.b_transposed || p1->spec.batch != 1) return false;
  MlpSpec s;
  s.m = p1->spec.m;
  s.k1 = p1->spec.k;
  s.n1 = p1->spec.n;
  s.dtype = p1->spec.a_dtype;
  s.mode = p1->spec.mode;
  if (hm.dtype != ins1[0].dtype()) return false;  // the kernel keeps H in the inputs' dtype
  s.epi1 = p1->spec.epilogue;
  s.epi1_inputs = p1->spec.epilogue_inputs;
  // One row (a single token): a bias laid out as the full [1, n1] matrix is the row vector.
  for (EwInput& in : s.epi1_inputs)
    if (s.m == 1 && in.layout == EwLayout::full) in.layout = EwLayout::row;
  std::vector<Tensor> args1 = p1->epilogue_args;
  RegionExprBuilder e1{g, vals, hm.shape, hm.device, s.epi1, s.epi1_inputs, args1};
  e1.first_input = 1;
  e1.known[l1.outputs[0]] = e1.round_as_eager(l1.outputs[0], p1->spec.epilogue.result);
  for (size_t i = 1; i < r1.nodes.size(); ++i)
    if (!e1.add(g.nodes[size_t(r1.nodes[i])])) return false;
  auto h_ref = e1.known.find(hv);
  if (h_ref == e1.known.end()) return false;
  s.epi1.result = h_ref->second;
  // Second linear: w2 [n2, n1] contiguous, bias, then its region's epilogue.
  const Tensor& w2 = vals[size_t(l2.inputs[1])];
  if (!w2.defined() || !w2.is_contiguous() || w2.dtype() != ins1[0].dtype() || w2.dim() != 2 ||
      w2.shape()[1] != s.n1 || w2.device() != hm.device)
    return false;
  s.n2 = w2.shape()[0];
  std::vector<Tensor> args2;
  VecRef acc = s.epi2.input(0);
  s.epi2.result = acc;
  if (l2.attrs.get_bool("has_bias")) {
    const Tensor& b2 = vals[size_t(l2.inputs[2])];
    if (!b2.defined()) return false;
    auto lo = lay_out(b2, om.shape, om.device);
    if (!lo) return false;
    s.epi2_inputs.push_back(lo->in);
    args2.push_back(lo->t);
    s.epi2.result = s.epi2.op(sim::Op::vadd, acc, s.epi2.input(1));
  }
  RegionExprBuilder e2{g, vals, om.shape, om.device, s.epi2, s.epi2_inputs, args2};
  e2.first_input = 1;
  e2.known[l2.outputs[0]] = e2.round_as_eager(l2.outputs[0], s.epi2.result);
  for (size_t i = 1; i < r2->nodes.size(); ++i)
    if (!e2.add(g.nodes[size_t(r2->nodes[i])])) return false;
  auto o_ref = e2.known.find(r2->outputs[0]);
  if (o_ref == e2.known.end()) return false;
  s.epi2.result = o_ref->second;
  if (om.dtype != DType::f32 && om.dtype != DType::bf16) return false;
  s.out_dtype = om.dtype == DType::bf16 ? sim::DType::bf16 : sim::DType::f32;
  const Device dev = om.device;
  const sim::ChipConfig& cfg = chip_config(dev);
  if (mlp_registers(s) > cfg.scalar.registers) return false;
  auto tiling = choose_mlp_tiling(cfg, s);
  if (!tiling) return false;
  Tensor out = ops::empty_tensor(om.shape, om.dtype, om.device);
  std::vector<int64_t> args{hbm_address(p1->a), hbm_address(p1->b), hbm_address(w2)};
  for (const Tensor& t : args1) args.push_back(hbm_address(t));
  for (const Tensor& t : args2) args.push_back(hbm_address(t));
  args.push_back(hbm_address(out));
  const std::string key = fmt::format("{}|{}|{}", mlp_key(s), e1.key, e2.key);
  const LoadedProgram& lp = cached_program(dev, key, [&] { return make_mlp_program(cfg, s, *tiling); });
  launch(dev, lp, "region:mlp", std::move(args));
  vals[size_t(r2->outputs[0])] = out;
  return true;
}

}  // namespace tpu::codegen
