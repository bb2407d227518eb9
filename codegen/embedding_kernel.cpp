// embedding(weight, indices) on the chip: the rows of a [num, dim] table in HBM at the given
// indices, copied by DMA, HBM to HBM, one DMA per index. The chip has no scalar load, so the
// indices are read on the host (i32 or i64, checked against the table there: a bad index is a
// tpu::Error naming it, as on the cpu) and passed in scalar registers: r0 the table, r1 the
// output rows of this chunk, r2.. one index each, up to kChunk indices per program run. One
// program per (chunk size, row bytes, table row stride) serves every index. Devices that run no
// generated programs take the host path.
//
// The embedding backward, scatter_add(zeros, 0, ids as an expanded column, grad rows), runs on
// the chip too (scatter_add_chip below: duplicate ids summed in VMEM before their row is
// written once); other scatter_adds take the counted host fallback. index_select along dim 0
// of a tensor with contiguous rows is the same gather (index_select_chip).
#include <fmt/format.h>

#include <map>

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

// index_select(x, 0, index) of an x whose rows (the dims after the first) are contiguous: the
// same row gather as embedding (x seen as a [rows, row elements] table). Other selections take
// the counted host fallback.
void index_select_chip(const ops::KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor& idx = a.inputs[1];
  const Tensor& out = a.outputs[0];
  const Device dev = out.device();
  const bool chip = runs_generated_programs(dev);
  const int d = x.dim() ? static_cast<int>((a.attrs.get_int("dim") + x.dim()) % x.dim()) : 0;
  bool rows = chip && x.dim() >= 1 && d == 0 && out.is_contiguous();
  int64_t row = 1;
  for (int k = x.dim() - 1; rows && k >= 1; --k) {  // the dims after the first: contiguous rows
    if (x.size(k) != 1 && x.strides()[k] != row) rows = false;
    row *= x.size(k);
  }
  if (!rows) {
    std::vector<Tensor> ins{x, idx.dtype() == DType::i32 ? idx : idx.to(DType::i32)};
    if (chip) count_host_fallback();
    ops::run_on_host(a.op, ins, a.attrs, a.outputs);
    return;
  }
  const std::vector<int64_t> ids = idx.to_vector<int64_t>();
  const int64_t num = x.size(0), es = static_cast<int64_t>(x.element_size());
  for (int64_t i : ids)
    TPU_CHECK(i >= 0 && i < num, "index_select: index {} is out of range for dim 0 with size {} (x of shape {}){}", i,
              num, x.shape().str(), i < 0 ? "; negative indices are not supported" : "");
  if (ids.empty() || row == 0) return;
  const int64_t row_bytes = row * es, stride = x.strides()[0] * es;
  const int64_t base = hbm_address(x), dst = hbm_address(out);
  for (size_t c = 0; c < ids.size(); c += kChunk) {
    const int64_t n = std::min<int64_t>(kChunk, static_cast<int64_t>(ids.size() - c));
    const LoadedProgram lp = cached_program(dev, fmt::format("embedding_rows:{}:{}:{}", n, row_bytes, stride),
                                            [&] { return make_gather_rows(n, row_bytes, stride); });
    std::vector<int64_t> args{base, dst + static_cast<int64_t>(c) * row_bytes};
    for (int64_t i = 0; i < n; ++i) args.push_back(ids[c + static_cast<size_t>(i)]);
    launch(dev, lp, "index_select", std::move(args));
  }
}

