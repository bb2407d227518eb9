// rotary_embedding on sim tensors as one chip program (RotaryKernel): x viewed as planes of
// [T, D] rows (any plane offsets and row stride, contiguous last dim; e.g. heads split out of a
// projection by reshape + transpose, read in place), cos/sin broadcast to x the same way (a
// [T, D] table shared by every head is loaded once per row block, not once per head). Tiles of
// up to 256K elements are emitted statically and double-buffered: the next tile loads while this
// one computes (six vector ops on the two halves) and the previous one stores. The output is
// contiguous. Declines (host fallback): dtypes other than f32/bf16.
//
// Arguments: r0 x, r1 cos, r2 sin, r3 out (HBM addresses).
#include <fmt/format.h>

#include "codegen/elementwise_kernel.h"
#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "codegen/sim_tensors.h"
#include "device/sim_driver.h"
#include "ops/reduce_engine.h"
#include "sim/builder.h"

namespace tpu::codegen {
namespace {

using B = sim::ProgramBuilder;
using sim::DType;
using sim::Op;

struct RotarySpec {
  int64_t planes = 1, t = 1, d = 2;
  DType dtype = DType::f32;
  std::vector<int64_t> x_off, c_off, s_off;  // element offset of each plane
  int64_t x_rs = 0, c_rs = 0, s_rs = 0;      // row strides (elements; 0 broadcasts a row)
};

std::string rotary_key(const RotarySpec& s) {
  return fmt::format("rope:{}x{}x{}:{}:{}/{}/{}:{};{};{}", s.planes, s.t, s.d, sim::dtype_name(s.dtype), s.x_rs, s.c_rs,
                     s.s_rs, fmt::join(s.x_off, ","), fmt::join(s.c_off, ","), fmt::join(s.s_off, ","));
}

sim::Program make_rotary_program(const sim::ChipConfig& cfg, const RotarySpec& s) {
  const int64_t D = s.d, h = D / 2, es = sim::dtype_size(s.dtype);
  const int64_t rt = std::max<int64_t>(1, std::min(s.t, (int64_t(1) << 18) / D));
  // VMEM: x, cos, sin, out tiles (two each), two f32 temporaries.
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t o = at;
    at = align64(at + bytes);
    return o;
  };
  int64_t xb[2], cb[2], sb[2], ob[2];
  for (int i = 0; i < 2; ++i) {
    xb[i] = take(rt * D * es);
    cb[i] = take(rt * D * es);
    sb[i] = take(rt * D * es);
    ob[i] = take(rt * D * es);
  }
  const int64_t t1 = take(rt * h * 4), t2 = take(rt * h * 4);
  TPU_CHECK(uint64_t(at) <= cfg.memory.vmem_bytes, "internal: codegen: rotary tiles need {} bytes of VMEM", at);
  const int nq = cfg.dma.engines;
  const int sem_x[2] = {0, 1}, sem_c[2] = {2, 3}, sem_out = 4;

  struct Tile {
    int64_t plane, r0, rows;
    bool new_tables;
    int cpar;
  };
  std::vector<Tile> tiles;
  int cpar = 1;
  int64_t last_c = -1, last_s = -1, last_r0 = -1;
  for (int64_t r0 = 0; r0 < s.t; r0 += rt)
    for (int64_t p = 0; p < s.planes; ++p) {
      const bool fresh = s.c_off[size_t(p)] != last_c || s.s_off[size_t(p)] != last_s || r0 != last_r0;
      if (fresh) cpar = 1 - cpar;
      tiles.push_back({p, r0, std::min(rt, s.t - r0), fresh, cpar});
      last_c = s.c_off[size_t(p)];
      last_s = s.s_off[size_t(p)];
      last_r0 = r0;
    }

