// The per-chip cost of a training step or a serving batch: kernels priced by the simulator's
// timing model (sim::calibrated_cycles on the work each kernel counts; the ideal model prices the
// same work at the units' peaks with full overlap), collectives by the ICI cost model.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "sim/timing_model.h"
#include "tools/tpu-plan/plan.h"
#include "tools/tpu-plan/pricing.h"

namespace tpu::plan {

namespace {

using detail::Acc;
using detail::layer_forward;
using detail::make_acc;

void check_heads(const ModelShape& m, int64_t tp) {
  if (m.heads % tp != 0)
    throw PlanError(fmt::format("tp={} does not divide num_attention_heads {} of {}", tp, m.heads, m.name));
  if (m.kv_heads % tp != 0 && tp % m.kv_heads != 0)
    throw PlanError(fmt::format("tp={} neither divides nor is a multiple of num_key_value_heads {} of {}", tp, m.kv_heads,
                                m.name));
  if (m.intermediate % tp != 0)
    throw PlanError(fmt::format("tp={} does not divide intermediate_size {} of {}", tp, m.intermediate, m.name));
}

void moe_backward(Acc& a, const ModelShape& m, double t, double tp, double ep, double chunks) {
  const double E = double(m.hidden), X = double(m.experts), k = double(m.top_k), F = double(m.expert_intermediate) / tp;
  const double rows = t * k * ep / X / chunks, local = X / ep;
  a.vector(2 * t * k * E, t * k * E, 2, 0, false);    // unpermute backward (and the gate weights' grad)
  const double s0 = a.s;
  for (double c = 0; c < chunks; ++c) {
    for (double e = 0; e < local; ++e) {
      a.matmul(rows, E, F);                           // down: dX
      a.matmul(F, rows, E);                           // down: dW
    }
    a.vector(3 * t * k * F / chunks, 2 * t * k * F / chunks, 6, 2, false);
    for (double e = 0; e < local; ++e) {
      a.matmul(rows, 2 * F, E);                       // gate + up: dX
      a.matmul(E, rows, 2 * F);                       // gate + up: dW
    }
  }
  a.expert += a.s - s0;
  a.vector(t * k * E, t * E, 1, 0, false);            // permute backward
  a.vector(2 * t * X, t * X, 6, 1, true);             // softmax / top-k backward
  a.matmul(t, X, E);                                  // router dX
  a.matmul(E, t, X);                                  // router dW
}

// Backward: dX and dW of every matmul, attention's backward, vector kernels at twice the work.
void layer_backward(Acc& a, const ModelShape& m, double t, double ctx, double tp, double ep = 0, double chunks = 1) {
  const double E = double(m.hidden), D = double(m.head_dim), H = double(m.heads) / tp,
               HK = std::max(1.0, double(m.kv_heads) / tp), F = double(m.intermediate) / tp;
  auto mm2 = [&](double K, double N) {
    a.matmul(t, N, K);  // dX
    a.matmul(K, t, N);  // dW
  };
  a.vector(3 * t * E, t * E, 2, 0, false);          // residual grads
  if (ep > 0) {
    moe_backward(a, m, t, tp, ep, chunks);
  } else {
    mm2(F, E);
    a.vector(3 * t * F, 2 * t * F, 6, 2, false);    // silu * up backward
    mm2(E, 2 * F);
  }
  a.vector(2 * t * E, t * E, 8, 1, true);           // rms_norm backward
  mm2(H * D, E);
  a.attention(t, ctx, H, HK, D, 5, true);
  a.vector(2 * t * (H + HK) * D, t * (H + HK) * D, 12, 1, true);  // RoPE, q/k norm backward
  mm2(E, (H + 2 * HK) * D);
  a.vector(2 * t * E, t * E, 8, 1, true);           // rms_norm backward
}

constexpr double kGB = 1e9;

// The expert-parallel degree of a layout against the model: PlanError naming what does not divide.
void check_ep(const ModelShape& m, const Layout& l) {
  if (l.ep < 1) throw PlanError(fmt::format("--ep {} must be a positive integer", l.ep));
  if (!m.moe()) {
    if (l.ep > 1) throw PlanError(fmt::format("--ep {}: {} is a dense model (expert parallelism needs a mixture of experts)", l.ep, m.name));
    return;
  }
  if (m.experts % l.ep != 0)
    throw PlanError(fmt::format("--ep {} does not divide the {} experts of {}", l.ep, m.experts, m.name));
  if (l.fsdp % l.ep != 0)
    throw PlanError(fmt::format("--ep {} does not divide fsdp={} (the expert-parallel group lies within the FSDP axes)", l.ep, l.fsdp));
  if (m.expert_intermediate % l.tp != 0)
    throw PlanError(fmt::format("tp={} does not divide the experts' intermediate size {} of {}", l.tp, m.expert_intermediate, m.name));
}

// One layer's parameters on a chip before FSDP sharding, averaged over the layers (MoE layers
// hold experts / ep of their experts).
double layer_params_per_chip(const ModelShape& m, const Layout& l) {
  const double L = double(m.layers), nm = double(m.moe() ? m.moe_layers : 0);
  const double moe = m.moe() ? m.attention_params() + double(m.hidden) * double(m.experts) +
                                   double(m.experts) / double(l.ep) * m.expert_params()
                             : 0;
  return ((L - nm) * m.layer_params() + nm * moe) / L / double(l.tp);
}

}  // namespace

double matmul_seconds(const Slice& s, double m, double k, double n, double out_bytes) {
  Acc a = make_acc(s);
  a.matmul(m, k, n, out_bytes);
  return a.s;
}

StepParts step_parts(const ModelShape& m, const Slice& s, const TrainRecipe& r) {
  const Layout& l = r.layout;
  if (m.mla())
    throw PlanError(fmt::format("training {} (multi-head latent attention) is not modeled; --serve prices its serving",
                                m.name));
  check_heads(m, l.tp);
  check_ep(m, l);
  if (r.global_batch < 1 || r.seq < 1) throw PlanError("--global-batch and --seq must be positive");
  if (l.slices < 1) throw PlanError(fmt::format("--slices {} must be a positive integer", l.slices));
  const int64_t replicas = l.dp * l.fsdp * l.slices;
  if (r.global_batch % replicas != 0)
    throw PlanError(fmt::format("--global-batch {} is not a multiple of {} = {} (sequences per data-parallel rank)",
                                r.global_batch, l.slices > 1 ? "slices x dp x fsdp" : "dp x fsdp", replicas));
  const double b = double(r.global_batch / replicas), S = double(r.seq), t = b * S, tp = double(l.tp);
  StepParts p;
  Acc head = make_acc(s), opt = make_acc(s);
  // One layer's forward and backward (with the remat policy's recomputation); ep > 0: a MoE layer.
  if (r.a2a_chunks < 1) throw PlanError(fmt::format("--a2a-chunks {} must be a positive integer", r.a2a_chunks));
  const double chunks = l.ep > 1 ? double(r.a2a_chunks) : 1;
  if (m.moe() && chunks > t * double(m.top_k) * double(l.ep) / double(m.experts))
    throw PlanError(fmt::format("--a2a-chunks {} is more than the {} rows each expert gets per MoE layer", r.a2a_chunks,
                                t * double(m.top_k) * double(l.ep) / double(m.experts)));
  auto layer = [&](double ep) {
    std::pair<Acc, Acc> fb{make_acc(s), make_acc(s)};
    Acc &f = fb.first, &bw = fb.second;
    layer_forward(f, m, t, S, tp, true, false, true, ep, chunks);
    if (r.remat == Remat::full) layer_forward(bw, m, t, S, tp, true, false, true, ep, chunks);
    if (r.remat == Remat::selective) layer_forward(bw, m, t, S, tp, true, true, true, ep, chunks);
    layer_backward(bw, m, t, S, tp, ep, chunks);
    return fb;
  };
  const double L = double(m.layers), nm = double(m.moe() ? m.moe_layers : 0), nd = L - nm;
  const auto [fd, bd] = nd > 0 ? layer(0) : std::pair<Acc, Acc>{make_acc(s), make_acc(s)};
  const auto [fm, bm] = nm > 0 ? layer(double(l.ep)) : std::pair<Acc, Acc>{make_acc(s), make_acc(s)};
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
  // Per-layer times are the mean over the layers (dense and MoE layers mixed).
  p.layer_fwd_s = (nd * fd.s + nm * fm.s) / L, p.layer_bwd_s = (nd * bd.s + nm * bm.s) / L;
  p.dense_fwd_s = fd.s, p.dense_bwd_s = bd.s, p.moe_fwd_s = fm.s, p.moe_bwd_s = bm.s;
  p.expert_fwd_s = fm.expert, p.expert_bwd_s = bm.expert;
  p.head_s = head.s, p.optimizer_s = opt.s;
  p.mxu = nd * (fd.mxu + bd.mxu) + nm * (fm.mxu + bm.mxu) + head.mxu + opt.mxu;
  p.other = nd * (fd.other + bd.other) + nm * (fm.other + bm.other) + head.other + opt.other;
  p.hbm = nd * (fd.hbm + bd.hbm) + nm * (fm.hbm + bm.hbm) + head.hbm + opt.hbm;
  p.host = nd * (fd.host + bd.host) + nm * (fm.host + bm.host) + head.host + opt.host;
  const double lp = layer_params_per_chip(m, l);
  if (l.fsdp > 1) {
    p.gather_bytes = uint64_t(2 * lp);              // bf16 weights gathered on each chip
    p.scatter_bytes = uint64_t(4 * lp);             // f32 gradients in on each chip
  }
  if (l.dp > 1) p.dp_bytes = uint64_t(4 * lp / double(l.fsdp));
  if (l.slices > 1) p.dcn_bytes = uint64_t(4 * lp / double(l.fsdp * l.dp));
  if (l.tp > 1) p.tp_bytes = uint64_t(2 * t * E);
  if (nm > 0 && l.ep > 1) {
    // Each chip sends its t x top_k bf16 token copies (the TP ranks of a token hold the same).
    p.a2a_bytes = uint64_t(2 * t * double(m.top_k) * E * double(l.ep));
    p.a2a_per_layer_fwd = 2;
    p.a2a_per_layer_bwd = r.remat == Remat::full ? 4 : 2;
  }
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
  // MoE with chunks C: each exchange moves C pieces of 1/C of the bytes (each piece pays the
  // collective's fixed cost).
  const double C = l.ep > 1 ? double(r.a2a_chunks) : 1;
  const double a2a = C * collective_s(s, l, 3, K::all_to_all, uint64_t(double(p.a2a_bytes) / C));
  const double L = double(m.layers), nm = double(m.moe() ? m.moe_layers : 0), nd = L - nm;
  // One layer of one pass: its compute `c` against the ICI work `ici` behind it (max of the
  // two), and for a MoE layer `n` all-to-alls of a2a seconds each, which need the ICI too and
  // sit between the router and the experts (dispatch) and before the next kernel (combine).
  // With one chunk nothing hides them. With C chunks, chunk i+1's dispatch and chunk i-1's
  // combine run while chunk i's experts (x seconds in all) compute: a two-stage pipeline over
  // C chunks takes max(x, A) + min(x, A) / C, of which all but x is the exchange's.
  auto pass = [&](double c, double ici, double x, int n) {
    const double base = std::max(c, ici);
    if (n == 0 || a2a == 0) return std::pair<double, double>{base, 0};
    const double A = n * a2a;
    const double exposed = std::max(x, A) + std::min(x, A) / C - x;
    const double t = std::max(c + exposed, ici + A);
    return std::pair<double, double>{t, t - base};
  };
  const auto [dense_f, dense_fa] = pass(p.dense_fwd_s, ag, 0, 0);
  // Multi-slice: each layer's gradients are all-reduced over DCN (a network of its own) behind
  // the next layer's backward; the last one is exposed.
  const double dcn = dcn_all_reduce_s(s, l.slices, p.dcn_bytes);
  const auto [dense_b0, dense_ba] = pass(p.dense_bwd_s, ag + rs + ar_dp, 0, 0);
  const auto [moe_f, moe_fa] = pass(p.moe_fwd_s, ag, p.expert_fwd_s, p.a2a_per_layer_fwd);
  const auto [moe_b0, moe_ba] = pass(p.moe_bwd_s, ag + rs + ar_dp, p.expert_bwd_s, p.a2a_per_layer_bwd);
  const double dense_b = std::max(dense_b0, dcn), moe_b = std::max(moe_b0, dcn);
  const double a2a_exposed = nd * (dense_fa + dense_ba) + nm * (moe_fa + moe_ba);
  // Forward: each layer's compute overlaps the gather of the next layer's weights; TP's
  // all-reduces sit on the critical path. Backward: the gather (FSDP frees gathered weights
  // after use), the reduce-scatter of the previous layer's gradients and the DP all-reduce run
  // on the chip's ICI one after another, behind the layer's compute. Pipeline ends exposed.
  const double fwd = nd * dense_f + nm * moe_f + L * p.tp_per_layer_fwd * ar_tp;
  const double bwd = nd * dense_b + nm * moe_b + L * p.tp_per_layer_bwd * ar_tp;
  const double step = ag + fwd + p.head_s + bwd + rs + ar_dp + dcn + p.optimizer_s;
  const double compute = L * (p.layer_fwd_s + p.layer_bwd_s) + p.head_s + p.optimizer_s;
  Plan o;
  o.model = m.name, o.chip = s.chip.name, o.topology = s.topo.str(), o.layout = l.str();
  if (l.slices > 1) o.topology = fmt::format("{} slices of {} over DCN", l.slices, o.topology);
  if (C > 1) o.layout += fmt::format(" a2a-chunks={}", r.a2a_chunks);
  o.chips = s.topo.chips() * l.slices;
  o.step_s = step;
  const double dcn_exposed = nd * (dense_b - dense_b0) + nm * (moe_b - moe_b0) + dcn;
  o.breakdown = {p.mxu, p.other, p.hbm, std::max(0.0, step - compute - dcn_exposed), p.host,
                 L * (2 * ag + rs + ar_dp + (p.tp_per_layer_fwd + p.tp_per_layer_bwd) * ar_tp) + ag + rs + ar_dp +
                     nm * (p.a2a_per_layer_fwd + p.a2a_per_layer_bwd) * a2a,
                 a2a_exposed,
                 L * dcn,
                 dcn_exposed};
  const double tokens = double(r.global_batch) * double(r.seq);
  // Model FLOPs: 6 N per token (N: the parameters a token uses, MoE: the active ones, without the
  // embedding lookup) + causal attention.
  o.params = m.params(), o.active_params = m.active_params();
  const double n = m.active_params() - double(m.vocab) * double(m.hidden) * (m.tied ? 0 : 1);
  const double flops = tokens * (6 * n + 6.0 * double(m.layers) * double(r.seq) * double(m.heads) * double(m.head_dim));
  o.mfu = flops / (step * double(o.chips) * s.chip.chip_peak_flops());
  o.tokens_per_s_per_chip = tokens / step / double(o.chips);
  if (price > 0) o.usd_per_mtok = price * double(o.chips) / 3600.0 * step / tokens * 1e6;
  // HBM per chip.
  const double shard = m.params() / double(l.tp * l.fsdp), tp = double(l.tp);
  const double t = double(r.global_batch / (l.dp * l.fsdp * l.slices)) * double(r.seq);
  const double E = double(m.hidden), D = double(m.head_dim), H = double(m.heads) / tp,
               HK = std::max(1.0, double(m.kv_heads) / tp);
  // MoE layers: the top_k experts' intermediates and the dispatched copies (in and out) per token.
  const double kF = m.moe() ? (double(m.layers - m.moe_layers) * double(m.intermediate) +
                               double(m.moe_layers) * double(m.top_k) * double(m.expert_intermediate)) / L / tp
                            : double(m.intermediate) / tp;
  const double kE = m.moe() && l.ep > 1 ? 2.0 * double(m.top_k) * E * double(m.moe_layers) / L : 0;
  const double none = 2 * (5 * E + (H + 2 * HK) * D + H * D + 3 * kF + kE);  // bytes per token and layer
  const double sel = 2 * (E + (H + 2 * HK) * D + H * D + 2 * kF + kE);
  auto act = [&](Remat rm) {
    const double per = rm == Remat::none ? none : rm == Remat::selective ? sel : 2 * E;
    return t * (per * L + (rm == Remat::full ? none : 0) + 8 * double(m.vocab) / tp);
  };
  o.hbm.weights = 2 * shard;
  o.hbm.optimizer = 12 * shard;
  o.hbm.gradients = 4 * shard;
  o.hbm.gathered = l.fsdp > 1 ? layer_params_per_chip(m, l) * (2 * 2 + 4) : 0;
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
                            r.global_batch / (l.dp * l.fsdp * l.slices));
  }
  return o;
}

