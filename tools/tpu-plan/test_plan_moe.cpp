// tpu-plan on mixtures of experts: parameter counts of Hub configs against the model cards, the
// expert-parallel all-to-all's price against the torus closed form, the --ep layout checks, and
// MFU counted on the active parameters.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <tuple>

#include "tools/tpu-plan/plan.h"
#include "tools/tpu-plan/plan_testing.h"

using namespace tpu;
using Catch::Matchers::Contains;

using plan_testing::read_testdata;

TEST_CASE("MoE configs against the model cards' total and active parameters") {
  // mistralai/Mixtral-8x7B-v0.1: 46.7B parameters, 12.9B used per token.
  const plan::ModelShape mx = plan::model_from_config(read_testdata("mixtral_config.json"), "Mixtral-8x7B");
  CHECK(mx.experts == 8);
  CHECK(mx.top_k == 2);
  CHECK(mx.moe_layers == 32);
  CHECK(mx.params() / 1e9 == Approx(46.7).epsilon(0.005));
  CHECK(mx.active_params() / 1e9 == Approx(12.9).epsilon(0.005));
  // Qwen/Qwen3-30B-A3B: 30.5B in total, 3.3B activated (29.9B without the embeddings).
  const plan::ModelShape qw = plan::model_from_config(read_testdata("qwen3_moe_config.json"), "Qwen3-30B-A3B");
  CHECK(qw.moe_layers == 48);
  CHECK(qw.params() / 1e9 == Approx(30.5).epsilon(0.005));
  CHECK(qw.active_params() / 1e9 == Approx(3.3).epsilon(0.02));
  CHECK(qw.body_params() / 1e9 == Approx(29.9).epsilon(0.005));
  // The named shapes are the same models.
  CHECK(plan::named_model("mixtral-8x7b").params() == Approx(mx.params()));
  CHECK(plan::named_model("qwen3-30b-a3b").active_params() == Approx(qw.active_params()));
  // decoder_sparse_step and mlp_only_layers as Transformers reads them: layer i is sparse when
  // (i + 1) % step == 0 and i is not listed. 48 layers, step 2: 24 sparse, minus layer 1 listed.
  std::string cfg = read_testdata("qwen3_moe_config.json");
  cfg.insert(cfg.rfind('}'), ", \"decoder_sparse_step\": 2, \"mlp_only_layers\": [0, 1]");
  const plan::ModelShape half = plan::model_from_config(cfg);
  CHECK(half.moe_layers == 23);
  const double dense_layer = half.attention_params() + 3.0 * 2048 * 6144;
  CHECK(half.body_params() == Approx(25 * dense_layer + 23 * qw.moe_layer_params()));
  CHECK_THROWS_WITH(plan::model_from_config("{\"model_type\": \"mixtral\", \"hidden_size\": 64}"), Contains("intermediate_size"));
}

TEST_CASE("the expert-parallel all-to-all against the torus closed form (bisection bandwidth)") {
  // All-to-all of V bytes in all (V / G per chip, V / G^2 to each peer) over G chips. Half the
  // chips send V / 4 to the other half, across the bisection. A ring of n chips with wraparound
  // is cut at two places: 2 links per direction, so V / 8 per link direction at W bytes/s:
  // T = V / (8 W). A 2-D torus n x m (m the longer axis, both with wraparound) cut across its
  // longer axis: 2 n links per direction, T = V / (8 n W). Hop latency is left out (V large).
  const double V = 4e9;
  {
    const plan::Slice s = plan::make_slice("v5p-ideal", false, "4x4x8", 0);  // the last axis: 8, wraparound
    const double W = s.topo.ici.link_gbps * 1e9;
    // ep = 8 on the last axis (tp = 1): one ring of 8.
    const double t = plan::collective_s(s, {.tp = 1, .fsdp = 128, .dp = 1, .ep = 8}, 3, sim::CollectiveKind::all_to_all,
                                        uint64_t(V));
    CHECK(t == Approx(V / (8 * W)).epsilon(0.10));
  }
  {
    const plan::Slice s = plan::make_slice("v6e-ideal", false, "16x16", 0);  // both axes wrap (16)
    const double W = s.topo.ici.link_gbps * 1e9;
    const double t = plan::collective_s(s, {.tp = 1, .fsdp = 256, .dp = 1, .ep = 256}, 3, sim::CollectiveKind::all_to_all,
                                        uint64_t(V));
    CHECK(t == Approx(V / (8 * 16 * W)).epsilon(0.10));
    // 16 chips on one wrapped axis of v6e: a ring of 16.
    const double t16 = plan::collective_s(s, {.tp = 1, .fsdp = 256, .dp = 1, .ep = 16}, 3, sim::CollectiveKind::all_to_all,
                                          uint64_t(V));
    CHECK(t16 == Approx(V / (8 * W)).epsilon(0.10));
  }
}

