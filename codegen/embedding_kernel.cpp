// embedding(weight, indices) on the chip: the rows of a [num, dim] table in HBM at the given
// indices, copied by DMA, HBM to HBM, one DMA per index. The chip has no scalar load, so the
// indices are read on the host (i32 or i64, checked against the table there: a bad index is a
// tpu::Error naming it, as on the cpu) and passed in scalar registers: r0 the table, r1 the
// output rows of this chunk, r2.. one index each, up to kChunk indices per program run. One
// program per (chunk size, row bytes, table row stride) serves every index. Devices that run no
// generated programs take the host path.
#include <fmt/format.h>

#include "codegen/launch.h"
#include "ops/fallback.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "sim/builder.h"
#include "tpucore/ops.h"

namespace tpu::codegen {
namespace {

using B = sim::ProgramBuilder;
constexpr int64_t kChunk = 24;  // indices per program (r2..r25 of the 32 scalar registers)

sim::Program make_gather_rows(int64_t n, int64_t row_bytes, int64_t table_stride_bytes) {
  B b(fmt::format("embedding_rows_{}", n));
  sim::DmaShape sh;
  sh.row_bytes = row_bytes;
  for (int64_t i = 0; i < n; ++i) {
    const sim::Addr dst = B::at(i * row_bytes, {{1, 1}});
    const sim::Addr src = B::at(0, {{0, 1}, {static_cast<int16_t>(2 + i), table_stride_bytes}});
    b.dma(B::hbm_at(dst), B::hbm_at(src), sh, static_cast<int>(i % 2), 0);
  }
  b.wait(0, n);
  b.fence();
  return b.finish();
}

void embedding_chip(const ops::KernelArgs& a) {
  const Tensor& w = a.inputs[0];
  const Tensor& idx = a.inputs[1];
  const Tensor& out = a.outputs[0];
  if (!runs_generated_programs(out.device()) || w.strides()[1] != 1) {
    // The host kernel reads i32 indices (the cpu's meta casts them; on the chip they come as given).
    std::vector<Tensor> ins{w, idx.dtype() == DType::i32 ? idx : idx.to(DType::i32)};
    if (runs_generated_programs(out.device())) count_host_fallback();
    ops::run_on_host(a.op, ins, a.attrs, a.outputs);
    return;
  }
  const std::vector<int64_t> ids = idx.to_vector<int64_t>();
  const int64_t num = w.size(0), dim = w.size(1), es = static_cast<int64_t>(w.element_size());
  for (int64_t i : ids)
    TPU_CHECK(i >= 0 && i < num, "embedding: index {} is out of range for weight of shape {} (valid: 0 to {})", i,
              w.shape().str(), num - 1);
  if (ids.empty() || dim == 0) return;
  const int64_t row_bytes = dim * es, stride = w.strides()[0] * es;
  const int64_t base = hbm_address(w), dst = hbm_address(out);
  for (size_t c = 0; c < ids.size(); c += kChunk) {
    const int64_t n = std::min<int64_t>(kChunk, static_cast<int64_t>(ids.size() - c));
    const LoadedProgram lp = cached_program(out.device(), fmt::format("embedding_rows:{}:{}:{}", n, row_bytes, stride),
                                            [&] { return make_gather_rows(n, row_bytes, stride); });
    std::vector<int64_t> args{base, dst + static_cast<int64_t>(c) * row_bytes};
    for (int64_t i = 0; i < n; ++i) args.push_back(ids[c + static_cast<size_t>(i)]);
    launch(out.device(), lp, "embedding", std::move(args));
  }
}

[[maybe_unused]] const bool g_registered = [] {
  ops::register_kernel("embedding", DeviceType::sim, &embedding_chip);
  ops::register_kernel("embedding", DeviceType::tpu, &embedding_chip);
  return true;
}();

}  // namespace
}  // namespace tpu::codegen