namespace {

// Continuous batching with chunked prefill (vLLM's V1 engine) in its steady state. A request is
// `in` prompt tokens and out - 1 decode tokens of the steps' work (its first output token comes
// out of its last prompt chunk). Every step decodes the d running requests and fills the rest
// of the token budget T with prompt chunks; requests leave at d / (out - 1) per step and enter at
// P / in, so d = T (out - 1) / (in + out - 1) and P = T - d, unless the KV cache binds first
// (d = batch, P = in d / (out - 1)). The step: the layers' matmuls and vector kernels on d + P
// tokens, decode attention of d queries over the mean context in + out / 2, the chunks' causal
// attention (P queries over a prompt's keys: in / 2 keys each on average), the lm_head on the
// sampling rows (d + P / in). Requests/s = (d + P) / (in + out - 1) per step.
Plan plan_serve_chunked(const ModelShape& m, const Slice& s, const ServeWorkload& w, const Layout& l, double price) {
  const double tp = double(l.tp), E = double(m.hidden), L = double(m.layers), V = double(m.vocab) / tp;
  const double in = double(w.input_len), out = double(w.output_len), B = double(w.batch), T = double(w.max_batched_tokens);
  if (w.output_len < 2) throw PlanError("--max-batched-tokens needs --output-len of at least 2 (a request that decodes)");
  const double d = std::min(B, T * (out - 1) / (in + out - 1));
  const double P = std::min(T - d, in * d / (out - 1));
  const double HK = std::max(1.0, double(m.kv_heads) / tp), D = double(m.head_dim), H = double(m.heads) / tp;
  Acc step = make_acc(s), head = make_acc(s);
  layer_forward(step, m, d + P, 0, tp, false, false, false);   // matmuls and vector kernels on every token
  step.attention(d, in + out / 2, H, HK, D, 2, false);         // decodes
  step.kernel(0, 0, 0, false, d * (in + out / 2) * 2 * HK * D * 2, 0, 0);  // their KV cache stream
  step.attention(P, in, H, HK, D, 2, true);                     // prompt chunks, causal over the prompt
  head.matmul(d + P / in, E, V);
  using K = sim::CollectiveKind;
  const double ar = collective_s(s, l, 0, K::all_reduce, uint64_t(2 * (d + P) * E));
  Plan o;
  o.serve = true;
  o.model = m.name, o.chip = s.chip.name, o.topology = s.topo.str(), o.layout = l.str() + fmt::format(" max-batched-tokens={}", w.max_batched_tokens);
  o.chips = s.topo.chips();
  o.step_s = L * (step.s + 2 * ar) + head.s;
  o.tpot_s = o.step_s;                       // every running request gets one token per step
  o.ttft_s = std::ceil(in / std::max(P, 1.0)) * o.step_s;  // a prompt's chunks, once it is scheduled (queueing aside)
  const double n_rep = double(o.chips / l.tp);
  o.requests_per_s = n_rep * (d + P) / (in + out - 1) / o.step_s;
  o.tokens_per_s_per_chip = (d + P) / (in + out - 1) * (in + out) / o.step_s / tp;
  o.decode_batch = d;
  o.step_tokens = d + P;
  o.breakdown = {L * step.mxu + head.mxu, L * step.other + head.other, L * step.hbm + head.hbm, L * 2 * ar,
                 L * step.host + head.host, L * 2 * ar};
  const double flops = 2 * (m.params() - double(m.vocab) * E) * (d + P);
  o.mfu = flops / (o.step_s * tp * s.chip.chip_peak_flops());
  if (price > 0) o.usd_per_mtok = price * tp / 3600.0 / (o.tokens_per_s_per_chip * tp) * 1e6;
  o.hbm.weights = 2 * m.params() / tp;
  o.hbm.kv_cache = B * (in + out) * L * 2 * HK * D * 2;
  o.hbm.activations = 2 * T * (E + 3 * double(m.intermediate) / tp) + 4 * (d + 1) * V;
  o.hbm_capacity = double(s.chip.memory.hbm_bytes) * s.chip.cores_per_chip;
  if (o.hbm.total() > o.hbm_capacity) {
    o.fits = false;
    o.advice = fmt::format("needs {:.2f} GB per chip of {:.2f} GB (weights {:.2f} GB, KV cache for {} requests {:.2f} GB); a "
                           "larger --tp shards the weights, a smaller --batch or context shrinks the KV cache",
                           o.hbm.total() / kGB, o.hbm_capacity / kGB, o.hbm.weights / kGB, w.batch, o.hbm.kv_cache / kGB);
  }
  return o;
}

}  // namespace

