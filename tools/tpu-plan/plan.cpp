// The per-chip cost of a training step or a serving batch: kernels priced by the simulator's
// timing model (sim::calibrated_cycles on the work each kernel counts; the ideal model prices the
// same work at the units' peaks with full overlap), collectives by the ICI cost model.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "sim/timing_model.h"
#include "tools/tpu-plan/plan.h"

namespace tpu::plan {

namespace {

double cdiv(double a, double b) { return std::ceil(a / b); }

// Sums kernel times and attributes each to what bounds it.
struct Acc {
  const sim::ChipConfig* cfg = nullptr;
  double devices = 1;  // devices per chip (TensorCores not joined as one megacore device)
  double s = 0, mxu = 0, other = 0, hbm = 0, host = 0;

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
  // [M, K] x [K, N] with bf16 inputs and `out`-byte results, which the MXU path stores (no
  // 16-bit vector stores: the sustained HBM fraction is wide_hbm_efficiency).
  void matmul(double M, double K, double N, double out = 2) {
    const double R = cfg->mxu.rows, C = cfg->mxu.cols;
    const double tiles = cdiv(K, R) * cdiv(N, C);
    kernel(cdiv(M, devices) * devices * tiles * cfg->mxu.bf16_cycles_per_row, tiles * R * cfg->mxu.weight_load_cycles_per_row,
           0, false, 2 * (M * K + K * N), out * M * N, 0);
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

Acc make_acc(const Slice& s) {
  Acc a;
  a.cfg = &s.chip;
  a.devices = std::max(1.0, double(s.chip.cores_per_chip) / std::max(1, s.chip.timing.megacore));
  return a;
}

void check_heads(const ModelShape& m, int64_t tp) {
  if (m.heads % tp != 0)
    throw PlanError(fmt::format("tp={} does not divide num_attention_heads {} of {}", tp, m.heads, m.name));
  if (m.kv_heads % tp != 0 && tp % m.kv_heads != 0)
    throw PlanError(fmt::format("tp={} neither divides nor is a multiple of num_key_value_heads {} of {}", tp, m.kv_heads,
                                m.name));
  if (m.intermediate % tp != 0)
    throw PlanError(fmt::format("tp={} does not divide intermediate_size {} of {}", tp, m.intermediate, m.name));
}

// Forward of one decoder layer on `t` tokens of context `ctx` (tp shards heads and the MLP).
// `pointwise_only`: just the vector kernels (selective recomputation).
void layer_forward(Acc& a, const ModelShape& m, double t, double ctx, double tp, bool causal, bool pointwise_only = false,
                   bool with_attention = true) {
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
  if (!pointwise_only) a.matmul(t, E, 2 * F);       // gate + up
  a.vector(2 * t * F, t * F, 3, 1, false);          // silu(gate) * up
  if (!pointwise_only) a.matmul(t, F, E);
  a.vector(2 * t * E, t * E, 1, 0, false);          // residual
}

// Backward: dX and dW of every matmul, attention's backward, vector kernels at twice the work.
void layer_backward(Acc& a, const ModelShape& m, double t, double ctx, double tp) {
  const double E = double(m.hidden), D = double(m.head_dim), H = double(m.heads) / tp,
               HK = std::max(1.0, double(m.kv_heads) / tp), F = double(m.intermediate) / tp;
  auto mm2 = [&](double K, double N) {
    a.matmul(t, N, K);  // dX
    a.matmul(K, t, N);  // dW
  };
  a.vector(3 * t * E, t * E, 2, 0, false);          // residual grads
  mm2(F, E);
  a.vector(3 * t * F, 2 * t * F, 6, 2, false);      // silu * up backward
  mm2(E, 2 * F);
  a.vector(2 * t * E, t * E, 8, 1, true);           // rms_norm backward
  mm2(H * D, E);
  a.attention(t, ctx, H, HK, D, 5, true);
  a.vector(2 * t * (H + HK) * D, t * (H + HK) * D, 12, 1, true);  // RoPE, q/k norm backward
  mm2(E, (H + 2 * HK) * D);
  a.vector(2 * t * E, t * E, 8, 1, true);           // rms_norm backward
}

constexpr double kGB = 1e9;

}  // namespace

double matmul_seconds(const Slice& s, double m, double k, double n, double out_bytes) {
  Acc a = make_acc(s);
  a.matmul(m, k, n, out_bytes);
  return a.s;
}

StepParts step_parts(const ModelShape& m, const Slice& s, const TrainRecipe& r) {
  const Layout& l = r.layout;
  check_heads(m, l.tp);
  if (r.global_batch < 1 || r.seq < 1) throw PlanError("--global-batch and --seq must be positive");
  if (r.global_batch % (l.dp * l.fsdp) != 0)
    throw PlanError(fmt::format("--global-batch {} is not a multiple of dp x fsdp = {} (sequences per data-parallel rank)",
                                r.global_batch, l.dp * l.fsdp));
  const double b = double(r.global_batch / (l.dp * l.fsdp)), S = double(r.seq), t = b * S, tp = double(l.tp);
  StepParts p;
  Acc f = make_acc(s), bw = make_acc(s), head = make_acc(s), opt = make_acc(s);
  layer_forward(f, m, t, S, tp, true);
  if (r.remat == Remat::full) layer_forward(bw, m, t, S, tp, true);
  if (r.remat == Remat::selective) layer_forward(bw, m, t, S, tp, true, true);
  layer_backward(bw, m, t, S, tp);
  const double E = double(m.hidden), V = double(m.vocab) / tp;
  head.vector(t * E, t * E, 4, 1, true);
  head.matmul(t, E, V);
  head.vector(t * V, t, 3, 1, true);                // logsumexp
  head.vector(t * V, t * V, 3, 1, false);           // softmax gradient
  head.matmul(t, V, E);
  head.matmul(E, t, V);
  const double shard = m.params() / double(l.tp * l.fsdp);
  opt.kernel(0, 0, shard / (double(s.chip.vpu.sublanes) * s.chip.vpu.lanes) * 14 * s.chip.vpu.cycles_per_vreg, false,
             16 * shard, 14 * shard, 2 * shard);    // AdamW: p, m, v, g in; p, m, v and the bf16 copy out
  p.layer_fwd_s = f.s, p.layer_bwd_s = bw.s, p.head_s = head.s, p.optimizer_s = opt.s;
  const double L = double(m.layers);
  p.mxu = L * (f.mxu + bw.mxu) + head.mxu + opt.mxu;
  p.other = L * (f.other + bw.other) + head.other + opt.other;
  p.hbm = L * (f.hbm + bw.hbm) + head.hbm + opt.hbm;
  p.host = L * (f.host + bw.host) + head.host + opt.host;
  const double lp = m.layer_params() / tp;
  if (l.fsdp > 1) {
    p.gather_bytes = uint64_t(2 * lp);              // bf16 weights gathered on each chip
    p.scatter_bytes = uint64_t(4 * lp);             // f32 gradients in on each chip
  }
  if (l.dp > 1) p.dp_bytes = uint64_t(4 * lp / double(l.fsdp));
  if (l.tp > 1) p.tp_bytes = uint64_t(2 * t * E);
  return p;
}

Plan plan_train(const ModelShape& m, const Slice& s, const TrainRecipe& r, double price) {
  const Layout& l = r.layout;
  const StepParts p = step_parts(m, s, r);
  using K = sim::CollectiveKind;
  const double ag = collective_s(s, l, 1, K::all_gather, p.gather_bytes);
  const double rs = collective_s(s, l, 1, K::reduce_scatter, p.scatter_bytes);
  const double ar_dp = collective_s(s, l, 2, K::all_reduce, p.dp_bytes);
  const double ar_tp = collective_s(s, l, 0, K::all_reduce, p.tp_bytes);
  const double L = double(m.layers);
  // Forward: each layer's compute overlaps the gather of the next layer's weights; TP's
  // all-reduces sit on the critical path. Backward: the gather (FSDP frees gathered weights
  // after use), the reduce-scatter of the previous layer's gradients and the DP all-reduce run
  // on the chip's ICI one after another, behind the layer's compute. Pipeline ends exposed.
  const double fwd = L * (std::max(p.layer_fwd_s, ag) + p.tp_per_layer_fwd * ar_tp);
  const double bwd = L * (std::max(p.layer_bwd_s, ag + rs + ar_dp) + p.tp_per_layer_bwd * ar_tp);
  const double step = ag + fwd + p.head_s + bwd + rs + ar_dp + p.optimizer_s;
  const double compute = L * (p.layer_fwd_s + p.layer_bwd_s) + p.head_s + p.optimizer_s;
  Plan o;
  o.model = m.name, o.chip = s.chip.name, o.topology = s.topo.str(), o.layout = l.str();
  o.chips = s.topo.chips();
  o.step_s = step;
  o.breakdown = {p.mxu, p.other, p.hbm, std::max(0.0, step - compute), p.host,
                 L * (2 * ag + rs + ar_dp + (p.tp_per_layer_fwd + p.tp_per_layer_bwd) * ar_tp) + ag + rs + ar_dp};
  const double tokens = double(r.global_batch) * double(r.seq);
  // Model FLOPs: 6 N per token (N without the embedding lookup) + causal attention.
  const double n = m.params() - double(m.vocab) * double(m.hidden) * (m.tied ? 0 : 1);
  const double flops = tokens * (6 * n + 6.0 * double(m.layers) * double(r.seq) * double(m.heads) * double(m.head_dim));
  o.mfu = flops / (step * double(o.chips) * s.chip.chip_peak_flops());
  o.tokens_per_s_per_chip = tokens / step / double(o.chips);
  if (price > 0) o.usd_per_mtok = price * double(o.chips) / 3600.0 * step / tokens * 1e6;
  // HBM per chip.
  const double shard = m.params() / double(l.tp * l.fsdp), tp = double(l.tp);
  const double t = double(r.global_batch / (l.dp * l.fsdp)) * double(r.seq);
  const double E = double(m.hidden), D = double(m.head_dim), H = double(m.heads) / tp,
               HK = std::max(1.0, double(m.kv_heads) / tp), F = double(m.intermediate) / tp;
  const double none = 2 * (5 * E + (H + 2 * HK) * D + H * D + 3 * F);  // bytes per token and layer
  const double sel = 2 * (E + (H + 2 * HK) * D + H * D + 2 * F);
  auto act = [&](Remat rm) {
    const double per = rm == Remat::none ? none : rm == Remat::selective ? sel : 2 * E;
    return t * (per * L + (rm == Remat::full ? none : 0) + 8 * double(m.vocab) / tp);
  };
  o.hbm.weights = 2 * shard;
  o.hbm.optimizer = 12 * shard;
  o.hbm.gradients = 4 * shard;
  o.hbm.gathered = l.fsdp > 1 ? m.layer_params() / tp * (2 * 2 + 4) : 0;
  o.hbm.activations = act(r.remat);
  o.hbm_capacity = double(s.chip.memory.hbm_bytes) * s.chip.cores_per_chip;
  if (o.hbm.total() > o.hbm_capacity) {
    o.fits = false;
    const double state = o.hbm.weights + o.hbm.optimizer + o.hbm.gradients + o.hbm.gathered;
    o.advice = fmt::format("needs {:.2f} GB per chip of {:.2f} GB (weights, optimizer and gradients {:.2f} GB, "
                           "activations {:.2f} GB)",
                           o.hbm.total() / kGB, o.hbm_capacity / kGB, state / kGB, o.hbm.activations / kGB);
    if (r.remat != Remat::full)
      o.advice += fmt::format("; --remat full needs {:.2f} GB of activations", act(Remat::full) / kGB);
    if (state > 0.5 * o.hbm_capacity) o.advice += "; shard the state further (a larger --fsdp or --tp, or more --chips)";
    o.advice += fmt::format("; or fewer tokens per chip (--global-batch {} gives {} sequences per chip)", r.global_batch,
                            r.global_batch / (l.dp * l.fsdp));
  }
  return o;
}

Plan plan_serve(const ModelShape& m, const Slice& s, const ServeWorkload& w, double price) {
  const int64_t chips = s.topo.chips();
  const int64_t tpi = w.tp > 0 ? w.tp : chips;
  if (chips % tpi != 0)
    throw PlanError(fmt::format("--tp {} does not divide the slice's {} chips", tpi, chips));
  if (w.input_len < 1 || w.output_len < 1 || w.batch < 1)
    throw PlanError("--input-len, --output-len and --batch must be positive");
  Layout l{tpi, 1, chips / tpi};
  check_heads(m, tpi);
  const double tp = double(tpi), E = double(m.hidden), L = double(m.layers), V = double(m.vocab) / tp;
  const double in = double(w.input_len), out = double(w.output_len), B = double(w.batch);
  using K = sim::CollectiveKind;
  // Prefill of one request; decode of the batch at the mean context.
  Acc pre = make_acc(s), dec = make_acc(s);
  layer_forward(pre, m, in, in, tp, true);
  const double ctx = in + out / 2;
  layer_forward(dec, m, B, 0, tp, false, false, false);  // matmuls and vector kernels on B tokens
  const double HK = std::max(1.0, double(m.kv_heads) / tp), D = double(m.head_dim);
  dec.attention(B, ctx, double(m.heads) / tp, HK, D, 2, false);
  // Decode attention streams the KV cache: B x ctx x 2 x HK x D bf16 read per layer.
  dec.kernel(0, 0, 0, false, B * ctx * 2 * HK * D * 2, 0, 0);
  Acc head_pre = make_acc(s), head_dec = make_acc(s);
  head_pre.matmul(1, E, V);
  head_dec.matmul(B, E, V);
  const double ar_pre = collective_s(s, l, 0, K::all_reduce, uint64_t(2 * in * E));
  const double ar_dec = collective_s(s, l, 0, K::all_reduce, uint64_t(2 * B * E));
  Plan o;
  o.serve = true;
  o.model = m.name, o.chip = s.chip.name, o.topology = s.topo.str(), o.layout = l.str();
  o.chips = chips;
  o.ttft_s = L * (pre.s + 2 * ar_pre) + head_pre.s;
  o.tpot_s = L * (dec.s + 2 * ar_dec) + head_dec.s;
  o.step_s = B * o.ttft_s + out * o.tpot_s;
  const double n_rep = double(chips / tpi);
  o.requests_per_s = n_rep * B / o.step_s;
  o.tokens_per_s_per_chip = B * (in + out) / o.step_s / tp;
  o.breakdown = {L * (B * pre.mxu + out * dec.mxu),
                 L * (B * pre.other + out * dec.other),
                 L * (B * pre.hbm + out * dec.hbm),
                 L * 2 * (B * ar_pre + out * ar_dec),
                 L * (B * pre.host + out * dec.host),
                 L * 2 * (B * ar_pre + out * ar_dec)};
  const double flops = 2 * (m.params() - double(m.vocab) * E) * B * (in + out);
  o.mfu = flops / (o.step_s * tp * s.chip.chip_peak_flops());
  if (price > 0) o.usd_per_mtok = price * tp / 3600.0 * o.step_s / (B * (in + out)) * 1e6;
  o.hbm.weights = 2 * m.params() / tp;
  o.hbm.kv_cache = B * (in + out) * L * 2 * HK * D * 2;
  o.hbm.activations = 2 * in * (E + 3 * double(m.intermediate) / tp) + 4 * B * V;
  o.hbm_capacity = double(s.chip.memory.hbm_bytes) * s.chip.cores_per_chip;
  if (o.hbm.total() > o.hbm_capacity) {
    o.fits = false;
    o.advice = fmt::format("needs {:.2f} GB per chip of {:.2f} GB (weights {:.2f} GB, KV cache {:.2f} GB); a larger --tp "
                           "shards the weights, a smaller --batch or context shrinks the KV cache",
                           o.hbm.total() / kGB, o.hbm_capacity / kGB, o.hbm.weights / kGB, o.hbm.kv_cache / kGB);
  }
  return o;
}

std::vector<Plan> search_train(const ModelShape& m, const Slice& s, TrainRecipe r, double price) {
  const int64_t n = s.topo.chips();
  std::vector<Plan> out;
  for (int64_t tp = 1; tp <= n; ++tp) {
    if (n % tp) continue;
    for (int64_t fsdp = 1; fsdp <= n / tp; ++fsdp) {
      if ((n / tp) % fsdp) continue;
      r.layout = {tp, fsdp, n / tp / fsdp};
      try {
        Plan p = plan_train(m, s, r, price);
        if (p.fits) out.push_back(std::move(p));
      } catch (const PlanError&) {
        // A layout the mesh, the heads or the batch cannot take is not a candidate.
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const Plan& a, const Plan& b) { return a.tokens_per_s_per_chip > b.tokens_per_s_per_chip; });
  return out;
}

}  // namespace tpu::plan
