// tpu-plan's cost model: one chip of a symmetric layout priced with the simulator's timing model
// (sim/timing_model.h, kernel by kernel) and its collectives with the ICI cost model (sim/ici.h,
// one group stands for all: the groups of a degree run the same schedule on disjoint links).
// docs/simulator.md, "tpu-plan", states what is modeled and what is not.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/config.h"
#include "sim/ici.h"
#include "tools/tpu-plan/model.h"

namespace tpu::plan {

// A slice of `chip` (a preset; "-ideal" for the ideal model): a topology "AxBxC" or a chip count
// (the most cubic shape within the ICI's largest slice).
struct Slice {
  sim::ChipConfig chip;
  sim::Topology topo;
  bool ideal = false;
};
Slice make_slice(const std::string& chip, bool calibrated, const std::string& topology, int64_t chips);

// Parallel degrees: tp x fsdp x dp = chips. Axes go to TP first (the last, fastest axes), then
// FSDP, then DP; an axis may be split between two degrees when one divides it. Expert
// parallelism (a mixture of experts): the experts are sharded over `ep` chips, the first
// (fastest) ep chips of the FSDP axes; ep divides fsdp and the expert count. Tokens stay data
// parallel over the FSDP group; each MoE layer dispatches them to their experts and combines
// the results with an all-to-all over the EP group.
// Multi-slice: `slices` copies of the slice, joined over the data-center network (DCN), are
// data parallel across slices; the layout above is each slice's. Gradients are reduced over DCN
// per layer in the backward (hierarchically: each chip exchanges the 1/dp of its gradient shard
// its DP group leaves to it), beside the ICI collectives.
struct Layout {
  int64_t tp = 1, fsdp = 1, dp = 1, ep = 1, slices = 1;
  std::string str() const;
};
// The sub-axis lengths each degree spans (tp, fsdp, dp), and whether each part is a whole axis.
struct AxisPart {
  int axis = 0;
  int length = 1;
  bool whole = true;
};
std::vector<std::vector<AxisPart>> assign_axes(const sim::Topology& t, const Layout& l);

enum class Remat { none, full, selective };
struct TrainRecipe {
  int64_t global_batch = 0;   // sequences per step
  int64_t seq = 4096;
  Layout layout;
  Remat remat = Remat::full;
  // MoE with ep > 1: each MoE layer's tokens go through dispatch, experts and combine in this
  // many chunks, so one chunk's all-to-alls run while another chunk's experts compute (1: one
  // exchange per direction, nothing overlaps it).
  int64_t a2a_chunks = 1;
};

struct ServeWorkload {
  int64_t input_len = 1024, output_len = 128, batch = 8;
  int64_t tp = 0;             // 0: every chip of the slice
  // A mixture of experts: experts sharded over `ep` chips (0: every chip of the slice), attention
  // data parallel (each chip decodes its own `batch` requests), tokens dispatched to their
  // experts and combined by all-to-alls over the EP group.
  int64_t ep = 0;
  // Continuous batching with chunked prefill, as vLLM's V1 engine serves (its
  // --max-num-batched-tokens): every step runs the decoding requests (one token each) and fills
  // the rest of this token budget with prompt chunks; `batch` is then the most requests the KV
  // cache holds. 0: static batches (each request's prefill, then the batch's decode steps).
  int64_t max_batched_tokens = 0;
};

// Seconds per step, per chip, by part; `exposed_ici` is what compute does not hide.
// `all_to_all`: what the MoE dispatch / combine all-to-alls add to the step (all of their time
// with one chunk; with chunks, what the experts' compute does not hide); part of exposed_ici.
struct Breakdown {
  double mxu = 0, other_compute = 0, hbm = 0, exposed_ici = 0, host = 0, ici_total = 0, all_to_all = 0;
  double dcn_total = 0, exposed_dcn = 0;  // multi-slice: the DCN all-reduces, and what compute does not hide
};

struct HbmUse {
  double weights = 0, optimizer = 0, gradients = 0, activations = 0, gathered = 0, kv_cache = 0;
  double total() const { return weights + optimizer + gradients + activations + gathered + kv_cache; }
};

struct Plan {
  std::string model, chip, topology, layout;
  int64_t chips = 0;
  bool serve = false;
  double step_s = 0;                 // training step, a serving batch's whole run, or (max_batched_tokens) one mixed step
  Breakdown breakdown;
  double mfu = 0, tokens_per_s_per_chip = 0;   // MFU counts the parameters a token uses (MoE: active)
  double params = 0, active_params = 0;
  double hbm_capacity = 0;
  HbmUse hbm;
  bool fits = true;
  std::string advice;                // when it does not fit: what to change
  double usd_per_mtok = 0;           // at the price per chip-hour (0: none given)
  double ttft_s = 0, tpot_s = 0, requests_per_s = 0;   // serving
  double decode_hbm_use = 0;         // serving a MoE: HBM bytes of a decode step / its time / peak bandwidth
  double decode_a2a_share = 0;       // serving a MoE: the all-to-alls' part of a decode step
  double decode_batch = 0;           // serving a MoE: tokens per chip per decode step; chunked prefill: decodes per step
  double step_tokens = 0;            // serving with chunked prefill (max_batched_tokens): tokens per step, decodes and prompt
  nlohmann::json to_json() const;
  std::string text() const;
};

Plan plan_train(const ModelShape& m, const Slice& s, const TrainRecipe& r, double price_per_chip_hour = 0);
Plan plan_serve(const ModelShape& m, const Slice& s, const ServeWorkload& w, double price_per_chip_hour = 0);
// The mixture-of-experts serving model behind plan_serve (serve_moe.cpp).
Plan plan_serve_moe(const ModelShape& m, const Slice& s, const ServeWorkload& w, double price_per_chip_hour = 0);
// Every tp x fsdp x dp layout of the slice's chips that maps to its axes and fits, fastest per chip first.
std::vector<Plan> search_train(const ModelShape& m, const Slice& s, TrainRecipe r, double price_per_chip_hour = 0);

// One [m, k] x [k, n] matmul kernel (bf16 inputs, `out_bytes` per result) on one chip of the
// slice, as the planner prices it.
double matmul_seconds(const Slice& s, double m, double k, double n, double out_bytes = 2);

// --plot: MFU and tokens/s per chip of `plans` (ascending chip counts) as an SVG line chart.
void write_scaling_svg(const std::string& path, const std::string& title, const std::vector<Plan>& plans);

// The per-layer schedule the pod check replays: compute per layer (seconds, forward and
// backward), the FSDP collectives (bytes), TP all-reduces per layer, the DP all-reduce.
struct StepParts {
  double layer_fwd_s = 0, layer_bwd_s = 0, head_s = 0, optimizer_s = 0;
  uint64_t gather_bytes = 0, scatter_bytes = 0, tp_bytes = 0, dp_bytes = 0;  // the book's V per collective
  uint64_t dcn_bytes = 0;   // multi-slice: one layer's gradient bytes each chip all-reduces over DCN
  int tp_per_layer_fwd = 2, tp_per_layer_bwd = 2;
  // MoE: the book's V of one dispatch (or combine) all-to-all over the EP group, and how many
  // run per MoE layer (forward: dispatch + combine; backward: their transposes, plus the
  // forward's again under full rematerialization).
  uint64_t a2a_bytes = 0;
  int a2a_per_layer_fwd = 0, a2a_per_layer_bwd = 0;
  // Per layer of each kind (dense, MoE): compute seconds forward / backward (with recomputation);
  // of a MoE layer's, the experts' kernels, the part a chunked all-to-all can overlap.
  double dense_fwd_s = 0, dense_bwd_s = 0, moe_fwd_s = 0, moe_bwd_s = 0, expert_fwd_s = 0, expert_bwd_s = 0;
  double mxu = 0, other = 0, hbm = 0, host = 0;   // the step's compute by bound (seconds)
};
StepParts step_parts(const ModelShape& m, const Slice& s, const TrainRecipe& r);
// The ICI seconds of one collective of `kind` over degree `which` (0 tp, 1 fsdp, 2 dp, 3 ep).
double collective_s(const Slice& s, const Layout& l, int which, sim::CollectiveKind kind, uint64_t bytes);
// The DCN seconds of a ring all-reduce of `bytes` per chip across `slices` slices: each chip
// sends and receives 2 (slices - 1) / slices of them at its DCN share, in 2 (slices - 1) steps
// of one host-to-host message latency each.
double dcn_all_reduce_s(const Slice& s, int64_t slices, uint64_t bytes);

}  // namespace tpu::plan
