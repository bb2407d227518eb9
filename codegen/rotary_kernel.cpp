// rotary_embedding on sim tensors as one chip program (RotaryKernel): x viewed as planes of
// [T, D] rows (any plane offsets and row stride, contiguous last dim; e.g. heads split out of a
// projection by reshape + transpose, read in place), cos/sin broadcast to x the same way (a
// [T, D] table shared by every head is loaded once per row block, not once per head). Tiles of
// up to 256K elements are emitted statically and double-buffered: the next tile loads while this
// one computes and the previous one stores. The rotation runs on whole rows, two vector ops per
// tile: out = x * cos + swap(x) * sin', where swap(x) = [x2, x1] is made by two VMEM-to-VMEM DMAs
// (one tile ahead, so the vector unit does not wait for them) and sin' = [-sin1, sin2] is negated
// once per table block (half-width ops cost as many vregs as whole rows when D <= the lane
// count, so the six half-row ops of the textbook form took three times the vector time). The
// output is contiguous. Declines (host fallback): dtypes other than f32/bf16.
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
  // Rows per tile: up to 256K elements, fewer when the 13 tile buffers (three x, two swapped x,
  // three cos, three sin, two out) and the f32 temporary do not fit in 3/4 of VMEM.
  const int64_t row_bytes = D * es * 13 + D * 4 + 64;
  const int64_t rt = std::max<int64_t>(
      1, std::min({s.t, (int64_t(1) << 18) / D, int64_t(cfg.memory.vmem_bytes) * 3 / 4 / row_bytes}));
  // VMEM: x (three: two loads stay in flight), swapped x (two), cos and sin (three each, by
  // table block), out (two), an f32 temporary.
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t o = at;
    at = align64(at + bytes);
    return o;
  };
  int64_t xb[3], wb[2], cb[3], sb[3], ob[2];
  for (int i = 0; i < 3; ++i) {
    xb[i] = take(rt * D * es);
    cb[i] = take(rt * D * es);
    sb[i] = take(rt * D * es);
  }
  for (int i = 0; i < 2; ++i) {
    wb[i] = take(rt * D * es);
    ob[i] = take(rt * D * es);
  }
  const int64_t t1 = take(rt * D * 4);
  TPU_CHECK(uint64_t(at) <= cfg.memory.vmem_bytes, "internal: codegen: rotary tiles need {} bytes of VMEM", at);
  const int nq = cfg.dma.engines;
  const int sem_x[3] = {0, 1, 2}, sem_c[3] = {3, 4, 5}, sem_out = 6, sem_w = 7;
  TPU_CHECK(cfg.scalar.semaphores > sem_w, "internal: codegen: rotary needs {} semaphores", sem_w + 1);

  struct Tile {
    int64_t plane, r0, rows;
    bool new_tables;
    int cbuf;  // table buffer (0..2, the next one at every new table block)
  };
  std::vector<Tile> tiles;
  int cbuf = 2;
  int64_t last_c = -1, last_s = -1, last_r0 = -1;
  for (int64_t r0 = 0; r0 < s.t; r0 += rt)
    for (int64_t p = 0; p < s.planes; ++p) {
      const bool fresh = s.c_off[size_t(p)] != last_c || s.s_off[size_t(p)] != last_s || r0 != last_r0;
      if (fresh) cbuf = (cbuf + 1) % 3;
      tiles.push_back({p, r0, std::min(rt, s.t - r0), fresh, cbuf});
      last_c = s.c_off[size_t(p)];
      last_s = s.s_off[size_t(p)];
      last_r0 = r0;
    }

  B b("rotary_embedding");
  // Tile i's x (and its table block, when new) into buffer i % 3 (table buffer cbuf). Issued two
  // tiles ahead, after the instructions of tile i - 3 that read these buffers (the DMA waits for
  // their reads); with three table buffers, tiles i - 2 .. i use different ones when they differ.
  auto load = [&](size_t i) {
    const Tile& tl = tiles[i];
    const int xi = int(i % 3);
    b.dma(B::vmem_at(B::at(xb[xi])), B::hbm_at(B::at((s.x_off[size_t(tl.plane)] + tl.r0 * s.x_rs) * es, {{0, 1}})),
          {.rows = tl.rows, .row_bytes = D * es, .src_row_stride = s.x_rs * es}, 0, sem_x[xi]);
    if (tl.new_tables) {
      b.dma(B::vmem_at(B::at(cb[tl.cbuf])),
            B::hbm_at(B::at((s.c_off[size_t(tl.plane)] + tl.r0 * s.c_rs) * es, {{1, 1}})),
            {.rows = tl.rows, .row_bytes = D * es, .src_row_stride = s.c_rs * es}, 1 % nq, sem_c[tl.cbuf]);
      b.dma(B::vmem_at(B::at(sb[tl.cbuf])),
            B::hbm_at(B::at((s.s_off[size_t(tl.plane)] + tl.r0 * s.s_rs) * es, {{2, 1}})),
            {.rows = tl.rows, .row_bytes = D * es, .src_row_stride = s.s_rs * es}, 2 % nq, sem_c[tl.cbuf]);
    }
  };
  // Waits for tile i's x, then swaps its halves into swap buffer i % 2 (the DMAs wait for the
  // vector reads of that buffer two tiles back; they are waited for before tile i computes).
  auto swap = [&](size_t i) {
    const int64_t r = tiles[i].rows;
    b.wait(sem_x[i % 3]);
    for (int k = 0; k < 2; ++k)
      b.dma(B::vmem_at(B::at(wb[i % 2] + k * h * es)), B::vmem_at(B::at(xb[i % 3] + (1 - k) * h * es)),
            {.rows = r, .row_bytes = h * es, .dst_row_stride = D * es, .src_row_stride = D * es}, (1 + k) % nq,
            sem_w);
  };
  b.signal(sem_out, 2);  // both output tiles start free
  if (!tiles.empty()) {
    load(0);
    if (tiles.size() > 1) load(1);
    swap(0);
  }
  for (size_t i = 0; i < tiles.size(); ++i) {
    const Tile& tl = tiles[i];
    const int64_t r = tl.rows;
    const int64_t x = xb[i % 3], w = wb[i % 2], c = cb[tl.cbuf], sn = sb[tl.cbuf], o = ob[i % 2];
    auto rowsof = [&](int64_t base, DType t) { return B::vmem(B::at(base), t, D); };
    if (i + 2 < tiles.size()) load(i + 2);
    if (i + 1 < tiles.size()) swap(i + 1);
    if (tl.new_tables) {
      b.wait(sem_c[tl.cbuf], 2);
      // sin' = [-sin1, sin2], in place (every plane of the block uses it).
      b.unary(Op::vneg, B::vmem(B::at(sn), s.dtype, D), B::vmem(B::at(sn), s.dtype, D), r, h);
    }
    b.wait(sem_w, 2);  // tile i's swap (the oldest two signals: DMAs complete in order per engine)
    b.wait(sem_out);
    // out = x cos + swap(x) sin':  out1 = x1 c1 - x2 s1;  out2 = x2 c2 + x1 s2.
    const sim::Operand T1 = B::vmem(B::at(t1), DType::f32, D);
    b.binary(Op::vmul, T1, rowsof(x, s.dtype), rowsof(c, s.dtype), r, D);
    b.ternary(Op::vfma, rowsof(o, s.dtype), rowsof(w, s.dtype), rowsof(sn, s.dtype), T1, r, D);
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

[[maybe_unused]] const bool g_rotary_rules_installed = (install_lowering("rotary_embedding", &kRotaryRule), true);

}  // namespace
}  // namespace tpu::codegen
