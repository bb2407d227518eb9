// The kernel pricing tpu-plan's training and serving models share: a sum of kernel times, each
// priced by the simulator's timing model on the work it counts and attributed to what bounds it.
#pragma once
#include <algorithm>
#include <cmath>

#include "sim/timing_model.h"
#include "tools/tpu-plan/model.h"
#include "tools/tpu-plan/plan.h"

namespace tpu::plan::detail {

inline double cdiv(double a, double b) { return std::ceil(a / b); }

// Sums kernel times and attributes each to what bounds it.
struct Acc {
  const sim::ChipConfig* cfg = nullptr;
  double devices = 1;  // devices per chip (TensorCores not joined as one megacore device)
  double s = 0, mxu = 0, other = 0, hbm = 0, host = 0;
  double expert = 0;   // seconds of the MoE experts' kernels (between dispatch and combine)
  double bytes = 0;    // HBM bytes the kernels read and write

  double clock() const { return cfg->clock_ghz * 1e9; }
  // One kernel: work of the whole chip; each device does 1/devices of it.
  void kernel(double stream_cycles, double weight_cycles, double vector_cycles, bool reduces, double read, double written,
              double narrow) {
    const sim::TimingConfig& t = cfg->timing;
    const int mc = std::max(1, t.megacore);
    sim::CountedWork w;
    for (int c = 0; c < mc; ++c)
      w.cores.push_back({stream_cycles / devices / mc, vector_cycles / devices / mc, weight_cycles, reduces ? 1.0 : 0.0,
                         narrow / devices / mc, 3});
    w.compulsory_read_bytes = uint64_t(read / devices);
    w.compulsory_written_bytes = uint64_t(written / devices);
    w.traffic_bytes = w.compulsory_read_bytes + w.compulsory_written_bytes;
    bytes += double(w.traffic_bytes) * devices;
    const double cyc = sim::calibrated_cycles(*cfg, w);
    const double fixed = t.launch_cycles + (reduces ? t.reduce_cycles : 0) + t.dma_cycles * 3;
    const double c_mxu = (stream_cycles / devices / mc + t.weight_load_exposed * weight_cycles) / (cfg->mxu.count * t.mxu_efficiency);
    const double c_vec = vector_cycles / devices / mc;
    const double m = double(w.traffic_bytes) / (cfg->hbm_bytes_per_cycle() * mc);
    s += cyc / clock();
    host += fixed / clock();
    const double rest = std::max(0.0, cyc - fixed) / clock();
    if (c_mxu >= c_vec && c_mxu >= m) mxu += rest;
    else if (c_vec >= m) other += rest;
    else hbm += rest;
  }
  // [M, K] x [K, N] with bf16 inputs and `out`-byte results. The vector unit converts the MXU's
  // f32 accumulators and stores them: 16-bit results are 16-bit vector stores (priced at
  // hbm_efficiency, as the simulator prices the library's bf16 matmul programs), f32 results
  // are not (wide_hbm_efficiency).
  void matmul(double M, double K, double N, double out = 2) {
    const double R = cfg->mxu.rows, C = cfg->mxu.cols;
    const double tiles = cdiv(K, R) * cdiv(N, C);
    kernel(cdiv(M, devices) * devices * tiles * cfg->mxu.bf16_cycles_per_row, tiles * R * cfg->mxu.weight_load_cycles_per_row,
           0, false, 2 * (M * K + K * N), out * M * N, out == 2 ? out * M * N : 0);
  }
  // `g` independent [M, K] x [K, N] products of one batched kernel (each with its own weight).
  void batched_matmul(double g, double M, double K, double N, double out = 2) {
    const double R = cfg->mxu.rows, C = cfg->mxu.cols;
    const double tiles = cdiv(K, R) * cdiv(N, C);
    kernel(g * cdiv(M, devices) * devices * tiles * cfg->mxu.bf16_cycles_per_row,
           g * tiles * R * cfg->mxu.weight_load_cycles_per_row, 0, false, g * 2 * (M * K + K * N), g * out * M * N,
           out == 2 ? g * out * M * N : 0);
  }
  // Elementwise / row-wise kernel on bf16 tensors: `in` elements read, `out` written, vpu / eup
  // ops per output element (or per input element when larger).
  void vector(double in, double out, double vpu_ops, double eup_ops, bool reduces) {
    const double vreg = double(cfg->vpu.sublanes) * cfg->vpu.lanes;
    const double n = std::max(in, out) / vreg;
    const double cyc = std::max(n * vpu_ops * cfg->vpu.cycles_per_vreg, n * eup_ops * cfg->eup.cycles_per_vreg) +
                       (reduces ? n * cfg->xlu.reduce_cycles_per_vreg : 0);
    kernel(0, 0, cyc, reduces, 2 * in, 2 * out, 2 * out);
  }
  // Flash attention on `t` query tokens of `ctx` keys (causal: half the pairs when t == ctx),
  // `h` query heads and `hk` KV heads of `d`: `mm` matmul passes (forward 2, backward 5).
  void attention(double t, double ctx, double h, double hk, double d, double mm, bool causal) {
    const double pairs = t * ctx * (causal ? 0.5 : 1.0);
    const double R = cfg->mxu.rows, C = cfg->mxu.cols;
    const double stream = h * (pairs / C * cdiv(d, R) + pairs / R * cdiv(d, C)) / 2 * mm * cfg->mxu.bf16_cycles_per_row;
    const double vreg = double(cfg->vpu.sublanes) * cfg->vpu.lanes;
    const double vec = h * pairs / vreg * std::max(cfg->eup.cycles_per_vreg, 4 * cfg->vpu.cycles_per_vreg) * (mm / 2);
    const double io = 2 * d * (2 * t * h + 2 * ctx * hk) * (mm / 2);
    kernel(stream, 0, vec, true, io * 0.75, io * 0.25, io * 0.25);
  }
};

inline Acc make_acc(const Slice& s) {
  Acc a;
  a.cfg = &s.chip;
  a.devices = std::max(1.0, double(s.chip.cores_per_chip) / std::max(1, s.chip.timing.megacore));
  return a;
}


// A dense SwiGLU MLP of intermediate width F on t tokens: gate + up, silu(gate) * up, down.
// `pointwise_only`: just the vector kernel (selective recomputation).
inline void dense_mlp(Acc& a, double t, double E, double F, bool pointwise_only = false) {
  if (!pointwise_only) a.matmul(t, E, 2 * F);  // gate + up
  a.vector(2 * t * F, t * F, 3, 1, false);     // silu(gate) * up
  if (!pointwise_only) a.matmul(t, F, E);      // down
}

// The MoE MLP on `t` tokens of this chip (ep > 0; dense MLP otherwise): the router's logits
// and top-k, the gather of each token's k copies sorted by expert, the experts' SwiGLU as one
// matmul per local expert (ep chips hold experts / ep experts each; balanced routing brings
// every chip t x top_k rows, t x top_k x ep / experts per expert; tp shards each expert's
// intermediate dimension), and the weighted scatter-add back. The dispatch and combine
// all-to-alls are priced by the caller.
// `chunks`: the experts run once per token chunk (rows / chunks each), see TrainRecipe.
inline void moe_forward(Acc& a, const ModelShape& m, double t, double tp, double ep, bool pointwise_only, double chunks) {
  const double E = double(m.hidden), X = double(m.experts), k = double(m.top_k), F = double(m.expert_intermediate) / tp;
  const double rows = t * k * ep / X / chunks, local = X / ep;
  if (!pointwise_only) a.matmul(t, E, X, 4);          // router logits, f32
  a.vector(t * X, t * k, 6, 1, true);                 // softmax, top-k
  a.vector(t * E, t * k * E, 1, 0, false);            // permute: gather the rows by expert
  const double s0 = a.s;
  for (double c = 0; c < chunks; ++c) {
    for (double e = 0; e < local && !pointwise_only; ++e) a.matmul(rows, E, 2 * F);  // gate + up
    a.vector(2 * t * k * F / chunks, t * k * F / chunks, 3, 1, false);               // silu(gate) * up
    for (double e = 0; e < local && !pointwise_only; ++e) a.matmul(rows, F, E);      // down
  }
  a.expert += a.s - s0;
  a.vector(t * k * E, t * E, 2, 0, false);            // unpermute: weighted scatter-add
}

// Forward of one decoder layer on `t` tokens of context `ctx` (tp shards heads and the MLP).
// `pointwise_only`: just the vector kernels (selective recomputation). `ep` > 0: the MLP is
// the MoE layer of an expert-parallel degree ep.
inline void layer_forward(Acc& a, const ModelShape& m, double t, double ctx, double tp, bool causal, bool pointwise_only = false,
                   bool with_attention = true, double ep = 0, double chunks = 1) {
  const double E = double(m.hidden), D = double(m.head_dim), H = double(m.heads) / tp,
               HK = std::max(1.0, double(m.kv_heads) / tp), F = double(m.intermediate) / tp;
  a.vector(t * E, t * E, 4, 1, true);               // rms_norm
  if (!pointwise_only) a.matmul(t, E, (H + 2 * HK) * D);
  a.vector(t * (H + HK) * D, t * (H + HK) * D, 6, 1, true);  // q/k norm, RoPE
  if (!pointwise_only) {
    if (with_attention) a.attention(t, ctx, H, HK, D, 2, causal);
    a.matmul(t, H * D, E);
  }
  a.vector(2 * t * E, t * E, 1, 0, false);          // residual
  a.vector(t * E, t * E, 4, 1, true);               // rms_norm
  if (ep > 0) moe_forward(a, m, t, tp, ep, pointwise_only, chunks);
  else dense_mlp(a, t, E, F, pointwise_only);
  a.vector(2 * t * E, t * E, 1, 0, false);          // residual
}

}  // namespace tpu::plan::detail
