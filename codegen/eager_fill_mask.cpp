// Chip lowerings of the fill and mask ops a causal attention backward (and any user code that
// builds masks) uses, so they stop crossing the host link:
//  - full(shape, value): one VMEM tile filled with the value on the vector unit, then DMAed over
//    the output tile by tile (a loop of DMAs; f32, bf16, bool).
//  - masked_fill(x, mask, value): an elementwise rule, out = select(mask, value, x), so it runs
//    as an ElementwiseKernel eagerly and fuses into compiled regions (a matmul's epilogue).
//  - triu / tril(x, diagonal): an ElementwiseKernel over [planes x R, C] with two index
//    operands, the column index as a row vector and the row index (within its plane) as a
//    column vector: keep = (col - row >= diagonal) for triu, (col - row <= diagonal) for tril;
//    out = select(keep, x, 0). The index vectors are f32 (exact below 2^24 rows/columns).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "codegen/elementwise_kernel.h"
#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "codegen/operand_layout.h"
#include "codegen/sim_tensors.h"
#include "ops/fallback.h"
#include "sim/builder.h"
#include "tpucore/ops.h"

namespace tpu::codegen {
namespace {

using B = sim::ProgramBuilder;
using sim::Op;

bool fill_dtype_ok(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::boolean; }

// The value as the chip stores it: bool as 0/1, bf16 rounding happens on the store.
bool fill_value(const Scalar& v, DType t, float& out) {
  if (t == DType::boolean) {
    out = v.to_bool() ? 1.0f : 0.0f;
    return true;
  }
  const double d = v.is_floating() ? v.to_double() : double(v.to_int());
  if (std::isfinite(d) && std::fabs(d) > 3.4028234663852886e38) return false;  // not an f32: host rounds it
  out = float(d);
  return true;
}

// Program: fill a tile of `tile` elements once (a bool tile through an f32 one and vcast), DMA it over `count` full tiles of the output
// (r0 its address, r1 the loop counter) and one `tail` of the rest.
sim::Program make_fill_program(sim::DType dt, float value, int64_t numel, int64_t tile, int lanes) {
  const int64_t es = sim::dtype_size(dt);
  B b(fmt::format("full_{}", sim::dtype_name(dt)));
  const int64_t rows = (tile + lanes - 1) / lanes;
  if (dt == sim::DType::f32 || dt == sim::DType::bf16) {
    b.fill(B::vmem(B::at(0), dt, lanes), value, rows, lanes);
  } else {  // vector arithmetic is f32/bf16: fill f32 behind the tile, then convert
    const int64_t f32_at = (rows * lanes * es + 63) / 64 * 64;
    b.fill(B::vmem(B::at(f32_at), sim::DType::f32, lanes), value, rows, lanes);
    b.unary(Op::vcast, B::vmem(B::at(0), dt, lanes), B::vmem(B::at(f32_at), sim::DType::f32, lanes), rows, lanes);
  }
  const int64_t count = numel / tile, tail = numel % tile;
  if (count > 0) {
    b.loop(1, count);
    b.dma(B::hbm_at(B::at(0, {{0, 1}, {1, tile * es}})), B::vmem_at(B::at(0)), {.row_bytes = tile * es}, 0, 0);
    b.end_loop();
  }
  if (tail > 0) b.dma(B::hbm_at(B::at(count * tile * es, {{0, 1}})), B::vmem_at(B::at(0)), {.row_bytes = tail * es}, 1, 0);
  b.wait(0, count + (tail > 0 ? 1 : 0));
  b.fence();
  return b.finish();
}

bool full_eager(const ops::KernelArgs& k) {
  const Tensor& out = k.outputs[0];
  if (!fill_dtype_ok(out.dtype())) return false;
  if (out.numel() == 0) return true;
  float v = 0;
  if (!fill_value(k.attrs.get_scalar("value"), out.dtype(), v)) return false;
  const Device dev = out.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  const sim::DType dt = *chip_dtype(out.dtype());
  const int lanes = int(cfg.vpu.lanes);
  // A tile of whole vector rows, at most 256 KiB and a quarter of VMEM.
  const int64_t cap = std::max<int64_t>(lanes, std::min<int64_t>(int64_t(256) << 10, int64_t(cfg.memory.vmem_bytes) / 4) /
                                                   sim::dtype_size(dt) / lanes * lanes);
  const int64_t tile = std::min(out.numel(), cap);
  const std::string key = fmt::format("full:{}:{:a}:{}:{}", sim::dtype_name(dt), v, out.numel(), tile);
  const LoadedProgram& p =
      cached_program(dev, key, [&] { return make_fill_program(dt, v, out.numel(), tile, lanes); });
  launch(dev, p, k.op.name, {hbm_address(out)});
  return true;
}

// masked_fill(x, mask, value) = select(mask, value, x), for float x.
bool masked_fill_rule(VecExpr& e, std::span<const VecRef> in, const ops::Attrs& a, DType t, VecRef& out) {
  if (t != DType::f32 && t != DType::bf16) return false;
  float v = 0;
  if (!fill_value(a.get_scalar("value"), t, v)) return false;
  const VecRef fill = t == DType::bf16 ? e.round_bf16(VecExpr::imm(v)) : VecExpr::imm(v);
  out = e.op(Op::vsel, in[1], fill, in[0]);
  return true;
}

// Index vectors for triu/tril: 0 .. C-1 (a row vector) and the row within its plane for every
// row of the [planes x R] domain (a column vector), made on the host and copied over once per
// call (R x planes + C floats).
Tensor index_vector(int64_t n, int64_t period, Device dev) {
  std::vector<float> v(static_cast<size_t>(n), 0.0f);
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(i % period);
  return ops::copy_to_device(from_vector(v, Shape{n}), dev);
}

bool triangle_eager(const ops::KernelArgs& k, bool lower) {
  const Tensor& x0 = k.inputs[0];
  const Tensor& out = k.outputs[0];
  if (!fill_dtype_ok(out.dtype()) || x0.dtype() != out.dtype()) return false;
  if (out.numel() == 0) return true;
  const int nd = out.dim();
  const int64_t R = out.shape()[nd - 2], C = out.shape()[nd - 1], planes = out.numel() / (R * C);
  if (planes * R >= (int64_t(1) << 24) || C >= (int64_t(1) << 24)) return false;  // f32 indices exact
  const int64_t diag = std::clamp<int64_t>(k.attrs.get_int("diagonal"), -(R + C), R + C);
  const Device dev = out.device();
  auto x = materialize_on_device(x0);
  if (!x) return false;
  const Tensor cols = index_vector(C, C, dev), rows = index_vector(planes * R, R, dev);
  ElementwiseSpec spec;
  const sim::DType dt = *chip_dtype(out.dtype());
  spec.inputs = {{EwLayout::full, dt}, {EwLayout::row, sim::DType::f32}, {EwLayout::col, sim::DType::f32}};
  VecExpr& e = spec.expr;
  const VecRef d = e.op(Op::vsub, e.input(1), e.input(2));
  const VecRef keep = lower ? e.op(Op::vcmple, d, VecExpr::imm(float(diag))) : e.op(Op::vcmple, VecExpr::imm(float(diag)), d);
  e.result = e.op(Op::vsel, keep, e.input(0), VecExpr::imm(0.0f));
  spec.out_dtype = dt;
  spec.rows = planes * R;
  spec.cols = C;
  spec.name = k.op.name;
  const sim::ChipConfig& cfg = chip_config(dev);
  const std::string key = fmt::format("{}[{}]:{}", k.op.name, diag, elementwise_key(spec));
  const LoadedProgram& p = cached_program(dev, key, [&] { return make_elementwise_program(cfg, spec); });
  launch(dev, p, k.op.name, {hbm_address(*x), hbm_address(cols), hbm_address(rows), hbm_address(out)});
  return true;
}
bool triu_eager(const ops::KernelArgs& k) { return triangle_eager(k, false); }
bool tril_eager(const ops::KernelArgs& k) { return triangle_eager(k, true); }

template <bool (*F)(const ops::KernelArgs&)>
const Lowering* eager_rule() {
  static const Lowering l{.eager = F};
  return &l;
}

void install_fill_mask_rules() {
  install_lowering("full", eager_rule<&full_eager>());
  install_lowering("triu", eager_rule<&triu_eager>());
  install_lowering("tril", eager_rule<&tril_eager>());
  static const Lowering masked_fill{.elementwise = &masked_fill_rule};
  install_lowering("masked_fill", &masked_fill);
}

[[maybe_unused]] const bool g_fill_mask_rules_installed = (install_fill_mask_rules(), true);

}  // namespace
}  // namespace tpu::codegen