Plan plan_serve(const ModelShape& m, const Slice& s, const ServeWorkload& w, double price) {
  if (m.moe()) return plan_serve_moe(m, s, w, price);
  if (w.ep > 0) throw PlanError(fmt::format("--ep {}: {} is a dense model (expert parallelism needs a mixture of experts)", w.ep, m.name));
  const int64_t chips = s.topo.chips();
  const int64_t tpi = w.tp > 0 ? w.tp : chips;
  if (chips % tpi != 0)
    throw PlanError(fmt::format("--tp {} does not divide the slice's {} chips", tpi, chips));
  if (w.input_len < 1 || w.output_len < 1 || w.batch < 1)
    throw PlanError("--input-len, --output-len and --batch must be positive");
  if (w.max_batched_tokens < 0) throw PlanError(fmt::format("--max-batched-tokens {} must be positive", w.max_batched_tokens));
  Layout l{tpi, 1, chips / tpi};
  check_heads(m, tpi);
  if (w.max_batched_tokens > 0) return plan_serve_chunked(m, s, w, l, price);
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
      for (int64_t ep = 1; ep <= (m.moe() ? std::min(fsdp, m.experts) : 1); ++ep) {
        if (fsdp % ep || (m.moe() && m.experts % ep)) continue;
        r.layout = {tp, fsdp, n / tp / fsdp, ep, r.layout.slices};
        try {
          Plan p = plan_train(m, s, r, price);
          if (p.fits) out.push_back(std::move(p));
        } catch (const PlanError&) {
          // A layout the mesh, the heads, the experts or the batch cannot take is not a candidate.
        }
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const Plan& a, const Plan& b) { return a.tokens_per_s_per_chip > b.tokens_per_s_per_chip; });
  return out;
}

}  // namespace tpu::plan