  B b("rotary_embedding");
  auto load = [&](size_t i) {
    const Tile& tl = tiles[i];
    const int par = int(i % 2);
    b.dma(B::vmem_at(B::at(xb[par])), B::hbm_at(B::at((s.x_off[size_t(tl.plane)] + tl.r0 * s.x_rs) * es, {{0, 1}})),
          {.rows = tl.rows, .row_bytes = D * es, .src_row_stride = s.x_rs * es}, 0, sem_x[par]);
    if (tl.new_tables) {
      b.dma(B::vmem_at(B::at(cb[tl.cpar])),
            B::hbm_at(B::at((s.c_off[size_t(tl.plane)] + tl.r0 * s.c_rs) * es, {{1, 1}})),
            {.rows = tl.rows, .row_bytes = D * es, .src_row_stride = s.c_rs * es}, 1 % nq, sem_c[tl.cpar]);
      b.dma(B::vmem_at(B::at(sb[tl.cpar])),
            B::hbm_at(B::at((s.s_off[size_t(tl.plane)] + tl.r0 * s.s_rs) * es, {{2, 1}})),
            {.rows = tl.rows, .row_bytes = D * es, .src_row_stride = s.s_rs * es}, 2 % nq, sem_c[tl.cpar]);
    }
  };
  b.signal(sem_out, 2);  // both output tiles start free
  if (!tiles.empty()) load(0);
  for (size_t i = 0; i < tiles.size(); ++i) {
    const Tile& tl = tiles[i];
    const int par = int(i % 2);
    if (i + 1 < tiles.size()) load(i + 1);
    b.wait(sem_x[par]);
    if (tl.new_tables) b.wait(sem_c[tl.cpar], 2);
    b.wait(sem_out);
    const int64_t r = tl.rows;
    auto half = [&](int64_t base, int k, DType t) { return B::vmem(B::at(base + k * h * sim::dtype_size(t)), t, D); };
    const sim::Operand T1 = B::vmem(B::at(t1), DType::f32, h), T2 = B::vmem(B::at(t2), DType::f32, h);
    const int64_t x = xb[par], c = cb[tl.cpar], sn = sb[tl.cpar], o = ob[par];
    // out1 = x1 c1 - x2 s1;  out2 = x2 c2 + x1 s2.
    b.binary(Op::vmul, T1, half(x, 0, s.dtype), half(c, 0, s.dtype), r, h);
    b.binary(Op::vmul, T2, half(x, 1, s.dtype), half(sn, 0, s.dtype), r, h);
    b.binary(Op::vsub, half(o, 0, s.dtype), T1, T2, r, h);
    b.binary(Op::vmul, T1, half(x, 1, s.dtype), half(c, 1, s.dtype), r, h);
    b.binary(Op::vmul, T2, half(x, 0, s.dtype), half(sn, 1, s.dtype), r, h);
    b.binary(Op::vadd, half(o, 1, s.dtype), T1, T2, r, h);
    b.dma(B::hbm_at(B::at((tl.plane * s.t + tl.r0) * D * es, {{3, 1}})), B::vmem_at(B::at(o)),
          {.row_bytes = r * D * es}, 3 % nq, sem_out);
  }
  b.wait(sem_out, 2);
  b.fence();
  return b.finish();
}

// `t` (already of x's shape) with a contiguous last dim, made on the device when needed.
std::optional<Tensor> rows_view(const Tensor& t) {
  if (t.strides()[t.dim() - 1] == 1 || t.size(-1) == 1) return t;
  return materialize_on_device(t);
}

std::vector<int64_t> plane_offsets(const Tensor& t) {
  ops::reduce::DimGroup g;
  for (int i = 0; i + 2 < t.dim(); ++i) g.add(t.shape()[i], t.strides()[i]);
  std::vector<int64_t> off(static_cast<size_t>(g.numel()));
  for (size_t p = 0; p < off.size(); ++p) off[p] = g.offset_of(int64_t(p));
  return off;
}

bool rotary_eager(const ops::KernelArgs& k) {
  const Tensor& out = k.outputs[0];
  const tpu::DType dt = out.dtype();
  if (dt != tpu::DType::f32 && dt != tpu::DType::bf16) return false;
  if (out.numel() == 0) return true;
  const Shape& shape = out.shape();
  // 1-D x is one row: view everything as [1, D].
  auto as2d = [&](const Tensor& t) { return shape.ndim() == 1 ? t.expand(shape).reshape(Shape{1, shape[0]}) : t; };
  auto x = rows_view(as2d(k.inputs[0]));
  auto c = rows_view(as2d(k.inputs[1].expand(shape)));
  auto sn = rows_view(as2d(k.inputs[2].expand(shape)));
  if (!x || !c || !sn) return false;
  const int n = x->dim();
  RotarySpec s;
  s.d = x->size(-1);
  s.t = x->size(-2);
  s.planes = x->numel() / (s.t * s.d);
  s.dtype = dt == tpu::DType::bf16 ? DType::bf16 : DType::f32;
  s.x_off = plane_offsets(*x);
  s.c_off = plane_offsets(*c);
  s.s_off = plane_offsets(*sn);
  s.x_rs = s.t > 1 ? x->strides()[n - 2] : 0;
  s.c_rs = s.t > 1 ? c->strides()[n - 2] : 0;
  s.s_rs = s.t > 1 ? sn->strides()[n - 2] : 0;
  const Device dev = out.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  const LoadedProgram& p = cached_program(dev, rotary_key(s), [&] { return make_rotary_program(cfg, s); });
  launch(dev, p, "rotary_embedding", {hbm_address(*x), hbm_address(*c), hbm_address(*sn), hbm_address(out)});
  return true;
}

const Lowering kRotaryRule{.eager = &rotary_eager};

[[maybe_unused]] const bool g_installed = (install_lowering("rotary_embedding", &kRotaryRule), true);

}  // namespace
}  // namespace tpu::codegen