TEST_CASE("expert parallelism in a training plan: layout checks, active-parameter MFU, exposed all-to-all") {
  const plan::ModelShape m = plan::named_model("tiny-moe");
  const plan::Slice s = plan::make_slice("tiny", true, "2x2x2", 0);
  plan::TrainRecipe r;
  r.global_batch = 8;
  r.seq = 32;
  r.layout = {.tp = 1, .fsdp = 8, .dp = 1, .ep = 3};
  CHECK_THROWS_WITH(plan::plan_train(m, s, r), Contains("--ep 3 does not divide the 8 experts of tiny-moe"));
  r.layout = {.tp = 1, .fsdp = 4, .dp = 2, .ep = 8};
  CHECK_THROWS_WITH(plan::plan_train(m, s, r), Contains("--ep 8 does not divide fsdp=4"));
  r.layout = {.tp = 1, .fsdp = 8, .dp = 1, .ep = 2};
  CHECK_THROWS_WITH(plan::plan_train(plan::named_model("tiny"), s, r), Contains("dense model"));

  r.layout = {.tp = 1, .fsdp = 8, .dp = 1, .ep = 1};
  const plan::Plan p1 = plan::plan_train(m, s, r);
  CHECK(p1.breakdown.all_to_all == 0);
  r.layout.ep = 4;
  const plan::StepParts parts = plan::step_parts(m, s, r);
  // Each chip dispatches its tokens' top_k bf16 copies: the book's V is that times the group.
  const double t = 32;  // one sequence of 32 tokens per chip
  CHECK(parts.a2a_bytes == uint64_t(2 * t * 2 * 64 * 4));
  CHECK(parts.a2a_per_layer_fwd == 2);
  CHECK(parts.a2a_per_layer_bwd == 4);  // full rematerialization repeats the forward's
  const plan::Plan p4 = plan::plan_train(m, s, r);
  const double one = plan::collective_s(s, r.layout, 3, sim::CollectiveKind::all_to_all, parts.a2a_bytes);
  CHECK(one > 0);
  CHECK(p4.breakdown.all_to_all == Approx(2 * 6 * one));  // 2 MoE layers x (2 + 4)
  CHECK(p4.breakdown.exposed_ici >= p4.breakdown.all_to_all * 0.999);
  // MFU counts the active parameters: the same step with every expert active would count more.
  const double active_body = m.active_params() - 256.0 * 64;
  const double flops = 8 * 32 * (6 * active_body + 6.0 * 2 * 32 * 4 * 16);
  CHECK(p4.mfu == Approx(flops / (p4.step_s * 8 * s.chip.chip_peak_flops())).epsilon(1e-9));
  CHECK(m.active_params() < m.params());
  // The search tries expert-parallel degrees too.
  const auto plans = plan::search_train(m, s, r);
  bool any_ep = false;
  for (const auto& p : plans) any_ep = any_ep || p.layout.find("ep=") != std::string::npos;
  CHECK(any_ep);
}

TEST_CASE("DeepSeek-V3: the Hub config against the model card; MoE serving against closed forms") {
  const plan::ModelShape d = plan::model_from_config(read_testdata("deepseek_v3_config.json"), "DeepSeek-V3");
  // The model card: 671B parameters (without the multi-token-prediction module), 37B activated.
  CHECK(d.params() / 1e9 == Approx(671).epsilon(0.002));
  CHECK(d.active_params() / 1e9 == Approx(37).epsilon(0.02));
  CHECK(d.moe_layers == 58);  // first_k_dense_replace 3 of 61
  CHECK(d.kv_bytes_per_token_layer() == 2 * (512 + 64));  // the latent and the RoPE key, bf16
  // MLA weights of one layer: q_a, q_b, kv_a, kv_b, o_proj and the four norms.
  const double attn = 7168.0 * 1536 + 1536.0 * 128 * 192 + 7168.0 * 576 + 512.0 * 128 * 256 + 128.0 * 128 * 7168 +
                      1536 + 512 + 2 * 7168;
  CHECK(d.attention_params() == Approx(attn).epsilon(1e-12));
  const plan::Slice s = plan::make_slice("tiny", false, "2x2x2", 0);
  CHECK_THROWS_WITH(plan::plan_train(plan::named_model("tiny-mla"), s, {}), Contains("multi-head latent attention"));

  const plan::ModelShape m = plan::named_model("tiny-mla");
  plan::ServeWorkload w;
  w.input_len = 24, w.output_len = 8, w.batch = 4;
  const plan::Plan p = plan::plan_serve(m, s, w);
  const double B = 4, E = double(m.hidden), nm = double(m.moe_layers);
  const double one = plan::collective_s(s, {.tp = 1, .fsdp = 8, .dp = 1, .ep = 8}, 3, sim::CollectiveKind::all_to_all,
                                        uint64_t(2 * B * double(m.top_k) * E * 8));
  CHECK(p.decode_a2a_share == Approx(nm * 2 * one / p.tpot_s).epsilon(1e-9));
  const double routed = nm * double(m.experts) * m.expert_params();
  CHECK(p.hbm.weights == Approx(2 * (m.params() - routed + routed / 8)).epsilon(1e-12));
  CHECK(p.hbm.kv_cache == Approx(B * 32 * double(m.layers) * 2 * (16 + 8)).epsilon(1e-12));
  CHECK(p.step_s == Approx(B * p.ttft_s + 8 * p.tpot_s).epsilon(1e-12));
  CHECK(p.tokens_per_s_per_chip == Approx(B * 32 / p.step_s).epsilon(1e-12));
  CHECK(p.decode_hbm_use > 0);
  CHECK(p.decode_hbm_use < 1);
  // A decode step reads every weight on the chip (each local expert gets rows): at batch 1 it
  // takes at least the weights' bytes over the peak HBM bandwidth.
  w.batch = 1;
  const plan::Slice v7 = plan::make_slice("v7", false, "4x4x4", 0);
  const plan::Plan big = plan::plan_serve(d, v7, w);
  const double peak = v7.chip.memory.hbm_bandwidth_gbps * 1e9 * double(v7.chip.cores_per_chip);
  CHECK(big.tpot_s >= big.hbm.weights / peak);
  CHECK(big.tpot_s < 3 * big.hbm.weights / peak);
  w.ep = 3;
  CHECK_THROWS_WITH(plan::plan_serve(m, s, w), Contains("--ep 3 does not divide the slice's 8 chips"));
  w.ep = 0, w.tp = 2;
  CHECK_THROWS_WITH(plan::plan_serve(m, s, w), Contains("tensor parallelism is not modeled"));
}

