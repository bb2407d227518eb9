#include "codegen/rowwise_region.h"

#include <fmt/format.h>

#include "codegen/launch.h"
#include "codegen/region_expr.h"
#include "codegen/rowwise_kernel.h"
#include "codegen/sim_tensors.h"
#include "device/sim_driver.h"

namespace tpu::codegen {
namespace {


std::optional<RowOp> row_op_of(const std::string& name) {
  if (name == "softmax") return RowOp::softmax;
  if (name == "log_softmax") return RowOp::log_softmax;
  if (name == "layer_norm") return RowOp::layer_norm;
  if (name == "rms_norm") return RowOp::rms_norm;
  return std::nullopt;
}

}  // namespace

int rowwise_op_position(const graph::Graph& g, const graph::Region& r) {
  int k = -1;
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    if (!row_op_of(g.nodes[size_t(r.nodes[i])].op->name)) continue;
    if (k >= 0) return -1;  // one row op per kernel
    k = int(i);
  }
  return k;
}

bool run_rowwise_region(const graph::Graph& g, const graph::Region& r, std::vector<Tensor>& vals, Tensor out) {
  const int k = rowwise_op_position(g, r);
  if (k < 0) return false;
  const RowOp op = *row_op_of(g.nodes[size_t(r.nodes[size_t(k)])].op->name);
  const graph::Node& rn = g.nodes[size_t(r.nodes[size_t(k)])];
  const graph::ValueId xv = rn.inputs[0], yv = rn.outputs[0], outv = r.outputs[0];
  const graph::ValueMeta &xm = g.meta(xv), &om = g.meta(outv);
  if (!(xm.shape == om.shape) || !(g.meta(yv).shape == om.shape) || om.shape.numel() == 0 || xm.shape.ndim() == 0)
    return false;
  if (!float_chip(om.dtype) || !float_chip(g.meta(yv).dtype)) return false;
  int64_t C = xm.shape[xm.shape.ndim() - 1];
  if (op == RowOp::layer_norm || op == RowOp::rms_norm) {
    C = 1;
    for (int64_t d : rn.attrs.get_ints("normalized_shape")) C *= d;
  }
  if (C == 0) return false;
  RowwiseSpec s{.op = op, .rows = om.shape.numel() / C, .cols = C};
  const Device dev = om.device;
  std::vector<Tensor> args, keep;
  std::string key;
  // Prologue: the nodes before the row op compute x.
  if (k > 0) {
    s.has_prologue = true;
    s.in_dtype = sim::DType::f32;
    RegionExprBuilder pb{g, vals, xm.shape, dev, s.prologue, s.pro_inputs, args};
    for (int i = 0; i < k; ++i)
      if (!pb.add(g.nodes[size_t(r.nodes[size_t(i)])])) return false;
    auto it = pb.known.find(xv);
    if (it == pb.known.end()) return false;
    s.prologue.result = it->second;
    key += pb.key;
  } else {
    const Tensor& x = vals[size_t(xv)];
    if (!x.defined() || !float_chip(x.dtype()) || x.device() != dev) return false;
    auto c = materialize_on_device(x);
    if (!c) return false;
    args.push_back(*c);
    s.in_dtype = cd(x.dtype());
  }
  // Parameters of the norms.
  if (op == RowOp::layer_norm || op == RowOp::rms_norm) {
    s.eps = float(rn.attrs.get_float("eps"));
    s.has_weight = rn.attrs.get_bool("has_weight");
    s.has_bias = op == RowOp::layer_norm && rn.attrs.get_bool("has_bias");
    DType pt = DType::f32;
    for (int i = 1; i <= 2; ++i) {
      if ((i == 1 && !s.has_weight) || (i == 2 && !s.has_bias)) continue;
      const Tensor& p = vals[size_t(rn.inputs[size_t(i)])];
      if (!p.defined() || !float_chip(p.dtype()) || p.device() != dev) return false;
      if (i == 2 && s.has_weight && p.dtype() != pt) return false;
      pt = p.dtype();
      auto c = materialize_on_device(p);
      if (!c) return false;
      args.push_back(*c);
    }
    s.param_dtype = cd(pt);
  }
  // Epilogue: the nodes after it, with y as input 0.
  if (size_t(k) + 1 < r.nodes.size()) {
    s.has_epilogue = true;
    std::vector<Tensor> epi_args;
    RegionExprBuilder eb{g, vals, om.shape, dev, s.epilogue, s.epi_inputs, epi_args};
    eb.first_input = 1;
    eb.known[yv] = eb.round_as_eager(yv, s.epilogue.input(0));
    for (size_t i = size_t(k) + 1; i < r.nodes.size(); ++i)
      if (!eb.add(g.nodes[size_t(r.nodes[i])])) return false;
    auto it = eb.known.find(outv);
    if (it == eb.known.end()) return false;
    s.epilogue.result = it->second;
    args.insert(args.end(), epi_args.begin(), epi_args.end());
    key += "|" + eb.key;
  } else if (outv != yv) {
    return false;
  }
  s.out_dtype = cd(om.dtype);
  const sim::ChipConfig& cfg = chip_config(dev);
  if (rowwise_tile_rows(cfg, s) == 0) return false;
  if (rowwise_registers(s) > cfg.scalar.registers) return false;  // runs node by node
  if (!out.defined()) out = ops::empty_tensor(om.shape, om.dtype, dev);
  std::vector<int64_t> a;
  for (const Tensor& t : args) a.push_back(hbm_address(t));
  a.push_back(hbm_address(out));
  const LoadedProgram& lp =
      cached_program(dev, "region:" + key + rowwise_key(s), [&] { return make_rowwise_program(cfg, s); });
  launch(dev, lp, "region:rowwise", std::move(a));
  vals[size_t(outv)] = out;
  return true;
}

}  // namespace tpu::codegen