// scatter_add(x, 0, index, src) with index [n, dim] one id per row (an expanded column: the
// embedding backward, scatter_add(zeros(weight), 0, ids expanded, grad rows)) as one program:
// x copied to the output by one DMA, then per distinct id (in the plan, i32 in HBM, read with
// `sld`: {groups, then per group: id, count, source rows...}) the output row and the group's
// source rows come into VMEM by DMA, are summed in f32 in the order of the rows (as the cpu
// does) and the row goes back. Several rows of one id are summed in VMEM before the single
// write of their row, so duplicate ids accumulate; a group holds at most `max_group` rows (more
// rows of one id: consecutive groups, each reading the row the one before wrote).
// Registers: r0 out, r1 src, r2 plan, r3 x.
sim::Program make_scatter_rows(int64_t num, int64_t dim, int64_t x_stride_bytes, int64_t src_stride_bytes,
                               int64_t max_group, sim::DType dt) {
  using sim::Op;
  const int64_t es = sim::dtype_size(dt), rb = dim * es, rs = (rb + 63) / 64 * 64;
  enum { rOut = 0, rSrc, rPlan, rX, rU, rOff, rI, rId, rCnt, rJ, rRow };
  const int64_t in = 0, tmp = rs, acc = tmp + max_group * rs, outb = acc + (dim * 4 + 63) / 64 * 64;
  B b(fmt::format("scatter_rows_{}", dim));
  b.dma(B::hbm_at(B::at(0, {{rOut, 1}})), B::hbm_at(B::at(0, {{rX, 1}})),
        {.rows = num, .row_bytes = rb, .dst_row_stride = rb, .src_row_stride = x_stride_bytes}, 0, 0);
  b.wait(0);
  b.sload(rU, B::hbm_at(B::at(0, {{rPlan, 1}})));
  b.sset(rOff, 1);
  b.loop_reg(rI, rU);
  b.sload(rId, B::hbm_at(B::at(0, {{rPlan, 1}, {rOff, 4}})));
  b.sload(rCnt, B::hbm_at(B::at(4, {{rPlan, 1}, {rOff, 4}})));
  b.sadd(rOff, rOff, 2);
  b.dma(B::vmem_at(B::at(in)), B::hbm_at(B::at(0, {{rOut, 1}, {rId, rb}})), {.rows = 1, .row_bytes = rb}, 0, 1);
  b.loop_reg(rJ, rCnt);
  b.sload(rRow, B::hbm_at(B::at(0, {{rPlan, 1}, {rOff, 4}})));
  b.sadd(rOff, rOff, 1);
  b.dma(B::vmem_at(B::at(tmp, {{rJ, rs}})), B::hbm_at(B::at(0, {{rSrc, 1}, {rRow, src_stride_bytes}})),
        {.rows = 1, .row_bytes = rb}, 1, 2);
  b.end_loop();
  b.wait(1);
  b.unary(Op::vcast, B::vmem(B::at(acc), sim::DType::f32), B::vmem(B::at(in), dt), 1, dim);
  b.loop_reg(rJ, rCnt);
  b.wait(2);
  b.binary(Op::vadd, B::vmem(B::at(acc), sim::DType::f32), B::vmem(B::at(acc), sim::DType::f32),
           B::vmem(B::at(tmp, {{rJ, rs}}), dt), 1, dim);
  b.end_loop();
  b.unary(Op::vcast, B::vmem(B::at(outb), dt), B::vmem(B::at(acc), sim::DType::f32), 1, dim);
  b.dma(B::hbm_at(B::at(0, {{rOut, 1}, {rId, rb}})), B::vmem_at(B::at(outb)), {.rows = 1, .row_bytes = rb}, 0, 3);
  b.wait(3);
  b.end_loop();
  b.fence();
  return b.finish();
}

