// cumsum(x, dim) on the chip for f32: the inclusive prefix sums of each line as log2(n) shifted
// adds in VMEM (step s: y[j] = x[j] + x[j - s] for j >= s, y[j] = x[j] below s; the buffers
// alternate), so a line of n values takes ceil(log2 n) vector passes instead of n dependent
// adds. The sums are grouped as a tree rather than left to right: results agree with the
// sequential host loop to f32 rounding, not bit for bit.
//
// The input, made contiguous, is [outer, n, inner] (outer: dims before `dim`, inner: after).
// inner == 1: the lines are rows of n values; a chunk of up to R lines at a time, the chunk
// count and the remaining single lines read from registers. inner > 1: one outer index at a
// time, [n, inner] in VMEM, the lines its columns. Integer and bool inputs (exact integer sums,
// i32 wrapping), f16/bf16 and lines too long for VMEM take the counted host fallback.
//
// Arguments: r0 x, r1 out, r2 full chunks (or outer), r3 single lines after them.
#include <fmt/format.h>

#include <algorithm>

#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "sim/builder.h"

namespace tpu::codegen {
namespace {

using CumsumB = sim::ProgramBuilder;

struct CumsumSpec {
  int64_t n = 0, inner = 1, lines = 1;  // lines per chunk (inner == 1) or inner
};

sim::Program make_cumsum_program(const CumsumSpec& s) {
  enum { rX = 0, rOut, rChunks, rSingles, rI, rOff };
  const bool rows = s.inner == 1;
  const int64_t chunk_elems = rows ? s.lines * s.n : s.n * s.inner;
  const int64_t buf[2] = {0, (chunk_elems * 4 + 63) / 64 * 64};
  CumsumB b(fmt::format("cumsum_{}x{}", s.n, s.inner));
  // The scan of `lines` lines held at buf[0]; returns the buffer holding the result.
  auto scan = [&](int64_t lines) {
    const int64_t ls = rows ? s.n : 1, js = rows ? 1 : s.inner;  // element strides: line, step
    auto opnd = [&](int which, int64_t j0) {
      return CumsumB::vmem(CumsumB::at(buf[which] + j0 * js * 4), sim::DType::f32, ls, js);
    };
    int cur = 0;
    for (int64_t sh = 1; sh < s.n; sh *= 2) {
      b.unary(sim::Op::vmov, opnd(1 - cur, 0), opnd(cur, 0), lines, sh);
      b.binary(sim::Op::vadd, opnd(1 - cur, sh), opnd(cur, sh), opnd(cur, 0), lines, s.n - sh);
      cur = 1 - cur;
    }
    return cur;
  };
  auto chunk = [&](int64_t lines) {
    const int64_t bytes = lines * (rows ? s.n : s.n * s.inner) * 4;
    b.dma(CumsumB::vmem_at(CumsumB::at(buf[0])), CumsumB::hbm_at(CumsumB::at(0, {{rX, 1}, {rOff, 1}})),
          {.rows = 1, .row_bytes = bytes}, 0, 0);
    b.wait(0);
    const int res = scan(rows ? lines : s.inner);
    b.dma(CumsumB::hbm_at(CumsumB::at(0, {{rOut, 1}, {rOff, 1}})), CumsumB::vmem_at(CumsumB::at(buf[res])),
          {.rows = 1, .row_bytes = bytes}, 0, 0);
    b.wait(0);
    b.sadd(rOff, rOff, bytes);
  };
  b.sset(rOff, 0);
  b.loop_reg(rI, rChunks);
  chunk(rows ? s.lines : 1);
  b.end_loop();
  if (rows) {
    b.loop_reg(rI, rSingles);
    chunk(1);
    b.end_loop();
  }
  b.fence();
  return b.finish();
}

bool cumsum_chip(const ops::KernelArgs& k) {
  const Tensor& x0 = k.inputs[0];
  const Tensor& out = k.outputs[0];
  if (x0.dtype() != DType::f32 || out.dtype() != DType::f32 || !out.is_contiguous()) return false;
  if (out.numel() == 0) return true;
  const int nd = x0.dim();
  int d = 0;
  if (nd > 0) {
    const int64_t a = k.attrs.get_int("dim");
    d = int(a < 0 ? a + nd : a);
  }
  CumsumSpec s;
  s.n = nd == 0 ? 1 : x0.size(d);
  int64_t outer = 1;
  for (int i = 0; i < d; ++i) outer *= x0.size(i);
  for (int i = d + 1; i < nd; ++i) s.inner *= x0.size(i);
  const Device dev = out.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  const int64_t budget = int64_t(cfg.memory.vmem_bytes) / 4;  // both buffers
  const int64_t line_bytes = 2 * s.n * s.inner * 4 + 128;
  if (line_bytes > budget) return false;
  const bool rows = s.inner == 1;
  s.lines = rows ? std::min(outer, std::max<int64_t>(1, budget / line_bytes)) : s.inner;
  const Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();  // a chip copy for strided inputs
  const std::string key = fmt::format("cumsum:{}:{}:{}", s.n, s.inner, s.lines);
  const LoadedProgram& p = cached_program(dev, key, [&] { return make_cumsum_program(s); });
  const int64_t chunks = rows ? outer / s.lines : outer, singles = rows ? outer % s.lines : 0;
  launch(dev, p, "cumsum", {hbm_address(x), hbm_address(out), chunks, singles});
  return true;
}

const Lowering kCumsumRule{.eager = &cumsum_chip};
[[maybe_unused]] const bool g_cumsum_chip_installed = (install_lowering("cumsum", &kCumsumRule), true);

}  // namespace
}  // namespace tpu::codegen
