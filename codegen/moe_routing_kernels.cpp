// The router's top-k and the sort of its choices by expert on the chip, as data-driven
// programs: one program per (row length, k, dtype, row stride), resp. per expert count, serves
// every token count and routing, since the number of tiles and the tail rows are registers
// (`loopr`) and the routing is data.
//
//   topk(x [.., n], k) along the last dim -> values [.., k] (x's dtype), indices [.., k] i64
//     per tile of rows (then the tail rows one by one): x cast to f32 in VMEM; k rounds of
//     selection on the vector units with row reductions on the cross-lane unit. A round takes,
//     among the entries not yet taken, the NaNs if the row has one left (NaN is the largest),
//     else those equal to the row's maximum, and of them the lowest index (the cpu kernel's
//     order: ties in index order); the value is gathered from x by a max over the one-hot row
//     (so -0.0 and NaN come back as they are). Indices are exact while n < 2^24; they are
//     written as i64 (the low word, a zero high word).
//
//   moe_sort(expert_ids [T, k], E) -> order [S] i32, group_sizes [E] i32 (S = T k)
//     a stable counting sort in two passes over tiles of slots: the one-hot [tile, E] of the ids
//     (compare against an index row); pass 1 sums it down the slots into the counts, whose
//     exclusive prefix over the experts (a strict-triangle mask, summed) gives each expert's
//     start; pass 2 gives each slot its rank among the earlier slots of its expert (a strictly
//     lower-triangular [tile, tile] matrix times the one-hot on the MXUs, in bf16: exact for 0/1,
//     plus the running counts of the earlier tiles), its position (start + rank, picked by the
//     one-hot) and then writes its index there (one 4-byte DMA per slot, the position read back
//     with `sld`). i64 ids (topk's) are read as their low words. The host reads the ids once
//     to check their range (as moe_kernels reads the tables it checks); a bad id is a tpu::Error.
//
// topk: f32 and bf16 inputs whose last dim is contiguous (rows evenly strided), k up to 8 and rows
// whose working set fits VMEM; moe_sort: E up to 2^24 whose working set fits VMEM. Anything else
// takes the counted host fallback.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "ops/fallback.h"
#include "sim/builder.h"
#include "tpucore/ops.h"

