// Serving a mixture of experts (Mixtral, Qwen3-MoE, DeepSeek-V3) on a slice: attention data
// parallel (each chip holds the attention, dense and shared-expert weights and decodes its own
// requests), the routed experts sharded over an expert-parallel group, each MoE layer's tokens
// dispatched to their experts and combined by two all-to-alls over the group (on the critical
// path: nothing overlaps them). Kernels priced by the simulator's timing model, the all-to-alls
// by the ICI cost model, as the training plans.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tools/tpu-plan/plan.h"
#include "tools/tpu-plan/pricing.h"

namespace tpu::plan {

namespace {

using detail::Acc;

// Multi-head latent attention of one layer on `t` tokens (norm to residual). decode: each token
// attends its own `ctx` cached positions in the absorbed form (the cache read from HBM); else a
// prefill of t tokens attending each other causally, keys and values expanded.
void mla_attention(Acc& a, const ModelShape& m, double t, double ctx, bool decode) {
  const double E = double(m.hidden), H = double(m.heads), Q = double(m.q_lora_rank), C = double(m.kv_lora_rank),
               nope = double(m.qk_nope_dim), rope = double(m.qk_rope_dim), V = double(m.v_head_dim);
  a.vector(t * E, t * E, 4, 1, true);  // rms_norm
  if (m.q_lora_rank > 0) {
    a.matmul(t, E, Q);
    a.vector(t * Q, t * Q, 4, 1, true);  // q_a_layernorm
    a.matmul(t, Q, H * (nope + rope));
  } else {
    a.matmul(t, E, H * (nope + rope));
  }
  a.matmul(t, E, C + rope);               // kv_a: the latent and the shared RoPE key
  a.vector(t * C, t * C, 4, 1, true);     // kv_a_layernorm
  a.vector(t * H * rope, t * H * rope, 6, 1, false);  // RoPE on q and k
  if (decode) {
    // Absorbed: q_nope through each head's W_UK into the latent, attention over the cached
    // latents (+ RoPE keys), the result through each head's W_UV.
    a.batched_matmul(H, t, nope, C);
    a.attention(t, ctx, H, 1, C + rope, 2, false);
    a.kernel(0, 0, 0, false, t * ctx * m.kv_bytes_per_token_layer(), 0, 0);  // the cache read
    a.batched_matmul(H, t, C, V);
  } else {
    a.matmul(t, C, H * (nope + V));         // kv_b: keys and values of every head
    a.attention(t, t, H, H, nope + rope, 2, true);
  }
  a.matmul(t, H * V, E);                    // o_proj
  a.vector(2 * t * E, t * E, 1, 0, false);  // residual
}

// One decoder layer on t tokens, its MLP dense (ep == 0) or the MoE layer with the routed experts
// over ep chips (balanced routing) plus the shared experts. Grouped-query attention is the
// training layer's forward at tp 1, a decode step adding each token's own cached positions.
void serve_layer(Acc& a, const ModelShape& m, double t, double ctx, bool decode, double ep) {
  if (!m.mla()) {
    detail::layer_forward(a, m, t, ctx, 1, true, false, !decode, ep);
    if (decode) {
      a.attention(t, ctx, double(m.heads), double(m.kv_heads), double(m.head_dim), 2, false);
      a.kernel(0, 0, 0, false, t * ctx * m.kv_bytes_per_token_layer(), 0, 0);  // the cache read
    }
    return;
  }
  const double E = double(m.hidden);
  mla_attention(a, m, t, ctx, decode);
  a.vector(t * E, t * E, 4, 1, true);     // rms_norm
  if (ep == 0) {
    detail::dense_mlp(a, t, E, double(m.intermediate));
  } else {
    detail::moe_forward(a, m, t, 1, ep, false, 1);
    if (m.shared_experts > 0) detail::dense_mlp(a, t, E, double(m.shared_experts) * double(m.expert_intermediate));
  }
  a.vector(2 * t * E, t * E, 1, 0, false);  // residual
}

constexpr double kGiga = 1e9;

}  // namespace

Plan plan_serve_moe(const ModelShape& m, const Slice& s, const ServeWorkload& w, double price) {
  const int64_t chips = s.topo.chips();
  const int64_t ep = w.ep > 0 ? w.ep : chips;
  if (w.max_batched_tokens > 0)
    throw PlanError(fmt::format("--max-batched-tokens {}: continuous batching with chunked prefill is modeled for dense "
                                "models; {} is a mixture of experts (omit it for static batches)", w.max_batched_tokens, m.name));
  if (w.tp > 1)
    throw PlanError(fmt::format("--tp {}: serving a mixture of experts is priced with data-parallel attention and "
                                "expert parallelism (--ep); tensor parallelism is not modeled for it", w.tp));
  if (chips % ep != 0) throw PlanError(fmt::format("--ep {} does not divide the slice's {} chips", ep, chips));
  if (m.experts % ep != 0) throw PlanError(fmt::format("--ep {} does not divide the {} experts of {}", ep, m.experts, m.name));
  if (w.input_len < 1 || w.output_len < 1 || w.batch < 1)
    throw PlanError("--input-len, --output-len and --batch must be positive");
  const double E = double(m.hidden), L = double(m.layers), nm = double(m.moe_layers), nd = L - nm;
  const double in = double(w.input_len), out = double(w.output_len), B = double(w.batch), ctx = in + out / 2;
  const Layout l{1, ep, chips / ep, ep};
  // The book's V of one dispatch (or combine): each chip's t x top_k bf16 rows, times the group.
  auto a2a = [&](double t) {
    return collective_s(s, l, 3, sim::CollectiveKind::all_to_all, uint64_t(2 * t * double(m.top_k) * E * double(ep)));
  };
  auto layer_pair = [&](double t, double ctx_len, bool decode) {
    Acc dense = detail::make_acc(s), sparse = detail::make_acc(s);
    serve_layer(dense, m, t, ctx_len, decode, 0);
    serve_layer(sparse, m, t, ctx_len, decode, double(ep));
    return std::pair<Acc, Acc>{dense, sparse};
  };
  // Plain variables, not structured bindings: lambdas below capture them (clang-14 cannot).
  const std::pair<Acc, Acc> pre = layer_pair(in, in, false), dec = layer_pair(B, ctx, true);
  const Acc &pre_d = pre.first, &pre_m = pre.second, &dec_d = dec.first, &dec_m = dec.second;
  Acc head_pre = detail::make_acc(s), head_dec = detail::make_acc(s);
  head_pre.matmul(1, E, double(m.vocab));
  head_dec.matmul(B, E, double(m.vocab));
  const double a2a_pre = 2 * a2a(in), a2a_dec = 2 * a2a(B);
  Plan o;
  o.serve = true;
  o.model = m.name, o.chip = s.chip.name, o.topology = s.topo.str();
  o.layout = fmt::format("attention data parallel x {}, ep={}", chips, ep);
  o.chips = chips;
  o.ttft_s = nd * pre_d.s + nm * (pre_m.s + a2a_pre) + head_pre.s;
  o.tpot_s = nd * dec_d.s + nm * (dec_m.s + a2a_dec) + head_dec.s;
  o.step_s = B * o.ttft_s + out * o.tpot_s;
  o.requests_per_s = double(chips) * B / o.step_s;
  o.tokens_per_s_per_chip = B * (in + out) / o.step_s;
  auto parts = [&](auto f) { return B * (nd * f(pre_d) + nm * f(pre_m)) + out * (nd * f(dec_d) + nm * f(dec_m)); };
  o.breakdown.mxu = parts([](const Acc& a) { return a.mxu; });
  o.breakdown.other_compute = parts([](const Acc& a) { return a.other; });
  o.breakdown.hbm = parts([](const Acc& a) { return a.hbm; });
  o.breakdown.host = parts([](const Acc& a) { return a.host; });
  o.breakdown.all_to_all = nm * (B * a2a_pre + out * a2a_dec);
  o.breakdown.ici_total = o.breakdown.exposed_ici = o.breakdown.all_to_all;
  const double dec_bytes = nd * dec_d.bytes + nm * dec_m.bytes + head_dec.bytes;
  const double peak_bw = s.chip.memory.hbm_bandwidth_gbps * 1e9 * double(s.chip.cores_per_chip);
  o.decode_hbm_use = dec_bytes / o.tpot_s / peak_bw;
  o.decode_a2a_share = nm * a2a_dec / o.tpot_s;
  o.decode_batch = B;
  o.params = m.params(), o.active_params = m.active_params();
  const double flops = 2 * (m.active_params() - double(m.vocab) * E) * B * (in + out);
  o.mfu = flops / (o.step_s * s.chip.chip_peak_flops());
  if (price > 0) o.usd_per_mtok = price / 3600.0 * o.step_s / (B * (in + out)) * 1e6;
  // HBM per chip: every weight but the routed experts on each chip, 1/ep of the routed experts.
  const double routed = nm * double(m.experts) * m.expert_params();
  o.hbm.weights = 2 * (m.params() - routed + routed / double(ep));
  o.hbm.kv_cache = B * (in + out) * L * m.kv_bytes_per_token_layer();
  o.hbm.activations = 2 * in * (E + 3 * std::max(double(m.intermediate), double(m.top_k * m.expert_intermediate))) +
                      4 * B * double(m.vocab);
  o.hbm_capacity = double(s.chip.memory.hbm_bytes) * s.chip.cores_per_chip;
  if (o.hbm.total() > o.hbm_capacity) {
    o.fits = false;
    o.advice = fmt::format("needs {:.2f} GB per chip of {:.2f} GB (weights {:.2f} GB, KV cache {:.2f} GB); more chips "
                           "(a larger --ep) shard the experts, a smaller --batch or context shrinks the KV cache",
                           o.hbm.total() / kGiga, o.hbm_capacity / kGiga, o.hbm.weights / kGiga, o.hbm.kv_cache / kGiga);
  }
  return o;
}

}  // namespace tpu::plan
