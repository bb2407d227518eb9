#include "codegen/elementwise_kernel.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "codegen/megacore.h"
#include "codegen/tile_loops.h"
#include "tpucore/core/error.h"

namespace tpu::codegen {

int64_t ew_tile_bytes(const EwInput& in, int64_t rows, int64_t cols) {
  const int64_t es = sim::dtype_size(in.dtype);
  switch (in.layout) {
    case EwLayout::full: return rows * cols * es;
    case EwLayout::row: return cols * es;
    case EwLayout::col: return rows * es;
    case EwLayout::scalar: return es;
  }
  return es;
}

using B = sim::ProgramBuilder;

namespace {
// Rows of tr x cols tiles, double-buffered: tile t+1 loads while tile t computes and tile t-1
// stores (parity registers pick the buffers); the ragged last tile runs after the loop.
void emit_row_pipeline(B& b, const sim::ChipConfig& cfg, const ElementwiseSpec& s, int64_t tr,
                       const std::vector<int64_t>& in_buf, const std::vector<int64_t>& in_size,
                       const std::vector<int64_t>& out_buf, const std::vector<int64_t>& out_size, const TempArena& arena) {
  const int n = int(s.inputs.size()), m = s.num_outputs();
  const int out_reg = n, t_reg = n + m, par_reg = n + m + 1, npar_reg = n + m + 2;  // elementwise_registers
  const int64_t C = s.cols, nr = s.rows / tr, rr = s.rows % tr;
  const int sem_in = 0, sem_out = 1, nq = cfg.dma.engines;
  int per_tile = 0;
  for (const EwInput& in : s.inputs) per_tile += in.layout == EwLayout::full || in.layout == EwLayout::col;
  // Row vectors are the same for every tile: loaded once.
  int once = 0;
  for (int i = 0; i < n; ++i)
    if (s.inputs[size_t(i)].layout == EwLayout::row) {
      b.dma(B::vmem_at(B::at(in_buf[size_t(i)])), B::hbm_at(B::at(0, {{int16_t(i), 1}})),
            {.row_bytes = C * sim::dtype_size(s.inputs[size_t(i)].dtype)}, (once++) % nq, sem_in);
    }
  if (once) b.wait(sem_in, once);
  // Address helpers: a tile is `first` tiles past register t (or absolute when use_t is false);
  // its buffers are those of parity register `preg` (or constant parity `pc` when preg < 0).
  auto vaddr = [&](int64_t base, int64_t size, int preg, int64_t pc) {
    return preg >= 0 ? B::at(base, {{int16_t(preg), size}}) : B::at(base + pc * size);
  };
  auto haddr = [&](int reg, int64_t tile_bytes, int64_t first, bool use_t) {
    sim::Addr a = B::at(first * tile_bytes, {{int16_t(reg), 1}});
    if (use_t) a.terms[1] = {int16_t(t_reg), tile_bytes};
    return a;
  };
  auto loads = [&](int64_t rows, int64_t first, bool use_t, int preg, int64_t pc) {
    int q = 0;
    for (int i = 0; i < n; ++i) {
      const EwInput& in = s.inputs[size_t(i)];
      const int64_t es = sim::dtype_size(in.dtype);
      if (in.layout == EwLayout::full)
        b.dma(B::vmem_at(vaddr(in_buf[size_t(i)], in_size[size_t(i)], preg, pc)),
              B::hbm_at(haddr(i, tr * C * es, first, use_t)), {.row_bytes = rows * C * es}, (q++) % nq, sem_in);
      else if (in.layout == EwLayout::col)
        b.dma(B::vmem_at(vaddr(in_buf[size_t(i)], in_size[size_t(i)], preg, pc)),
              B::hbm_at(haddr(i, tr * es, first, use_t)), {.row_bytes = rows * es}, (q++) % nq, sem_in);
    }
  };
  auto compute_store = [&](int64_t rows, int64_t first, bool use_t, int preg, int64_t pc) {
    std::vector<sim::Operand> ops;
    for (int i = 0; i < n; ++i) {
      const EwInput& in = s.inputs[size_t(i)];
      switch (in.layout) {
        case EwLayout::full: ops.push_back(B::vmem(vaddr(in_buf[size_t(i)], in_size[size_t(i)], preg, pc), in.dtype, C)); break;
        case EwLayout::col: ops.push_back(B::vmem(vaddr(in_buf[size_t(i)], in_size[size_t(i)], preg, pc), in.dtype, 1, 0)); break;
        case EwLayout::row: ops.push_back(B::vmem(B::at(in_buf[size_t(i)]), in.dtype, 0)); break;
        case EwLayout::scalar: ops.push_back(B::vmem(B::at(in_buf[size_t(i)]), in.dtype, 0, 0)); break;
      }
    }
    // Output k's stores go to queue (n + k) in order and signal semaphore sem_out + k, so one
    // wait per output frees that output's buffer of two tiles back.
    std::vector<sim::Operand> dsts;
    for (int k = 0; k < m; ++k) {
      b.wait(sem_out + k);  // a store buffer is free
      dsts.push_back(B::vmem(vaddr(out_buf[size_t(k)], out_size[size_t(k)], preg, pc), s.output_dtype(k), C));
    }
    emit_vec_expr(b, s.expr, ops, dsts, arena, rows, C);
    for (int k = 0; k < m; ++k) {
      const int64_t eo = sim::dtype_size(s.output_dtype(k));
      b.dma(B::hbm_at(haddr(out_reg + k, tr * C * eo, first, use_t)),
            B::vmem_at(vaddr(out_buf[size_t(k)], out_size[size_t(k)], preg, pc)), {.row_bytes = rows * C * eo},
            (n + k) % nq, sem_out + k);
    }
  };
  for (int k = 0; k < m; ++k) b.signal(sem_out + k, 1);  // with the caller's one: both store buffers start free
  loads(tr, 0, false, -1, 0);
  auto body = [&](bool prefetch) {
    b.smod(par_reg, t_reg, 2);
    if (per_tile) b.wait(sem_in, per_tile);
    if (prefetch) {
      b.sadd(npar_reg, t_reg, 1);
      b.smod(npar_reg, npar_reg, 2);
      loads(tr, 1, true, npar_reg, 0);
    }
    compute_store(tr, 0, true, par_reg, 0);
  };
  b.loop(t_reg, nr - 1);
  body(true);
  b.end_loop();
  b.sset(t_reg, nr - 1);
  body(false);
  if (rr > 0) {
    // The ragged tile uses the buffers of parity nr % 2 (those of tile nr - 2, whose store is
    // the earliest to complete).
    loads(rr, nr, false, -1, nr % 2);
    if (per_tile) b.wait(sem_in, per_tile);
    compute_store(rr, nr, false, -1, nr % 2);
  }
  for (int k = 0; k < m; ++k) b.wait(sem_out + k, 2);
  b.fence();
}

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
  std::string k = fmt::format("ew:{}x{}:o{}", s.rows, s.cols, sim::dtype_name(s.out_dtype));
  for (sim::DType t : s.extra_out_dtypes) k += fmt::format("+{}", sim::dtype_name(t));
  k += ":";
  for (const EwInput& in : s.inputs) k += fmt::format("{}{},", int(in.layout), sim::dtype_name(in.dtype));
  return k + s.expr.key();
}

int elementwise_registers(int inputs, int outputs) { return inputs + outputs + 3; }  // see emit_row_pipeline

bool elementwise_fits(const sim::ChipConfig& cfg, int inputs, int outputs) {
  return elementwise_registers(inputs, outputs) <= cfg.scalar.registers && outputs < cfg.scalar.semaphores;
}

namespace {

sim::Program make_elementwise_part(const sim::ChipConfig& cfg, const ElementwiseSpec& s) {
  const int n = int(s.inputs.size()), m = s.num_outputs();
  TPU_CHECK(int(s.expr.extra_results.size()) == m - 1, "internal: codegen: {} output dtypes for {} results", m,
            s.expr.extra_results.size() + 1);
  const int out_reg = n, row_reg = n + m, col_reg = n + m + 1;
  TPU_CHECK(elementwise_fits(cfg, n, m), "internal: codegen: {} inputs and {} outputs exceed the chip's registers or semaphores",
            n, m);
  std::vector<sim::DType> dts;
  for (const EwInput& in : s.inputs) dts.push_back(in.dtype);
  const int slots = vec_temp_slots(s.expr, dts);
  // Full inputs and the outputs are double-buffered (the next row tile loads while this one
  // computes and the previous one stores).
  int64_t per_elem = 4 * slots;
  for (int k = 0; k < m; ++k) per_elem += 2 * sim::dtype_size(s.output_dtype(k));
  for (const EwInput& in : s.inputs)
    if (in.layout == EwLayout::full) per_elem += 2 * sim::dtype_size(in.dtype);
  const int64_t E = vmem_tile_elements(cfg, per_elem);
  const int64_t tc = std::min(s.cols, E);
  const int64_t tr = std::max<int64_t>(1, std::min(s.rows, E / tc));

  // VMEM plan: input buffers, output buffer, temporaries.
  std::vector<int64_t> in_buf(static_cast<size_t>(n)), in_size(static_cast<size_t>(n));
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
    in_size[size_t(i)] = align64(bytes);
    at = align64(at + bytes);
    if (s.inputs[size_t(i)].layout == EwLayout::full || s.inputs[size_t(i)].layout == EwLayout::col)
      at = align64(at + bytes);  // second buffer
  }
  std::vector<int64_t> out_buf(static_cast<size_t>(m)), out_size(static_cast<size_t>(m));
  for (int k = 0; k < m; ++k) {
    out_buf[size_t(k)] = at;
    out_size[size_t(k)] = align64(tr * tc * sim::dtype_size(s.output_dtype(k)));
    at = align64(at + 2 * out_size[size_t(k)]);
  }
  TempArena arena{at, align64(tr * tc * 4), tc, slots};
  at += arena.slot_bytes * slots;
  TPU_CHECK(uint64_t(at) <= cfg.memory.vmem_bytes, "internal: codegen: elementwise tile plan needs {} bytes of VMEM", at);

