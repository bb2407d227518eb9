#include "codegen/sim_tensors.h"

#include <fmt/format.h>

#include "codegen/launch.h"
#include "codegen/megacore.h"
#include "codegen/strided_copy.h"
#include "device/sim_driver.h"
#include "ops/fallback.h"
#include "ops/registry.h"

namespace tpu::codegen {

std::optional<sim::DType> chip_dtype(DType t) {
  switch (t) {
    case DType::f32: return sim::DType::f32;
    case DType::bf16: return sim::DType::bf16;
    case DType::i32: return sim::DType::i32;
    case DType::i8: return sim::DType::i8;
    case DType::boolean: return sim::DType::i8;
    default: return std::nullopt;
  }
}

bool copy_into(const Tensor& src, const Tensor& dst) {
  if (src.numel() == 0) return true;
  StridedView v;
  v.elem_size = int64_t(src.element_size());
  for (int d = 0; d < src.dim(); ++d) {
    v.shape.push_back(src.shape()[d]);
    v.strides.push_back(src.strides()[d]);
  }
  const StridedView c = collapse_view(v);
  const Device idx = src.device();
  const sim::ChipConfig& cfg = chip_config(src.device());
  // Megacore: the outermost dim split between the cores (each part moves its share with its
  // own DMA queues; HBM bandwidth is shared), when the copy is long enough to pay.
  const int64_t es = v.elem_size, n0 = c.shape.empty() ? 1 : c.shape[0];
  const double one_core = 2.0 * double(src.numel() * es) / cfg.hbm_bytes_per_cycle();
  const int cores = n0 >= 2 ? megacore_cores(cfg, one_core) : 1;
  const LoadedProgram& lp = cached_program(idx, strided_copy_key(c) + fmt::format(":{}", cores), [&] {
    bool ok = true;
    auto part = [&](int64_t rows) {
      StridedView pv = c;
      if (!pv.shape.empty()) pv.shape[0] = rows;
      std::optional<sim::Program> prog = make_strided_copy(cfg, pv);
      if (!prog) ok = false;
      return prog ? *prog : sim::Program{};
    };
    sim::Program prog = cores > 1 ? split_rows("strided_copy", cores, n0, 1,
                                               {{0, c.strides[0] * es}, {1, src.numel() / n0 * es}}, part)
                                  : part(n0);
    if (ok) return prog;
    sim::Program none;
    none.name = "unsupported";
    return none;
  });
  if (lp.name == "unsupported") return false;
  launch(idx, lp, "strided_copy", {hbm_address(src), hbm_address(dst)});
  return true;
}

std::optional<Tensor> materialize_on_device(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = ops::empty_tensor(t.shape(), t.dtype(), t.device());
  if (!copy_into(t, out)) return std::nullopt;
  return out;
}

std::optional<Tensor> device_operand(const Tensor& t, Device dev) {
  if (t.device() != dev) return ops::copy_to_device(t, dev);
  return materialize_on_device(t);
}

}  // namespace tpu::codegen
