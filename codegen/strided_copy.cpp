#include "codegen/strided_copy.h"

#include <fmt/format.h>

#include "sim/builder.h"

namespace tpu::codegen {

using B = sim::ProgramBuilder;

StridedView collapse_view(const StridedView& v) {
  StridedView c;
  c.elem_size = v.elem_size;
  for (size_t d = 0; d < v.shape.size(); ++d) {
    if (v.shape[d] == 1) continue;
    if (!c.shape.empty() && c.strides.back() == v.strides[d] * v.shape[d]) {
      c.shape.back() *= v.shape[d];
      c.strides.back() = v.strides[d];
    } else {
      c.shape.push_back(v.shape[d]);
      c.strides.push_back(v.strides[d]);
    }
  }
  return c;
}

std::string strided_copy_key(const StridedView& v) {
  return fmt::format("copy:{}:[{}]:[{}]", v.elem_size, fmt::join(v.shape, ","), fmt::join(v.strides, ","));
}

std::optional<sim::Program> make_strided_copy(const sim::ChipConfig& cfg, const StridedView& view) {
  const StridedView v = collapse_view(view);
  const int64_t es = v.elem_size;
  const int nd = int(v.shape.size());
  // Destination (contiguous) strides of the collapsed dims.
  std::vector<int64_t> dst(size_t(nd), 1);
  for (int d = nd - 2; d >= 0; --d) dst[size_t(d)] = dst[size_t(d + 1)] * v.shape[size_t(d + 1)];
  sim::DmaShape sh;
  int used = 0;  // dims handled by the DMA, from the innermost
  if (nd == 0) {
    sh.row_bytes = es;
  } else if (v.strides[size_t(nd - 1)] == 1) {
    sh.row_bytes = v.shape[size_t(nd - 1)] * es;
    used = 1;
    if (nd >= 2) {
      sh.rows = v.shape[size_t(nd - 2)];
      sh.src_row_stride = v.strides[size_t(nd - 2)] * es;
      sh.dst_row_stride = dst[size_t(nd - 2)] * es;
      used = 2;
    }
    if (nd >= 3) {
      sh.planes = v.shape[size_t(nd - 3)];
      sh.src_plane_stride = v.strides[size_t(nd - 3)] * es;
      sh.dst_plane_stride = dst[size_t(nd - 3)] * es;
      used = 3;
    }
  } else {
    sh.row_bytes = es;
    sh.rows = v.shape[size_t(nd - 1)];
    sh.src_row_stride = v.strides[size_t(nd - 1)] * es;
    sh.dst_row_stride = es;
    used = 1;
    if (nd >= 2) {
      sh.planes = v.shape[size_t(nd - 2)];
      sh.src_plane_stride = v.strides[size_t(nd - 2)] * es;
      sh.dst_plane_stride = dst[size_t(nd - 2)] * es;
      used = 2;
    }
  }
  const int loops = nd - used;
  if (loops > 2) return std::nullopt;
  B b(fmt::format("strided_copy_{}d", nd));
  sim::Addr src = B::at(0, {{0, 1}}), dsta = B::at(0, {{1, 1}});
  for (int l = 0; l < loops; ++l) {
    const int reg = 2 + l;
    b.loop(reg, v.shape[size_t(l)]);
    src.terms[size_t(1 + l)] = {int16_t(reg), v.strides[size_t(l)] * es};
    dsta.terms[size_t(1 + l)] = {int16_t(reg), dst[size_t(l)] * es};
  }
  int64_t count = 1;
  for (int l = 0; l < loops; ++l) count *= v.shape[size_t(l)];
  // Two queues; every DMA signals semaphore 0 and the program waits for them at the end (in
  // batches, so the semaphore count stays small).
  b.dma(B::hbm_at(dsta), B::hbm_at(src), sh, 0, 0);
  for (int l = 0; l < loops; ++l) b.end_loop();
  b.wait(0, count);
  b.fence();
  (void)cfg;
  return b.finish();
}

}  // namespace tpu::codegen
