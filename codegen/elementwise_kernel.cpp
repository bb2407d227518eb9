#include "codegen/elementwise_kernel.h"

#include <algorithm>

#include <fmt/format.h>

#include "codegen/tile_loops.h"
#include "tpucore/error.h"

namespace tpu::codegen {

using B = sim::ProgramBuilder;

namespace {
int64_t align64(int64_t v) { return (v + 63) / 64 * 64; }
}  // namespace

int64_t vmem_tile_elements(const sim::ChipConfig& cfg, int64_t bytes_per_element) {
  const int64_t budget = int64_t(cfg.memory.vmem_bytes) * 3 / 4;
  int64_t e = budget / std::max<int64_t>(1, bytes_per_element);
  e = std::min<int64_t>(e, int64_t(1) << 20);
  return std::max<int64_t>(e, int64_t(cfg.vpu.lanes) * cfg.vpu.sublanes);
}

void fold_domain(ElementwiseSpec& spec, const Shape& os, const sim::ChipConfig& cfg) {
  const int64_t numel = os.numel();
  spec.cols = os.ndim() ? os[os.ndim() - 1] : 1;
  bool flat = true;
  for (const EwInput& i : spec.inputs) flat &= i.layout == EwLayout::full || i.layout == EwLayout::scalar;
  if (flat && numel % cfg.vpu.lanes == 0) spec.cols = cfg.vpu.lanes;
  spec.rows = spec.cols ? numel / spec.cols : 0;
}

std::string elementwise_key(const ElementwiseSpec& s) {
  std::string k = fmt::format("ew:{}x{}:o{}:", s.rows, s.cols, sim::dtype_name(s.out_dtype));
  for (const EwInput& in : s.inputs) k += fmt::format("{}{},", int(in.layout), sim::dtype_name(in.dtype));
  return k + s.expr.key();
}

sim::Program make_elementwise_program(const sim::ChipConfig& cfg, const ElementwiseSpec& s) {
  const int n = int(s.inputs.size());
  const int out_reg = n, row_reg = n + 1, col_reg = n + 2;
  TPU_CHECK(col_reg < cfg.scalar.registers, "internal: codegen: {} inputs exceed the chip's registers", n);
  std::vector<sim::DType> dts;
  for (const EwInput& in : s.inputs) dts.push_back(in.dtype);
  const int slots = vec_temp_slots(s.expr, dts);
  int64_t per_elem = sim::dtype_size(s.out_dtype) + 4 * slots;
  for (const EwInput& in : s.inputs)
    if (in.layout == EwLayout::full) per_elem += sim::dtype_size(in.dtype);
  const int64_t E = vmem_tile_elements(cfg, per_elem);
  const int64_t tc = std::min(s.cols, E);
  const int64_t tr = std::max<int64_t>(1, std::min(s.rows, E / tc));

  // VMEM plan: input buffers, output buffer, temporaries.
  std::vector<int64_t> in_buf(static_cast<size_t>(n));
  int64_t at = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t es = sim::dtype_size(s.inputs[size_t(i)].dtype);
    int64_t bytes = es;
    switch (s.inputs[size_t(i)].layout) {
      case EwLayout::full: bytes = tr * tc * es; break;
      case EwLayout::row: bytes = tc * es; break;
      case EwLayout::col: bytes = tr * es; break;
      case EwLayout::scalar: bytes = es; break;
    }
    in_buf[size_t(i)] = at;
    at = align64(at + bytes);
  }
  const int64_t out_buf = at;
  at = align64(at + tr * tc * sim::dtype_size(s.out_dtype));
  TempArena arena{at, align64(tr * tc * 4), tc, slots};
  at += arena.slot_bytes * slots;
  TPU_CHECK(uint64_t(at) <= cfg.memory.vmem_bytes, "internal: codegen: elementwise tile plan needs {} bytes of VMEM", at);

  const int sem_in = 0, sem_out = 1;
  const int nq = cfg.dma.engines;
  B b(s.name.empty() ? "elementwise" : s.name);
  b.signal(sem_out, 1);
  // Scalars are loaded once.
  int scalars = 0;
  for (int i = 0; i < n; ++i)
    if (s.inputs[size_t(i)].layout == EwLayout::scalar) {
      b.dma(B::vmem_at(B::at(in_buf[size_t(i)])), B::hbm_at(B::at(0, {{int16_t(i), 1}})),
            {.row_bytes = sim::dtype_size(s.inputs[size_t(i)].dtype)}, scalars % nq, sem_in);
      ++scalars;
    }
  if (scalars) b.wait(sem_in, scalars);

  emit_tile_loops(b, s.rows, s.cols, tr, tc, row_reg, col_reg, [&](const TilePos& p) {
    std::vector<sim::Operand> ops;
    int loads = 0;
    for (int i = 0; i < n; ++i) {
      const EwInput& in = s.inputs[size_t(i)];
      const int64_t es = sim::dtype_size(in.dtype);
      const int q = loads % nq;
      switch (in.layout) {
        case EwLayout::full:
          b.dma(B::vmem_at(B::at(in_buf[size_t(i)])), B::hbm_at(p.addr(i, 0, s.cols, es)),
                {.rows = p.rows, .row_bytes = p.cols * es, .dst_row_stride = tc * es, .src_row_stride = s.cols * es}, q,
                sem_in);
          ops.push_back(B::vmem(B::at(in_buf[size_t(i)]), in.dtype, tc));
          ++loads;
          break;
        case EwLayout::row:
          b.dma(B::vmem_at(B::at(in_buf[size_t(i)])), B::hbm_at(p.addr(i, 0, s.cols, es, false, true)),
                {.row_bytes = p.cols * es}, q, sem_in);
          ops.push_back(B::vmem(B::at(in_buf[size_t(i)]), in.dtype, 0));
          ++loads;
          break;
        case EwLayout::col:
          b.dma(B::vmem_at(B::at(in_buf[size_t(i)])), B::hbm_at(p.addr(i, 0, 1, es, true, false)),
                {.row_bytes = p.rows * es}, q, sem_in);
          ops.push_back(B::vmem(B::at(in_buf[size_t(i)]), in.dtype, 1, 0));
          ++loads;
          break;
        case EwLayout::scalar: ops.push_back(B::vmem(B::at(in_buf[size_t(i)]), in.dtype, 0, 0)); break;
      }
    }
    if (loads) b.wait(sem_in, loads);
    b.wait(sem_out);  // the previous tile's store has read the output buffer
    const sim::Operand dst = B::vmem(B::at(out_buf), s.out_dtype, tc);
    emit_vec_expr(b, s.expr, ops, dst, arena, p.rows, p.cols);
    const int64_t eo = sim::dtype_size(s.out_dtype);
    b.dma(B::hbm_at(p.addr(out_reg, 0, s.cols, eo)), B::vmem_at(B::at(out_buf)),
          {.rows = p.rows, .row_bytes = p.cols * eo, .dst_row_stride = s.cols * eo, .src_row_stride = tc * eo}, n % nq,
          sem_out);
  });
  b.wait(sem_out);
  b.fence();
  return b.finish();
}

}  // namespace tpu::codegen
