// Quantized linear layers on chip devices (ops/quantize.cpp: linear_int8, linear_fp8): the weight
// stays quantized in HBM (one byte per value) and streams through a MatmulKernel as such; its
// per-output-channel scales multiply the f32 accumulator in the epilogue (a row vector against
// the output), with the output cast to its dtype there.
//
// Two ways, by the chip's MXU rates (sim/config.h):
// - the MXU streams the narrow type faster than bf16 (int8 on v5e / v6e / v7 / tiny, fp8 on v7):
//   the activations are quantized too (w8a8, as int8 / fp8 serving stacks run these layers):
//   per row m = max(max |x_row|, 1e-30), x times (1 / m) Q (Q = 127 for int8, 448 for e4m3)
//   goes through the MXU in its i8 / fp8 mode (rounded to the nearest integer saturated to +-127,
//   or to e4m3, on the way in), and the epilogue multiplies by s_x = m / Q (a column vector) and
//   the weight scale. All of it inside the one matmul program (MatmulSpec::a_row_quant): the
//   tiling holds blocks of whole rows of x in VMEM, the vector unit takes each block's row max
//   of |x| as its chunks arrive (for the next block, between the current block's MXU passes),
//   then scales the chunks in place (stored back in x's dtype: bf16 activations are rounded to
//   bf16 there before the MXU rounds them again). Only when no block of whole rows fits VMEM
//   (K of hundreds of thousands) are m and the factors computed by small programs before the
//   matmul and read from HBM. So the result is the float product of the quantized activations
//   and the dequantized weights, not the cpu kernel's weight-only product: they differ by the
//   activations' rounding.
// - otherwise (int8 on v4, fp8 on v4 / v5e / v5p / v6e): weight-only, like the cpu; the weights
//   are widened to bf16 as the MXU loads them (i8 and e4m3 values are exact in bf16) and x goes
//   in at the f32 matmul precision (codegen/precision.h; "highest" runs bf16x3, which is exact for
//   these weights), so the result equals the float linear of the dequantized weights.
// int4 weights (linear_int4: packed nibbles, f32 or f16 scales per group of 32 or more columns)
// are dequantized inside the matmul program (MatmulSpec::b_int4_group): each weight panel streams
// from HBM packed, half a byte per weight with its group scales (f16 ones widened to f32 in
// VMEM), and the vector unit unpacks it with 32-bit integer shifts and masks; x goes in at the
// f32 matmul precision (bf16 x in one bf16 pass). With at most group / 2 rows of x in a block
// (decode), the MXUs read the nibbles as i8 weights 16 q, a pass per 16 of them, into one product
// per group that the vector unit scales by scale / 16 into the accumulator: the product of the
// exact dequantized weights. With more rows, the vector unit writes a bf16 panel of q times the
// scale (rounded to bf16) that the MXUs read: the product of the bf16-rounded weights.
// linear_fp8 with block scales (attrs block_n / block_k, a 2-D scale tensor) has no chip kernel
// and takes the counted host fallback: the epilogue applies one scale per output column, not one per
// block of K.
#include <algorithm>

#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "codegen/matmul_plan.h"
#include "codegen/operand_layout.h"
#include "codegen/precision.h"
#include "codegen/sim_tensors.h"
#include "tpucore/ops.h"

