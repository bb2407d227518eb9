#include "codegen/operand_layout.h"

#include "codegen/sim_tensors.h"

namespace tpu::codegen {

std::optional<EwLayout> layout_against(const Tensor& t, const Shape& out) {
  const int nd = out.ndim(), off = nd - t.dim();
  if (off < 0) return std::nullopt;
  std::vector<int64_t> s(size_t(nd), 0);
  for (int d = 0; d < t.dim(); ++d) s[size_t(d + off)] = t.shape()[d] == 1 ? 0 : t.strides()[d];
  bool all_zero = true, full = true, row = true, col = true;
  int64_t expect = 1, expect_col = 1;
  for (int d = nd - 1; d >= 0; --d) {
    const int64_t n = out[d], st = s[size_t(d)];
    if (n == 1) continue;
    if (st != 0) all_zero = false;
    if (st != expect) full = false;
    if (d == nd - 1) {
      if (st != 1) row = false;
      if (st != 0) col = false;
    } else {
      if (st != 0) row = false;
      if (st != expect_col) col = false;
      expect_col *= n;
    }
    expect *= n;
  }
  if (all_zero) return EwLayout::scalar;
  if (full) return EwLayout::full;
  if (row) return EwLayout::row;
  if (col) return EwLayout::col;
  return std::nullopt;
}

std::optional<LaidOutOperand> lay_out(const Tensor& t0, const Shape& out, Device dev) {
  const auto idt = chip_dtype(t0.dtype());
  if (!idt) return std::nullopt;
  Tensor t = t0;
  if (t.device() != dev) {
    auto moved = device_operand(t, dev);
    if (!moved) return std::nullopt;
    t = *moved;
  }
  auto layout = layout_against(t, out);
  if (!layout) {
    const Tensor view = t.dim() == out.ndim() && t.shape() == out ? t : t.expand(out);
    auto m = materialize_on_device(view);
    if (!m) return std::nullopt;
    t = *m;
    layout = EwLayout::full;
  }
  return LaidOutOperand{t, {*layout, *idt}};
}

}  // namespace tpu::codegen