void scatter_add_chip(const ops::KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor& index = a.inputs[1];
  const Tensor& src = a.inputs[2];
  const Tensor& out = a.outputs[0];
  const Device dev = out.device();
  const int d = x.dim() ? static_cast<int>((a.attrs.get_int("dim") + x.dim()) % std::max(1, x.dim())) : 0;
  const DType dt = x.dtype();
  const bool chip = runs_generated_programs(dev);
  const bool rows = chip && x.dim() == 2 && d == 0 && (dt == DType::f32 || dt == DType::bf16) && x.size(1) > 0 &&
                    index.size(1) == x.size(1) && (index.strides()[1] == 0 || index.size(1) == 1) &&
                    src.strides()[1] == 1 && x.strides()[1] == 1;
  const int64_t dim = rows ? x.size(1) : 0, rb = dim * static_cast<int64_t>(x.element_size());
  const sim::ChipConfig* cfg = chip ? &chip_config(dev) : nullptr;
  const int64_t budget = cfg ? int64_t(cfg->memory.vmem_bytes) * 3 / 4 : 0;
  const int64_t rs = (rb + 63) / 64 * 64, max_group = rows ? std::min<int64_t>(32, budget / std::max<int64_t>(1, rs) - 4) : 0;
  if (!rows || max_group < 1) {
    // The host kernel reads i32 indices (the cpu's meta casts them; on the chip they come as given).
    std::vector<Tensor> ins{x, index.dtype() == DType::i32 ? index : index.to(DType::i32), src};
    if (chip) count_host_fallback();
    ops::run_on_host(a.op, ins, a.attrs, a.outputs);
    return;
  }
  const int64_t num = x.size(0), n = index.size(0);
  const std::vector<int64_t> ids = contiguous(narrow(index, 1, 0, 1)).to_vector<int64_t>();
  for (int64_t i : ids)
    TPU_CHECK(i >= 0 && i < num, "scatter_add: index {} is out of range for x of shape {} along dim 0 (valid: 0 to {})",
              i, x.shape().str(), num - 1);
  // The plan: the rows of each id in their order, groups of at most max_group rows.
  std::map<int64_t, std::vector<int32_t>> by_id;
  for (int64_t r = 0; r < n; ++r) by_id[ids[static_cast<size_t>(r)]].push_back(static_cast<int32_t>(r));
  std::vector<int32_t> plan{0};
  for (const auto& [id, list] : by_id)
    for (size_t g = 0; g < list.size(); g += static_cast<size_t>(max_group)) {
      const size_t cnt = std::min(list.size() - g, static_cast<size_t>(max_group));
      plan.push_back(static_cast<int32_t>(id));
      plan.push_back(static_cast<int32_t>(cnt));
      plan.insert(plan.end(), list.begin() + static_cast<std::ptrdiff_t>(g),
                  list.begin() + static_cast<std::ptrdiff_t>(g + cnt));
      ++plan[0];
    }
  // Freed stream-ordered: the block is reused only after the program ran.
  const Tensor plan_t = from_vector(plan, Shape{static_cast<int64_t>(plan.size())}, TensorOptions(DType::i32, dev));
  const sim::DType sdt = dt == DType::bf16 ? sim::DType::bf16 : sim::DType::f32;
  const int64_t es = static_cast<int64_t>(x.element_size());
  const int64_t xs = x.strides()[0] * es, ss = src.strides()[0] * es;
  const LoadedProgram lp =
      cached_program(dev, fmt::format("scatter_rows:{}:{}:{}:{}:{}:{}", num, dim, xs, ss, max_group, sim::dtype_name(sdt)),
                     [&] { return make_scatter_rows(num, dim, xs, ss, max_group, sdt); });
  launch(dev, lp, "scatter_add", {hbm_address(out), hbm_address(src), hbm_address(plan_t), hbm_address(x)});
}

[[maybe_unused]] const bool g_registered = [] {
  ops::register_kernel("embedding", DeviceType::sim, &embedding_chip);
  ops::register_kernel("embedding", DeviceType::tpu, &embedding_chip);
  ops::register_kernel("index_select", DeviceType::sim, &index_select_chip);
  ops::register_kernel("index_select", DeviceType::tpu, &index_select_chip);
  ops::register_kernel("scatter_add", DeviceType::sim, &scatter_add_chip);
  ops::register_kernel("scatter_add", DeviceType::tpu, &scatter_add_chip);
  return true;
}();

}  // namespace
}  // namespace tpu::codegen