TEST_CASE("chunked all-to-all: the experts' compute hides the exchange as a two-stage pipeline") {
  const plan::ModelShape m = plan::named_model("tiny-moe");
  const plan::Slice s = plan::make_slice("tiny", true, "2x2x2", 0);
  plan::TrainRecipe r;
  r.global_batch = 8;
  r.seq = 32;
  r.remat = plan::Remat::none;
  r.layout = {.tp = 1, .fsdp = 8, .dp = 1, .ep = 4};
  const plan::Plan one = plan::plan_train(m, s, r);
  for (int64_t C : {2, 4}) {
    r.a2a_chunks = C;
    const plan::StepParts p = plan::step_parts(m, s, r);
    const plan::Plan pc = plan::plan_train(m, s, r);
    // Closed form per MoE layer and pass: A = n exchanges of C pieces of V / C each; the
    // pipeline over C chunks takes max(x, A) + min(x, A) / C of the experts' x seconds, and the
    // layer's ICI (FSDP's collectives behind it plus A) bounds it from below.
    using K = sim::CollectiveKind;
    const double a = C * plan::collective_s(s, r.layout, 3, K::all_to_all, p.a2a_bytes / uint64_t(C));
    const double ag = plan::collective_s(s, r.layout, 1, K::all_gather, p.gather_bytes);
    const double rs = plan::collective_s(s, r.layout, 1, K::reduce_scatter, p.scatter_bytes);
    double want = 0;
    for (auto [c, ici, x, n] : {std::tuple{p.moe_fwd_s, ag, p.expert_fwd_s, p.a2a_per_layer_fwd},
                                std::tuple{p.moe_bwd_s, ag + rs, p.expert_bwd_s, p.a2a_per_layer_bwd}}) {
      const double A = n * a;
      const double exposed = std::max(x, A) + std::min(x, A) / double(C) - x;
      want += std::max(c + exposed, ici + A) - std::max(c, ici);
    }
    CHECK(p.expert_fwd_s > 0);
    CHECK(p.expert_bwd_s > p.expert_fwd_s);
    CHECK(pc.breakdown.all_to_all == Approx(2 * want).epsilon(1e-9));  // 2 MoE layers
    CHECK(pc.layout.find("a2a-chunks=" + std::to_string(C)) != std::string::npos);
  }
  // On a pod-sized model the experts' compute outweighs the exchange: chunks hide most of it.
  plan::TrainRecipe big;
  big.global_batch = 256;
  big.layout = {.tp = 1, .fsdp = 256, .dp = 1, .ep = 8};
  const plan::Slice v5p = plan::make_slice("v5p", false, "", 256);
  const plan::Plan b1 = plan::plan_train(plan::named_model("mixtral-8x7b"), v5p, big);
  big.a2a_chunks = 4;
  const plan::Plan b4 = plan::plan_train(plan::named_model("mixtral-8x7b"), v5p, big);
  CHECK(b4.breakdown.all_to_all < 0.5 * b1.breakdown.all_to_all);
  CHECK(b4.step_s < b1.step_s);
  r.a2a_chunks = 0;
  CHECK_THROWS_WITH(plan::plan_train(m, s, r), Contains("--a2a-chunks 0 must be a positive integer"));
  r.a2a_chunks = 1 << 20;
  CHECK_THROWS_WITH(plan::plan_train(m, s, r), Contains("more than the"));
}
