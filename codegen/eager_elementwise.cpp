// Eager elementwise ops on sim tensors: inputs classified against the output (full, row vector,
// column vector, scalar; anything else is gathered contiguous on the device first), one
// ElementwiseKernel per (op, attrs, shapes, layouts, dtypes), run on the current stream.
#include <fmt/format.h>

#include "codegen/elementwise_kernel.h"
#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "codegen/operand_layout.h"
#include "codegen/sim_tensors.h"
#include "device/sim_driver.h"
#include "tpucore/ops.h"

namespace tpu::codegen {

bool eager_elementwise(const ops::KernelArgs& k, const Lowering& rule) {
  const Tensor& out = k.outputs[0];
  const Device dev = out.device();
  const auto odt = chip_dtype(out.dtype());
  if (!odt || out.dtype() == DType::i32 || out.dtype() == DType::i8) return false;  // f32 math is not integer math
  if (out.numel() == 0) return true;
  const Shape& os = out.shape();
  DType in_dtype = k.inputs.empty() ? out.dtype() : k.inputs[0].dtype();
  if (k.inputs.size() > 1 && in_dtype == DType::boolean) in_dtype = k.inputs[1].dtype();  // where(cond, a, b)
  std::vector<Tensor> keep;  // device operands (kept alive until the program is queued)
  ElementwiseSpec spec;
  spec.out_dtype = *odt;
  std::vector<int64_t> args;
  for (const Tensor& t0 : k.inputs) {
    const auto idt = chip_dtype(t0.dtype());
    if (!idt) return false;
    if (!rule.int_inputs_ok && (t0.dtype() == DType::i32 || t0.dtype() == DType::i8)) return false;
    auto lo = lay_out(t0, os, dev);
    if (!lo) return false;
    const Tensor& t = lo->t;
    const auto layout = lo->in.layout;
    keep.push_back(t);
    spec.inputs.push_back({layout, *idt});
    args.push_back(hbm_address(t));
  }
  // The op's expression. add/sub's alpha (an optimizer's step size, often new on every call)
  // is read at run time as a scalar operand, so one program serves every value.
  std::vector<VecRef> in;
  for (size_t i = 0; i < k.inputs.size(); ++i) in.push_back(spec.expr.input(int(i)));
  VecRef r;
  std::string attrs_key = k.attrs.str();
  const bool is_sub = k.op.name == "sub";
  const ops::AttrValue* alpha = (is_sub || k.op.name == "add") && k.inputs.size() == 2 ? k.attrs.find("alpha") : nullptr;
  const Scalar* alpha_value = alpha ? std::get_if<Scalar>(alpha) : nullptr;
  if (alpha_value && alpha_value->to_double() != 1.0) {
    const double a = alpha_value->to_double();
    Tensor at = scalar_tensor(is_sub ? -a : a, DType::f32).to(dev);
    keep.push_back(at);
    spec.inputs.push_back({EwLayout::scalar, sim::DType::f32});
    args.push_back(hbm_address(at));
    r = spec.expr.op(sim::Op::vfma, in[1], spec.expr.input(2), in[0]);  // a + alpha * b
    attrs_key = "alpha at run time";
  } else if (!rule.elementwise(spec.expr, in, k.attrs, in_dtype, r)) {
    return false;
  }
  spec.expr.result = r;
  const sim::ChipConfig& cfg = chip_config(out.device());
  fold_domain(spec, os, cfg);
  spec.name = k.op.name;
  args.push_back(hbm_address(out));
  const std::string key = fmt::format("{}[{}]:{}", k.op.name, attrs_key, elementwise_key(spec));
  const LoadedProgram& p = cached_program(dev, key, [&] { return make_elementwise_program(cfg, spec); });
  launch(dev, p, k.op.name, std::move(args));
  return true;
}

}  // namespace tpu::codegen
