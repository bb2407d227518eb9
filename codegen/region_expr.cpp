#include "codegen/region_expr.h"

#include <fmt/format.h>

#include "codegen/lowering.h"
#include "codegen/operand_layout.h"
#include "codegen/sim_tensors.h"

namespace tpu::codegen {
namespace {
bool float_or_bool(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::boolean; }
}  // namespace

std::optional<VecRef> RegionExprBuilder::ref(graph::ValueId v) {
  if (auto it = known.find(v); it != known.end()) return it->second;
  const Tensor& t = vals[size_t(v)];
  if (!t.defined()) return std::nullopt;
  // A 0-d host number becomes an immediate of the program (part of its cache key), except a
  // runtime input of the graph (a number argument such as the learning rate): that one is
  // copied to the device and read as a scalar operand, so a new value reuses the program.
  const bool runtime_number = g.values[size_t(v)].kind == graph::ValueKind::input && float_or_bool(t.dtype());
  if (t.dim() == 0 && t.device().is_cpu() && !runtime_number) {
    const double x = t.to(DType::f32).to_vector<float>()[0];
    key += fmt::format("c{:a},", x);
    return known[v] = VecExpr::imm(float(x));
  }
  if (!float_or_bool(t.dtype())) return std::nullopt;
  auto lo = lay_out(t, domain, dev);
  if (!lo) return std::nullopt;
  const VecRef r = e.input(first_input + int(inputs.size()));
  inputs.push_back(lo->in);
  args.push_back(lo->t);
  return known[v] = r;
}

VecRef RegionExprBuilder::round_as_eager(graph::ValueId v, VecRef r) {
  // Under emulate_precision_casts a bf16 value is rounded where eager would have stored it (the
  // chip has no f16: such regions never lower). A rounded value that is also a region output is
  // stored by the same vmov.
  if (g.emulate_precision_casts && g.meta(v).dtype == DType::bf16) return e.round_bf16(r);
  return r;
}

bool RegionExprBuilder::add(const graph::Node& n) {
  // Inside a region `contiguous` is the identity: the region reads its input through its
  // layout and writes a fresh output.
  if (n.op->name == "contiguous" && n.inputs.size() == 1 && n.outputs.size() == 1 &&
      g.meta(n.inputs[0]).dtype == g.meta(n.outputs[0]).dtype) {
    auto r = ref(n.inputs[0]);
    if (!r) return false;
    key += "contiguous;";
    known[n.outputs[0]] = *r;
    return true;
  }
  const Lowering* rule = lowering_of(*n.op);
  if (!rule || !rule->elementwise || n.outputs.size() != 1) return false;
  const DType out = g.meta(n.outputs[0]).dtype;
  if (out == DType::i32 || out == DType::i8 || !chip_dtype(out)) return false;
  std::vector<VecRef> in;
  for (graph::ValueId v : n.inputs) {
    if (!rule->int_inputs_ok && !float_or_bool(g.meta(v).dtype)) return false;
    auto r = ref(v);
    if (!r) return false;
    in.push_back(*r);
  }
  DType in_dtype = n.inputs.empty() ? out : g.meta(n.inputs[0]).dtype;
  if (n.inputs.size() > 1 && in_dtype == DType::boolean) in_dtype = g.meta(n.inputs[1]).dtype;
  VecRef r;
  if (!rule->elementwise(e, in, n.attrs, in_dtype, r)) return false;
  key += fmt::format("{}[{}];", n.op->name, n.attrs.str());
  known[n.outputs[0]] = round_as_eager(n.outputs[0], r);
  return true;
}

}  // namespace tpu::codegen