namespace tpu::codegen {
namespace {

using TopkB = sim::ProgramBuilder;

constexpr int64_t kTopkMaxK = 8;
constexpr float kTopkBigIndex = 16777216.f;  // 2^24: above every index

int64_t topk_align(int64_t v) { return (v + 63) / 64 * 64; }

struct TopkSpec {
  int64_t n = 0, k = 0, tr = 0, xs = 0;  // xs: row stride of x in bytes
  DType dt = DType::f32;
};

// VMEM bytes of the program's buffers for tiles of tr rows.
int64_t topk_vmem(const TopkSpec& s) {
  const int64_t es = s.dt == DType::bf16 ? 2 : 4;
  return topk_align(s.tr * s.n * es) + 7 * topk_align(s.tr * s.n * 4) + 2 * topk_align(s.n * 4) +
         4 * topk_align(s.tr * 4) + topk_align(s.tr * s.k * 4) + topk_align(s.tr * s.k * es) +
         topk_align(s.tr * s.k * 8);
}

// r0 x, r1 values, r2 indices, r3 iota table [n] f32, r4 full tiles, r5 tail rows, r6 first tail row.
sim::Program make_topk_program(const TopkSpec& s) {
  enum { rX = 0, rV, rI, rIota, rFull, rTail, rTail0, rT, rRow, rJ };
  const sim::DType dt = s.dt == DType::bf16 ? sim::DType::bf16 : sim::DType::f32;
  const sim::DType f = sim::DType::f32;
  const int64_t es = sim::dtype_size(dt), n = s.n, k = s.k, tr = s.tr;
  int64_t at = 0;
  auto take = [&](int64_t bytes) { const int64_t o = at; at += topk_align(bytes); return o; };
  const int64_t xin = take(tr * n * es), X = take(tr * n * 4), Xc = take(tr * n * 4), NANM = take(tr * n * 4);
  const int64_t Tk = take(tr * n * 4), A = take(tr * n * 4), C = take(tr * n * 4), OH = take(tr * n * 4);
  const int64_t I = take(n * 4), NI = take(n * 4);
  const int64_t hn = take(tr * 4), m = take(tr * 4), mi = take(tr * 4), idx = take(tr * 4);
  const int64_t val = take(tr * k * 4), valo = take(tr * k * es), idxo = take(tr * k * 8);
  TopkB b(fmt::format("topk_{}x{}", n, k));
  auto mat = [&](int64_t addr) { return TopkB::vmem(TopkB::at(addr), f, n); };
  auto col = [&](int64_t addr) { return TopkB::vmem(TopkB::at(addr), f, 1); };      // [rows, 1]
  auto col_b = [&](int64_t addr) { return TopkB::vmem(TopkB::at(addr), f, 1, 0); };  // across the row
  auto row_b = [&](int64_t addr) { return TopkB::vmem(TopkB::at(addr), f, 0, 1); };  // down the rows
  // The index row and its negation, once.
  b.dma(TopkB::vmem_at(TopkB::at(I)), TopkB::hbm_at(TopkB::at(0, {{rIota, 1}})), {.rows = 1, .row_bytes = n * 4}, 0, 0);
  b.wait(0);
  b.unary(sim::Op::vneg, TopkB::vmem(TopkB::at(NI), f), TopkB::vmem(TopkB::at(I), f), 1, n);
  // `rows` rows from row rRow of x.
  auto body = [&](int64_t rows) {
    b.dma(TopkB::vmem_at(TopkB::at(xin)), TopkB::hbm_at(TopkB::at(0, {{rX, 1}, {rRow, s.xs}})),
          {.rows = rows, .row_bytes = n * es, .src_row_stride = s.xs}, 0, 0);
    b.wait(0);
    b.unary(sim::Op::vcast, mat(X), TopkB::vmem(TopkB::at(xin), dt, n), rows, n);
    b.binary(sim::Op::vcmpeq, mat(A), mat(X), mat(X), rows, n);  // 1 where not NaN
    b.ternary(sim::Op::vsel, mat(NANM), mat(A), TopkB::imm(0.f), TopkB::imm(1.f), rows, n);
    b.ternary(sim::Op::vsel, mat(Xc), mat(A), mat(X), TopkB::imm(-INFINITY), rows, n);
    b.fill(mat(Tk), 0.f, rows, n);
    for (int64_t j = 0; j < k; ++j) {
      // NaNs left, and whether the row has one.
      b.ternary(sim::Op::vsel, mat(C), mat(Tk), TopkB::imm(0.f), mat(NANM), rows, n);
      b.reduce(sim::Op::xmax, col(hn), mat(C), rows, n);
      // Else the entries left equal to the maximum of those left.
      b.ternary(sim::Op::vsel, mat(A), mat(Tk), TopkB::imm(-INFINITY), mat(Xc), rows, n);
      b.reduce(sim::Op::xmax, col(m), mat(A), rows, n);
      b.binary(sim::Op::vcmpeq, mat(OH), mat(A), col_b(m), rows, n);
      b.ternary(sim::Op::vsel, mat(OH), mat(Tk), TopkB::imm(0.f), mat(OH), rows, n);
      b.ternary(sim::Op::vsel, mat(C), col_b(hn), mat(C), mat(OH), rows, n);
      // The lowest index among the candidates: -max(-index).
      b.ternary(sim::Op::vsel, mat(A), mat(C), row_b(NI), TopkB::imm(-kTopkBigIndex), rows, n);
      b.reduce(sim::Op::xmax, col(mi), mat(A), rows, n);
      b.unary(sim::Op::vneg, col(idx), col(mi), rows, 1);
      b.binary(sim::Op::vcmpeq, mat(OH), row_b(I), col_b(idx), rows, n);
      // Its value, gathered from x as it is.
      b.ternary(sim::Op::vsel, mat(A), mat(OH), mat(X), TopkB::imm(-INFINITY), rows, n);
      b.reduce(sim::Op::xmax, TopkB::vmem(TopkB::at(val + j * 4), f, k), mat(A), rows, n);
      b.unary(sim::Op::vcast, TopkB::vmem(TopkB::at(idxo + j * 8), sim::DType::i32, 2 * k), col(idx), rows, 1);
      b.binary(sim::Op::vmax, mat(Tk), mat(Tk), mat(OH), rows, n);
    }
    b.unary(sim::Op::vcast, TopkB::vmem(TopkB::at(valo), dt, k), TopkB::vmem(TopkB::at(val), f, k), rows, k);
    b.dma(TopkB::hbm_at(TopkB::at(0, {{rV, 1}, {rRow, k * es}})), TopkB::vmem_at(TopkB::at(valo)),
          {.rows = 1, .row_bytes = rows * k * es}, 0, 1);
    b.dma(TopkB::hbm_at(TopkB::at(0, {{rI, 1}, {rRow, k * 8}})), TopkB::vmem_at(TopkB::at(idxo)),
          {.rows = 1, .row_bytes = rows * k * 8}, 0, 1);
    b.wait(1, 2);
  };
  // The high words of the i64 indices stay zero.
  b.fill(col(hn), 0.f, tr, 1);
  b.unary(sim::Op::vcast, TopkB::vmem(TopkB::at(idxo), sim::DType::i32, 2 * k), col_b(hn), tr, 2 * k);
  b.loop_reg(rT, rFull);
  b.smul(rRow, rT, tr);
  body(tr);
  b.end_loop();
  b.loop_reg(rJ, rTail);
  b.sadd(rRow, rTail0, 0);
  body(1);
  b.sadd(rTail0, rTail0, 1);
  b.end_loop();
  b.fence();
  return b.finish();
}

bool topk_chip(const ops::KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor &vals = a.outputs[0], &idx = a.outputs[1];
  const DType dt = x.dtype();
  if ((dt != DType::f32 && dt != DType::bf16) || x.dim() < 1) return false;
  const int64_t d = a.attrs.get_int("dim");
  if (d != -1 && d != x.dim() - 1) return false;
  const int64_t k = a.attrs.get_int("k"), n = x.size(-1);
  if (k == 0 || x.numel() == 0) return true;
  if (k > kTopkMaxK || n >= (int64_t{1} << 24) || !vals.is_contiguous() || !idx.is_contiguous()) return false;
  // Rows evenly strided: contiguous, or a 2-d view with a contiguous last dim.
  if (!x.is_contiguous() && !(x.dim() == 2 && x.strides()[1] == 1)) return false;
  const int64_t rows = x.numel() / n, es = int64_t(x.element_size());
  const Device dev = x.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  TopkSpec s{.n = n, .k = k, .tr = 0, .xs = (x.dim() == 2 ? x.strides()[0] : n) * es, .dt = dt};
  for (int64_t tr : {int64_t(cfg.mxu.rows), int64_t{8}, int64_t{1}}) {
    s.tr = tr;
    if (topk_vmem(s) <= int64_t(cfg.memory.vmem_bytes) * 9 / 10) break;
    s.tr = 0;
  }
  if (s.tr == 0) return false;
  std::vector<float> iota(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) iota[static_cast<size_t>(i)] = float(i);
  const Tensor tab = from_vector(iota, Shape{n}, TensorOptions(DType::f32, dev));
  const LoadedProgram lp = cached_program(dev, fmt::format("topk:{}:{}:tr{}:{}:{}", n, k, s.tr, s.xs, dtype_name(dt)),
                                          [&] { return make_topk_program(s); });
  const int64_t full = rows / s.tr;
  launch(dev, lp, "topk",
         {hbm_address(x), hbm_address(vals), hbm_address(idx), hbm_address(tab), full, rows - full * s.tr, full * s.tr});
  return true;
}


struct SortSpec {
  int64_t E = 0, tr = 0;
  bool wide = false;  // i64 ids: their low words are read
};

int64_t sort_vmem(const SortSpec& s) {
  return 2 * topk_align(s.tr * 4) + 6 * topk_align(s.tr * s.E * 4) + 2 * topk_align(std::max(s.E, s.tr) * 4) +
         4 * topk_align(s.E * 4) + topk_align(s.E * s.E * 4) + 2 * topk_align(s.tr * s.tr * 4);
}

// r0 ids [S] i32, r1 order, r2 group sizes, r3 iota [max(E, tr)] f32, r4 iota [S] i32, r5 full
// tiles, r6 tail slots, r7 first tail slot.
sim::Program make_sort_program(const sim::ChipConfig& cfg, const SortSpec& s) {
  enum { rIds = 0, rOrd, rSizes, rIotaF, rIotaI, rFull, rTail, rTail0, rT, rRow, rI, rPos, rJ };
  const sim::DType f = sim::DType::f32;
  const int64_t E = s.E, tr = s.tr, Cc = cfg.mxu.cols, L = std::max(E, tr);
  int64_t at = 0;
  auto take = [&](int64_t bytes) { const int64_t o = at; at += topk_align(bytes); return o; };
  const int64_t idi = take(tr * 4), idf = take(tr * 4), OH = take(tr * E * 4), OHb = take(tr * E * 2);
  const int64_t RK = take(tr * E * 4), Q = take(tr * E * 4), pos = take(tr * 4), posi = take(tr * 4);
  const int64_t I = take(L * 4), cnt = take(E * 4), run = take(E * 4), start = take(E * 4), tmp = take(E * 4);
  const int64_t M = take(E * E * 4), LT = take(tr * tr * 4), LTb = take(tr * tr * 2), szi = take(E * 4);
  TopkB b(fmt::format("moe_sort_{}", E));
  auto row_b = [&](int64_t addr) { return TopkB::vmem(TopkB::at(addr), f, 0, 1); };
  auto col_b = [&](int64_t addr) { return TopkB::vmem(TopkB::at(addr), f, 1, 0); };
  auto mat = [&](int64_t addr, int64_t w) { return TopkB::vmem(TopkB::at(addr), f, w); };
  b.dma(TopkB::vmem_at(TopkB::at(I)), TopkB::hbm_at(TopkB::at(0, {{rIotaF, 1}})), {.rows = 1, .row_bytes = L * 4}, 0, 0);
  b.wait(0);
  // The strictly lower triangle [tr, tr] (column < row), in bf16 for the MXUs.
  b.binary(sim::Op::vcmplt, mat(LT, tr), row_b(I), col_b(I), tr, tr);
  b.unary(sim::Op::vcast, TopkB::vmem(TopkB::at(LTb), sim::DType::bf16, tr), mat(LT, tr), tr, tr);
  b.fill(mat(cnt, E), 0.f, 1, E);
  // The one-hot of `rows` ids from slot rRow.
  auto one_hot = [&](int64_t rows) {
    const int64_t iw = s.wide ? 8 : 4;
    b.dma(TopkB::vmem_at(TopkB::at(idi)), TopkB::hbm_at(TopkB::at(0, {{rIds, 1}, {rRow, iw}})),
          {.rows = rows, .row_bytes = 4, .src_row_stride = iw}, 0, 0);
    b.wait(0);
    b.unary(sim::Op::vcast, TopkB::vmem(TopkB::at(idf), f, 1), TopkB::vmem(TopkB::at(idi), sim::DType::i32, 1), rows, 1);
    b.binary(sim::Op::vcmpeq, mat(OH, E), col_b(idf), row_b(I), rows, E);
  };
  auto count = [&](int64_t rows, int64_t into) {
    b.reduce(sim::Op::xsum, mat(tmp, E), mat(OH, E), rows, E, 0);
    b.binary(sim::Op::vadd, mat(into, E), mat(into, E), mat(tmp, E), 1, E);
  };
  auto tiles = [&](const std::function<void(int64_t)>& body) {
    b.loop_reg(rT, rFull);
    b.smul(rRow, rT, tr);
    body(tr);
    b.end_loop();
    b.sadd(rRow, rTail0, 0);
    b.loop_reg(rJ, rTail);
    body(1);
    b.sadd(rRow, rRow, 1);
    b.end_loop();
  };
  tiles([&](int64_t rows) {
    one_hot(rows);
    count(rows, cnt);
  });
  // start[e] = sum over e' < e of cnt[e']; the counts out as i32.
  b.binary(sim::Op::vcmplt, mat(M, E), TopkB::vmem(TopkB::at(I), f, 1, 0), row_b(I), E, E);
  b.binary(sim::Op::vmul, mat(M, E), mat(M, E), TopkB::vmem(TopkB::at(cnt), f, 1, 0), E, E);
  b.reduce(sim::Op::xsum, mat(start, E), mat(M, E), E, E, 0);
  b.unary(sim::Op::vcast, TopkB::vmem(TopkB::at(szi), sim::DType::i32, E), mat(cnt, E), 1, E);
  b.dma(TopkB::hbm_at(TopkB::at(0, {{rSizes, 1}})), TopkB::vmem_at(TopkB::at(szi)), {.rows = 1, .row_bytes = E * 4}, 0, 0);
  b.wait(0);
  b.unary(sim::Op::vmov, mat(run, E), mat(start, E), 1, E);
  tiles([&](int64_t rows) {
    one_hot(rows);
    // Rank among the tile's earlier slots of the same expert (none for a single slot).
    if (rows > 1) {
      b.unary(sim::Op::vcast, TopkB::vmem(TopkB::at(OHb), sim::DType::bf16, E), mat(OH, E), rows, E);
      for (int64_t j = 0; j * Cc < E; ++j) {
        const int64_t nn = std::min(Cc, E - j * Cc);
        const int mxu = int(j % cfg.mxu.count);
        b.mxu_load_weights(mxu, TopkB::vmem(TopkB::at(OHb + j * Cc * 2), sim::DType::bf16, E), rows, nn,
                           sim::MxuMode::bf16);
        b.mxu_matmul(mxu, TopkB::vmem(TopkB::at(RK + j * Cc * 4), f, E), TopkB::vmem(TopkB::at(LTb), sim::DType::bf16, tr),
                     rows, rows, nn, false, sim::MxuMode::bf16);
      }
      b.binary(sim::Op::vadd, mat(Q, E), mat(RK, E), row_b(run), rows, E);
    } else {
      b.unary(sim::Op::vmov, mat(Q, E), row_b(run), rows, E);
    }
    b.binary(sim::Op::vmul, mat(Q, E), mat(Q, E), mat(OH, E), rows, E);
    b.reduce(sim::Op::xsum, TopkB::vmem(TopkB::at(pos), f, 1), mat(Q, E), rows, E);
    b.unary(sim::Op::vcast, TopkB::vmem(TopkB::at(posi), sim::DType::i32, 1), TopkB::vmem(TopkB::at(pos), f, 1), rows, 1);
    count(rows, run);
    // order[pos[i]] = slot rRow + i.
    b.loop(rI, rows);
    b.sload(rPos, TopkB::vmem_at(TopkB::at(posi, {{rI, 4}})));
    b.dma(TopkB::hbm_at(TopkB::at(0, {{rOrd, 1}, {rPos, 4}})), TopkB::hbm_at(TopkB::at(0, {{rIotaI, 1}, {rRow, 4}, {rI, 4}})),
          {.rows = 1, .row_bytes = 4}, 0, 1);
    b.end_loop();
    b.wait(1, rows);
  });
  b.fence();
  return b.finish();
}

bool moe_sort_chip(const ops::KernelArgs& a) {
  const Tensor& ids = a.inputs[0];
  const Tensor &order = a.outputs[0], &sizes = a.outputs[1];
  const int64_t E = a.attrs.get_int("num_experts"), S = ids.numel();
  if ((ids.dtype() != DType::i32 && ids.dtype() != DType::i64) || !ids.is_contiguous() || !order.is_contiguous() ||
      !sizes.is_contiguous() || E >= (int64_t{1} << 24) || S >= (int64_t{1} << 24))
    return false;
  const Device dev = order.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  SortSpec s{.E = E, .tr = int64_t(cfg.mxu.rows), .wide = ids.dtype() == DType::i64};
  if (sort_vmem(s) > int64_t(cfg.memory.vmem_bytes) * 9 / 10) return false;
  // The range check of the cpu kernel, on the host's copy of the ids.
  const std::vector<int64_t> v = ids.to_vector<int64_t>();
  for (size_t i = 0; i < v.size(); ++i)
    TPU_CHECK(v[i] >= 0 && v[i] < E, "moe_sort: expert id {} at slot {} is out of range for {} experts", v[i], i, E);
  const int64_t L = std::max(E, s.tr);
  std::vector<float> iota_f(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) iota_f[static_cast<size_t>(i)] = float(i);
  std::vector<int32_t> iota_i(static_cast<size_t>(std::max<int64_t>(S, 1)));
  for (size_t i = 0; i < iota_i.size(); ++i) iota_i[i] = int32_t(i);
  const Tensor tf = from_vector(iota_f, Shape{L}, TensorOptions(DType::f32, dev));
  const Tensor ti = from_vector(iota_i, Shape{int64_t(iota_i.size())}, TensorOptions(DType::i32, dev));
  const LoadedProgram lp = cached_program(dev, fmt::format("moe_sort:{}:tr{}:{}", E, s.tr, s.wide),
                                          [&] { return make_sort_program(cfg, s); });
  const int64_t full = S / s.tr;
  launch(dev, lp, "moe_sort",
         {S ? hbm_address(ids) : 0, S ? hbm_address(order) : 0, hbm_address(sizes), hbm_address(tf), hbm_address(ti), full,
          S - full * s.tr, full * s.tr});
  return true;
}

const Lowering kTopkRule{.eager = &topk_chip};
const Lowering kSortRule{.eager = &moe_sort_chip};

[[maybe_unused]] const bool g_topk_registered = [] {
  install_lowering("topk", &kTopkRule);
  install_lowering("moe_sort", &kSortRule);
  return true;
}();

}  // namespace
}  // namespace tpu::codegen
