// cat(xs, dim) on the chip: every input is one HBM-to-HBM DMA into its slot of the output. The
// output is viewed as [outer, total x inner] (outer: the dims before `dim`, inner: those after);
// input i is [outer, len_i x inner] rows landing at column offset start_i x inner. An input
// whose rows are not contiguous or whose outer dims do not collapse into one stride is
// gathered contiguous on the device first (StridedCopy). Each DMA signals one semaphore; the
// program waits for all of them. Any dtype of 1, 2 or 4 bytes. On a megacore device the outer
// rows are split between the TensorCores.
//
// Arguments: r0 .. r(n-1) the inputs' HBM addresses (first element), rn the output's.
#include <fmt/format.h>

#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "codegen/megacore.h"
#include "codegen/sim_tensors.h"
#include "ops/registry.h"
#include "sim/builder.h"

namespace tpu::codegen {
namespace {

using B = sim::ProgramBuilder;

struct CatPiece {
  int64_t row_bytes = 0, src_row_stride = 0, dst_offset = 0;
};

// The outer stride of `t` (in elements) when dims >= d are one dense row and dims < d walk
// memory with one stride; -1 otherwise.
int64_t outer_stride(const Tensor& t, int d) {
  int64_t expect = 1;
  for (int i = t.dim() - 1; i >= d; --i) {
    if (t.shape()[i] != 1 && t.strides()[i] != expect) return -1;
    expect *= t.shape()[i];
  }
  const int64_t row = expect;
  int64_t stride = -1, span = 1;  // the collapsed outer dims: stride of the innermost, extent so far
  for (int i = d - 1; i >= 0; --i) {
    if (t.shape()[i] == 1) continue;
    if (stride < 0) stride = t.strides()[i];
    else if (t.strides()[i] != stride * span) return -1;
    span *= t.shape()[i];
  }
  return stride < 0 ? row : stride;
}

sim::Program make_cat_program(const std::vector<CatPiece>& pieces, int64_t outer, int64_t dst_row_stride, int engines) {
  B b(fmt::format("cat_{}", pieces.size()));
  const int n = int(pieces.size());
  for (int i = 0; i < n; ++i) {
    const CatPiece& p = pieces[size_t(i)];
    b.dma(B::hbm_at(B::at(p.dst_offset, {{int16_t(n), 1}})), B::hbm_at(B::at(0, {{int16_t(i), 1}})),
          {.rows = outer, .row_bytes = p.row_bytes, .dst_row_stride = dst_row_stride, .src_row_stride = p.src_row_stride},
          i % engines, 0);
  }
  b.wait(0, n);
  b.fence();
  return b.finish();
}

bool cat_eager(const ops::KernelArgs& k) {
  const Tensor& out = k.outputs[0];
  const int64_t es = int64_t(out.element_size());
  if (es != 1 && es != 2 && es != 4) return false;
  if (out.numel() == 0) return true;
  const int nd = out.dim();
  int d = int(k.attrs.get_int("dim"));
  if (d < 0) d += nd;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= out.shape()[i];
  for (int i = d + 1; i < nd; ++i) inner *= out.shape()[i];
  const Device dev = out.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  std::vector<Tensor> keep;
  std::vector<CatPiece> pieces;
  std::vector<int64_t> args;
  std::string key = fmt::format("cat:{}:{}:{}", es, outer, out.shape()[d] * inner);
  int64_t start = 0;
  for (const Tensor& t0 : k.inputs) {
    if (t0.dim() != nd) continue;  // legacy empty inputs (shape [0]) take no part
    const int64_t len = t0.shape()[d];
    if (len == 0 || t0.numel() == 0) continue;
    if (t0.device() != dev || t0.dtype() != out.dtype()) return false;
    Tensor t = t0;
    int64_t stride = outer_stride(t, d);
    if (stride < 0) {
      auto m = materialize_on_device(t);
      if (!m) return false;
      t = *m;
      stride = len * inner;
    }
    keep.push_back(t);
    pieces.push_back({len * inner * es, stride * es, start * inner * es});
    args.push_back(hbm_address(t));
    key += fmt::format(":{},{},{}", pieces.back().row_bytes, pieces.back().src_row_stride, pieces.back().dst_offset);
    start += len;
  }
  if (pieces.empty()) return true;
  if (int(pieces.size()) + 1 > int(cfg.scalar.registers)) return false;  // one address register each
  args.push_back(hbm_address(out));
  const int64_t dst_stride = out.shape()[d] * inner * es;
  // Megacore: the outer rows split between the cores (each input and the output register
  // advance by their row strides), when the copy is long enough to pay.
  const int cores = outer >= 2 ? megacore_cores(cfg, 2.0 * double(out.numel() * es) / cfg.hbm_bytes_per_cycle()) : 1;
  std::vector<RowOperand> regs;
  for (size_t i = 0; i < pieces.size(); ++i) regs.push_back({int(i), pieces[i].src_row_stride});
  regs.push_back({int(pieces.size()), dst_stride});
  key += fmt::format(":cores{}", cores);
  const LoadedProgram& p = cached_program(dev, key, [&] {
    return split_rows("cat", cores, outer, 1, regs, [&](int64_t rows) {
      return make_cat_program(pieces, rows, dst_stride, std::max(1, int(cfg.dma.engines)));
    });
  });
  launch(dev, p, k.op.name, std::move(args));
  return true;
}

void install_cat_rule() {
  static const Lowering l{.eager = &cat_eager};
  install_lowering("cat", &l);
}

[[maybe_unused]] const bool g_cat_rules_installed = (install_cat_rule(), true);

}  // namespace
}  // namespace tpu::codegen
