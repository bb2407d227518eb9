#include "codegen/matmul_plan.h"

#include "codegen/launch.h"
#include "codegen/operand_layout.h"
#include "codegen/precision.h"
#include "codegen/sim_tensors.h"
#include "device/sim_driver.h"

namespace tpu::codegen {
namespace {


struct MatOperand {
  Tensor t;
  bool transposed = false;
  int64_t batch_stride = 0;
};

// The batch dims (all but the last two) of x as one stride in elements: -1 when they do not
// collapse into one; `dense` when there are none of size > 1.
int64_t uniform_batch_stride(const Tensor& x, int64_t dense) {
  int64_t stride = -1, span = 1;
  for (int d = x.dim() - 3; d >= 0; --d) {
    if (x.shape()[d] == 1) continue;
    if (stride < 0) stride = x.strides()[d];
    else if (x.strides()[d] != stride * span) return -1;
    span *= x.shape()[d];
  }
  return stride < 0 ? dense : stride;
}

// The last two dims of x as a matrix operand: dense rows or, when x is the transpose of a
// dense matrix (k.transpose(-1, -2)), read as such, the batch dims at any uniform stride (a
// narrowed sequence of a [B, L, C] tensor) read in place; anything else gathered first.
std::optional<MatOperand> matrix_operand(const Tensor& x, int64_t batch, bool allow_transposed) {
  const int nd = x.dim();
  if (nd >= 2) {
    const int64_t r = x.shape()[nd - 2], c = x.shape()[nd - 1];
    const bool rows = c == 1 || (x.strides()[nd - 1] == 1 && (r == 1 || x.strides()[nd - 2] == c));
    const bool tr = allow_transposed && !rows && r > 1 && c > 1 && x.strides()[nd - 2] == 1 && x.strides()[nd - 1] == r;
    if (rows || tr) {
      const int64_t bs = uniform_batch_stride(x, r * c);
      if (bs >= 0 && (batch > 1 || nd == 2 || x.numel() == r * c)) return MatOperand{x, tr, batch > 1 ? bs : 0};
    }
  }
  auto m = materialize_on_device(x);
  if (!m) return std::nullopt;
  const int64_t rc = nd >= 2 ? x.shape()[nd - 2] * x.shape()[nd - 1] : x.numel();
  return MatOperand{*m, false, batch > 1 ? rc : 0};
}

}  // namespace

std::optional<MatmulPlan> plan_matmul(const std::string& op, std::span<const Tensor> inputs, const ops::Attrs& attrs,
                                      const Shape& out_shape, DType out_dtype) {
  const Tensor &a = inputs[0], &b = inputs[1];
  if (!float_chip(a.dtype()) || a.dtype() != b.dtype() || out_dtype != a.dtype()) return std::nullopt;
  if (a.dim() == 0 || b.dim() == 0) return std::nullopt;
  MatmulPlan p;
  p.out_shape = out_shape;
  MatmulSpec& s = p.spec;
  s.name = op;
  s.a_dtype = s.b_dtype = s.out_dtype = cd(a.dtype());
  s.mode = a.dtype() == DType::bf16 ? sim::MxuMode::bf16 : f32_matmul_mode();  // precision.h
  std::optional<MatOperand> A, B;
  if (op == "linear") {
    // w [N, K] is B^T; w.t() of a contiguous [K, N] is B.
    s.k = b.shape()[1];
    s.n = b.shape()[0];
    if (s.k == 0) return std::nullopt;
    s.m = a.numel() / s.k;
    A = matrix_operand(a, 1, false);
    if (b.is_contiguous()) B = MatOperand{b, true, 0};
    else if (b.strides()[0] == 1 && b.strides()[1] == s.n) B = MatOperand{b, false, 0};
    else if (auto m = materialize_on_device(b)) B = MatOperand{*m, true, 0};
  } else {
    s.k = a.shape()[a.dim() - 1];
    if (s.k == 0) return std::nullopt;
    s.n = b.dim() >= 2 ? b.shape()[b.dim() - 1] : 1;
    if (b.dim() <= 2) {
      s.m = a.numel() / s.k;  // B shared: batch dims of A fold into M
      A = matrix_operand(a, 1, false);
      if (b.dim() == 1) {
        if (auto m = materialize_on_device(b)) B = MatOperand{*m, false, 0};
      } else {
        B = matrix_operand(b, 1, true);
      }
    } else {
      const int nb = out_shape.ndim() - 2;
      if (a.dim() != b.dim() || a.dim() != out_shape.ndim()) return std::nullopt;
      for (int d = 0; d < nb; ++d) {
        if (a.shape()[d] != b.shape()[d]) return std::nullopt;
        s.batch *= out_shape[d];
      }
      s.m = a.shape()[a.dim() - 2];
      A = matrix_operand(a, s.batch, false);
      B = matrix_operand(b, s.batch, true);
    }
  }
  if (!A || !B) return std::nullopt;
  s.b_transposed = B->transposed;
  s.a_batch_stride = A->batch_stride;
  s.b_batch_stride = B->batch_stride;
  p.a = A->t;
  p.b = B->t;
  p.value = s.epilogue.input(0);
  if (op == "linear" && attrs.get_bool("has_bias")) {
    const Tensor& bt = inputs[2];
    auto lo = lay_out(bt, Shape{s.m, s.n}, a.device());
    if (!lo || !float_chip(bt.dtype())) return std::nullopt;
    s.epilogue_inputs.push_back(lo->in);
    p.epilogue_args.push_back(lo->t);
    p.value = s.epilogue.op(sim::Op::vadd, p.value, s.epilogue.input(1));
  }
  s.epilogue.result = p.value;
  return p;
}

void run_matmul_plan(MatmulPlan& p, const Tensor& out, const char* kernel) {
  const Device dev = out.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  const LoadedProgram& lp = cached_program(dev, matmul_key(p.spec), [&] { return make_matmul_program(cfg, p.spec); });
  std::vector<int64_t> args{hbm_address(p.a), hbm_address(p.b)};
  for (const Tensor& t : p.epilogue_args) args.push_back(hbm_address(t));
  args.push_back(hbm_address(out));
  launch(dev, lp, kernel, std::move(args));
}

}  // namespace tpu::codegen