  const int sem_in = 0, sem_out = 1;
  const int nq = cfg.dma.engines;
  B b(s.name.empty() ? "elementwise" : s.name);
  for (int k = 0; k < m; ++k) b.signal(sem_out + k, 1);
  // Scalars are loaded once.
  int scalars = 0;
  for (int i = 0; i < n; ++i)
    if (s.inputs[size_t(i)].layout == EwLayout::scalar) {
      b.dma(B::vmem_at(B::at(in_buf[size_t(i)])), B::hbm_at(B::at(0, {{int16_t(i), 1}})),
            {.row_bytes = sim::dtype_size(s.inputs[size_t(i)].dtype)}, scalars % nq, sem_in);
      ++scalars;
    }
  if (scalars) b.wait(sem_in, scalars);
  if (tc == s.cols && s.rows / tr >= 2) {
    emit_row_pipeline(b, cfg, s, tr, in_buf, in_size, out_buf, out_size, arena);
    return b.finish();
  }

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
    std::vector<sim::Operand> dsts;
    for (int k = 0; k < m; ++k) {
      b.wait(sem_out + k);  // the previous tile's store has read the output buffer
      dsts.push_back(B::vmem(B::at(out_buf[size_t(k)]), s.output_dtype(k), tc));
    }
    emit_vec_expr(b, s.expr, ops, dsts, arena, p.rows, p.cols);
    for (int k = 0; k < m; ++k) {
      const int64_t eo = sim::dtype_size(s.output_dtype(k));
      b.dma(B::hbm_at(p.addr(out_reg + k, 0, s.cols, eo)), B::vmem_at(B::at(out_buf[size_t(k)])),
            {.rows = p.rows, .row_bytes = p.cols * eo, .dst_row_stride = s.cols * eo, .src_row_stride = tc * eo},
            (n + k) % nq, sem_out + k);
    }
  });
  for (int k = 0; k < m; ++k) b.wait(sem_out + k);
  b.fence();
  return b.finish();
}

}  // namespace