namespace tpu::codegen {
namespace {

enum class QuantWeight { int8, fp8 };

// True when activations are quantized as well: the chip's MXU streams the weight's type faster
// than bf16.
bool qlinear_uses_narrow_mode(const sim::ChipConfig& cfg, QuantWeight w) {
  const double r = w == QuantWeight::int8 ? cfg.mxu.int8_cycles_per_row : cfg.mxu.fp8_cycles_per_row;
  return r > 0 && r < cfg.mxu.bf16_cycles_per_row;
}

bool qlinear_eager(const ops::KernelArgs& k, QuantWeight kind) {
  const Tensor& out = k.outputs[0];
  const Tensor &x = k.inputs[0], &q = k.inputs[1], &ws = k.inputs[2];
  // x in f32 or bf16 (f16 has no chip dtype); the meta casts the scales to f32.
  if (!float_chip(x.dtype()) || out.dtype() != x.dtype() || ws.dtype() != DType::f32) return false;
  if (k.attrs.get_int("block_n", 0) > 0 || ws.dim() != 1) return false;  // block scales: the host kernel
  const int64_t N = q.shape()[0], K = q.shape()[1];
  if (K == 0) return false;
  if (out.numel() == 0) return true;
  const int64_t M = x.numel() / K;
  const Device dev = out.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  const bool narrow = qlinear_uses_narrow_mode(cfg, kind);

  MatmulPlan p;
  MatmulSpec& s = p.spec;
  s.name = kind == QuantWeight::int8 ? "linear_int8" : "linear_fp8";
  s.m = M;
  s.n = N;
  s.k = K;
  s.b_transposed = true;
  s.a_dtype = cd(x.dtype());
  s.b_dtype = kind == QuantWeight::int8 ? sim::DType::i8 : sim::DType::f8e4m3;
  s.out_dtype = cd(out.dtype());
  const std::optional<Tensor> wq = q.is_contiguous() ? std::optional<Tensor>(q) : materialize_on_device(q);
  if (!wq) return false;
  p.b = *wq;
  const Shape mn{M, N};
  VecRef v = s.epilogue.input(0);
  Tensor row_factor;  // narrow modes: (1 / m) Q per row of x, applied to A's chunks in VMEM
  const std::optional<Tensor> xa = x.is_contiguous() ? std::optional<Tensor>(x) : materialize_on_device(x);
  if (!xa) return false;
  p.a = *xa;
  // Narrow modes: the activation scales inside the matmul program (MatmulSpec::a_row_quant) when
  // a block of whole rows of x fits VMEM; else (K of hundreds of thousands) from HBM, computed by
  // small programs before it.
  bool in_kernel = false;
  if (narrow) {
    s.mode = kind == QuantWeight::int8 ? sim::MxuMode::i8 : sim::MxuMode::fp8;
    const float qmax = kind == QuantWeight::int8 ? 127.0f : 448.0f;
    s.a_row_quant = qmax;
    in_kernel = matmul_row_quant_fits(cfg, s);
    if (!in_kernel) {
      s.a_row_quant = 0;
      s.a_row_scale = true;
      const Tensor x2 = tpu::reshape(*xa, Shape{M, K});
      // m = max(max |x_row|, 1e-30) from the row maximum and minimum (two reads of x, no copy).
      const Tensor mx = tpu::maximum(
          tpu::to(tpu::maximum(tpu::amax(x2, {1}, true), tpu::neg(tpu::amin(x2, {1}, true))), DType::f32), 1e-30);
      row_factor = tpu::mul(tpu::reciprocal(tpu::reshape(mx, Shape{M})), qmax);
      auto lo = lay_out(tpu::div(mx, qmax), mn, dev);  // s_x = m / Q, a column vector
      if (!lo) return false;
      s.epilogue_inputs.push_back(lo->in);
      p.epilogue_args.push_back(lo->t);
      v = s.epilogue.op(sim::Op::vmul, v, s.epilogue.input(1));
    }
  } else {
    const sim::MxuMode m = f32_matmul_mode();
    s.mode = m == sim::MxuMode::f32 ? sim::MxuMode::bf16x3 : m;
  }
  auto wl = lay_out(ws, mn, dev);
  if (!wl) return false;
  s.epilogue_inputs.push_back(wl->in);
  p.epilogue_args.push_back(wl->t);
  // In-kernel scales: s_x = m / Q is the epilogue input after the laid-out ones (here the weight
  // scale, input 1), applied first as the HBM column is.
  if (in_kernel) v = s.epilogue.op(sim::Op::vmul, v, s.epilogue.input(2));
  v = s.epilogue.op(sim::Op::vmul, v, s.epilogue.input(int(s.epilogue_inputs.size())));
  s.epilogue.result = v;
  p.value = v;
  const sim::ChipConfig& chip = cfg;
  const LoadedProgram& lp = cached_program(dev, matmul_key(s), [&] { return make_matmul_program(chip, s); });
  std::vector<int64_t> args{hbm_address(p.a), hbm_address(p.b)};
  for (const Tensor& t : p.epilogue_args) args.push_back(hbm_address(t));
  args.push_back(hbm_address(out));
  if (s.a_row_scale) {
    args.push_back(0);  // the K counter
    args.push_back(hbm_address(row_factor));
  }
  launch(dev, lp, s.name.c_str(), std::move(args));
  return true;
}

bool linear_int4_eager(const ops::KernelArgs& k) {
  const Tensor& out = k.outputs[0];
  const Tensor &x = k.inputs[0], &q = k.inputs[1], &ws = k.inputs[2];
  if (!float_chip(x.dtype()) || out.dtype() != x.dtype() || (ws.dtype() != DType::f32 && ws.dtype() != DType::f16))
    return false;
  const int64_t N = q.shape()[0], K = 2 * q.shape()[1], G = ws.shape()[1];
  if (K == 0 || G == 0) return false;
  if (out.numel() == 0) return true;
  const int64_t M = x.numel() / K;
  const Device dev = out.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  MatmulSpec s;
  s.name = "linear_int4";
  s.m = M;
  s.n = N;
  s.k = K;
  s.b_transposed = true;
  s.b_int4_group = K / G;  // a multiple of 32 (the op's meta checks it)
  s.b_int4_scale_f16 = ws.dtype() == DType::f16;  // widened to f32 in VMEM
  s.a_dtype = cd(x.dtype());
  s.b_dtype = sim::DType::i8;  // the packed bytes
  s.out_dtype = cd(out.dtype());
  if (x.dtype() == DType::bf16) {
    s.mode = sim::MxuMode::bf16;
  } else {
    const sim::MxuMode m = f32_matmul_mode();
    s.mode = m == sim::MxuMode::f32 ? sim::MxuMode::bf16x3 : m;  // bf16 weights: bf16x3 is exact for them
  }
  const std::optional<Tensor> xa = x.is_contiguous() ? std::optional<Tensor>(x) : materialize_on_device(x);
  const std::optional<Tensor> wq = q.is_contiguous() ? std::optional<Tensor>(q) : materialize_on_device(q);
  const std::optional<Tensor> sc = ws.is_contiguous() ? std::optional<Tensor>(ws) : materialize_on_device(ws);
  if (!xa || !wq || !sc) return false;
  s.epilogue.result = s.epilogue.input(0);
  const LoadedProgram& lp = cached_program(dev, matmul_key(s), [&] { return make_matmul_program(cfg, s); });
  // A, B, C, the K counter, the group scales.
  launch(dev, lp, s.name.c_str(), {hbm_address(*xa), hbm_address(*wq), hbm_address(out), 0, hbm_address(*sc)});
  return true;
}

bool linear_int8_eager(const ops::KernelArgs& k) { return qlinear_eager(k, QuantWeight::int8); }
bool linear_fp8_eager(const ops::KernelArgs& k) { return qlinear_eager(k, QuantWeight::fp8); }

const Lowering kLinearInt8Rule{.eager = &linear_int8_eager};
const Lowering kLinearFp8Rule{.eager = &linear_fp8_eager};
const Lowering kLinearInt4Rule{.eager = &linear_int4_eager};

[[maybe_unused]] const bool g_quantized_linear_rules_installed =
    (install_lowering("linear_int8", &kLinearInt8Rule), install_lowering("linear_fp8", &kLinearFp8Rule),
     install_lowering("linear_int4", &kLinearInt4Rule), true);

}  // namespace
}  // namespace tpu::codegen