sim::Program make_elementwise_program(const sim::ChipConfig& cfg, const ElementwiseSpec& s) {
  // Megacore: rows split between the cores when the kernel is big enough (one core's estimate:
  // its HBM traffic at one core's bandwidth, or the vector work).
  const int n = int(s.inputs.size());
  std::vector<RowOperand> ops;
  double bytes = 0;
  for (int i = 0; i < n; ++i) {
    const EwInput& in = s.inputs[size_t(i)];
    const int64_t per_row = ew_tile_bytes(in, 1, s.cols) * (in.layout == EwLayout::full || in.layout == EwLayout::col);
    ops.push_back({i, per_row});
    bytes += double(per_row) * double(s.rows);
  }
  for (int k = 0; k < s.num_outputs(); ++k) {
    ops.push_back({n + k, s.cols * sim::dtype_size(s.output_dtype(k))});
    bytes += double(ops.back().bytes_per_row) * double(s.rows);
  }
  const double vregs = std::ceil(double(s.rows) / cfg.vpu.sublanes) * std::ceil(double(s.cols) / cfg.vpu.lanes);
  const double vector = vregs * double(std::max<size_t>(1, s.expr.steps.size())) * cfg.vpu.cycles_per_vreg;
  const int cores = megacore_cores(cfg, std::max(vector, bytes / cfg.hbm_bytes_per_cycle()));
  return split_rows(s.name.empty() ? "elementwise" : s.name, cores, s.rows, cfg.vpu.sublanes, ops, [&](int64_t rows) {
    ElementwiseSpec part = s;
    part.rows = rows;
    return make_elementwise_part(cfg, part);
  });
}

}  // namespace tpu::codegen
