// tpu-plan: what a model costs on a slice of simulated TPUs, training or serving (timing only).
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "tools/cli_args.h"
#include "tools/tpu-plan/plan.h"

namespace {

const char* kEpilog =
    "MODEL is a named shape (qwen3-8b, llama3.1-8b, llama3-70b, mixtral-8x7b, qwen3-30b-a3b, tiny, tiny-moe)\n"
    "or a path to a Hub config.json of a dense decoder (model_type llama, qwen2, qwen3 or mistral) or of a\n"
    "mixture of experts (mixtral, qwen3_moe). One chip of the symmetric layout is priced kernel by kernel\n"
    "with the chip preset's timing model and every collective with the ICI cost model.\n"
    "Training: tp x fsdp x dp must equal the chip count (default: fsdp = every chip); TP takes the\n"
    "fastest (last) torus axes, then FSDP, then DP. A mixture of experts takes --ep N: its experts are\n"
    "sharded over the first N chips of the FSDP axes (N divides fsdp and the expert count), each MoE\n"
    "layer dispatches and combines tokens by all-to-all over them; MFU counts the active parameters.\n"
    "Exit status: 0 done; 1 bad input (unknown model or architecture, a layout that does not divide the\n"
    "mesh, a plan that does not fit in HBM, no layout found); 2 a malformed command line.\n"
    "Examples:\n"
    "  tpu-plan --model qwen3-8b --chip v5p --chips 256 --global-batch 256 --seq 4096\n"
    "  tpu-plan --model config.json --chip v6e --chips 8 --serve --input-len 1800 --output-len 128 --batch 64\n"
    "  tpu-plan --model llama3-70b --chip v7 --chips 8192 --global-batch 8192 --search --json\n"
    "  tpu-plan --model mixtral-8x7b --chip v5p --chips 256 --global-batch 256 --ep 8 --ideal";

int64_t positive(const std::string& v, const char* what) {
  const int64_t x = tpu::cli::Parser::to_int(v);
  if (x < 1) throw std::invalid_argument(fmt::format("{} must be a positive integer", what));
  return x;
}

// The same layout kind (FSDP over what TP and DP leave) and sequences per chip on power-of-two
// slices up to the plan's chip count.
void write_plot(const std::string& path, const tpu::plan::ModelShape& m, const std::string& chip, bool calibrated,
                const tpu::plan::TrainRecipe& r, const tpu::plan::Plan& last) {
  const int64_t per_rank = r.global_batch / (r.layout.fsdp * r.layout.dp);
  std::vector<tpu::plan::Plan> plans;
  for (int64_t n = r.layout.tp * r.layout.dp; n < last.chips; n *= 2) {
    try {
      tpu::plan::TrainRecipe q = r;
      q.layout.fsdp = n / (r.layout.tp * r.layout.dp);
      q.global_batch = per_rank * q.layout.fsdp * q.layout.dp;
      plans.push_back(tpu::plan::plan_train(m, tpu::plan::make_slice(chip, calibrated, "", n), q));
    } catch (const tpu::plan::PlanError&) {
      // A slice size the preset's torus cannot form is left out of the curve.
    }
  }
  plans.push_back(last);
  tpu::plan::write_scaling_svg(path, fmt::format("{} on {} ({}): weak scaling", m.name, last.chip, last.layout), plans);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "qwen3-8b", chip = "v5p", topology, precision = "bf16", plot;
  int64_t chips = 0;
  bool calibrated = true, serve = false, json = false, search = false;
  double price = 0;
  tpu::plan::TrainRecipe r;
  r.global_batch = 0;
  int64_t tp = 0, fsdp = 0, dp = 0, ep = 0, slices = 1;
  tpu::plan::ServeWorkload w;
  tpu::cli::Parser p("tpu-plan", "Predict step time, MFU, tokens/s, HBM and cost of a model on a simulated TPU slice.");
  p.value("--model", "NAME|config.json", "a named shape or a Hub config.json (default qwen3-8b)", [&](const std::string& v) { model = v; })
      .value("--chip", "v4|v5e|v5p|v6e|v7", "chip preset (default v5p); also tiny, for tests", [&](const std::string& v) { chip = v; })
      .flag("--calibrated", "the calibrated timing model (default)", [&] { calibrated = true; })
      .flag("--ideal", "the ideal timing model (the units' peaks, full overlap)", [&] { calibrated = false; })
      .value("--chips", "N", "chips in the slice (the most cubic torus shape of N)", [&](const std::string& v) { chips = positive(v, "--chips"); })
      .value("--topology", "AxBxC", "the slice's torus shape (instead of or agreeing with --chips)", [&](const std::string& v) { topology = v; })
      .value("--slices", "N", "training: N such slices joined over the data-center network (DCN), data parallel across "
             "slices (default 1); --chips and --topology give one slice", [&](const std::string& v) { slices = positive(v, "--slices"); })
      .value("--global-batch", "B", "training: sequences per step (default: one per data-parallel rank)", [&](const std::string& v) { r.global_batch = positive(v, "--global-batch"); })
      .value("--seq", "S", "training: sequence length (default 4096)", [&](const std::string& v) { r.seq = positive(v, "--seq"); })
      .value("--tp", "N", "tensor-parallel degree (training default 1; serving default: every chip)", [&](const std::string& v) { tp = positive(v, "--tp"); })
      .value("--fsdp", "N", "training: FSDP degree (default: the chips left after --tp and --dp)", [&](const std::string& v) { fsdp = positive(v, "--fsdp"); })
      .value("--dp", "N", "training: data-parallel (replicated) degree (default 1)", [&](const std::string& v) { dp = positive(v, "--dp"); })
      .value("--ep", "N", "mixture of experts: expert-parallel degree (training: within FSDP, default 1; serving: the "
             "chips the routed experts are sharded over, default every chip of the slice)", [&](const std::string& v) { ep = positive(v, "--ep"); })
      .value("--a2a-chunks", "N", "training, mixture of experts with --ep: run each MoE layer's dispatch, experts and combine in N "
             "token chunks, one chunk's all-to-alls overlapping another's experts (default 1: not overlapped)",
             [&](const std::string& v) { r.a2a_chunks = positive(v, "--a2a-chunks"); })
      .value("--remat", "none|full|selective", "training: rematerialization (default full; selective recomputes the pointwise kernels)",
             [&](const std::string& v) {
               if (v == "none") r.remat = tpu::plan::Remat::none;
               else if (v == "full") r.remat = tpu::plan::Remat::full;
               else if (v == "selective") r.remat = tpu::plan::Remat::selective;
               else throw std::invalid_argument("expected none, full or selective");
             })
      .value("--precision", "bf16", "compute precision (bf16 only: f32 master weights and optimizer state)", [&](const std::string& v) { precision = v; })
      .flag("--serve", "a serving workload instead of training", [&] { serve = true; })
      .value("--input-len", "N", "serving: prompt tokens per request (default 1024)", [&](const std::string& v) { w.input_len = positive(v, "--input-len"); })
      .value("--output-len", "N", "serving: generated tokens per request (default 128)", [&](const std::string& v) { w.output_len = positive(v, "--output-len"); })
      .value("--batch", "N", "serving: requests decoded together per replica (default 8); with --max-batched-tokens the most the KV cache holds", [&](const std::string& v) { w.batch = positive(v, "--batch"); })
      .value("--max-batched-tokens", "T", "serving a dense model: continuous batching with chunked prefill as vLLM's V1 engine runs it (its --max-num-batched-tokens): every step decodes the running requests and fills the rest of T tokens with prompt chunks; TPOT is that step (default: static batches)", [&](const std::string& v) { w.max_batched_tokens = positive(v, "--max-batched-tokens"); })
      .value("--price-per-chip-hour", "USD", "price of one chip-hour: adds the cost per million tokens", [&](const std::string& v) {
        price = tpu::cli::Parser::to_double(v);
        if (!(price >= 0)) throw std::invalid_argument("must be a non-negative number");
      })
      .flag("--search", "training: try every tp x fsdp x dp layout that fits, fastest per chip first", [&] { search = true; })
      .flag("--json", "print JSON instead of text", [&] { json = true; })
      .value("--plot", "FILE.svg", "training: weak-scaling curve (MFU, tokens/s per chip) from the smallest power-of-two "
             "slice the layout takes up to --chips, the same sequences per chip", [&](const std::string& v) { plot = v; })
      .epilog(kEpilog);
  if (auto rc = p.parse(argc, argv)) return *rc;
  try {
    if (precision != "bf16")
      throw tpu::plan::PlanError(fmt::format("--precision {} is not modeled: tpu-plan prices bf16 compute only", precision));
    if (!plot.empty() && (serve || search)) throw tpu::plan::PlanError("--plot draws a training layout's scaling; not with --serve or --search");
    if (serve && search) throw tpu::plan::PlanError("--search ranks training layouts; it does not apply to --serve");
    if (!plot.empty() && slices > 1) throw tpu::plan::PlanError("--plot draws one slice's scaling; not with --slices");
    if (serve && slices > 1) throw tpu::plan::PlanError("--slices is a training layout; --serve plans one slice");
    if (r.a2a_chunks > 1 && ep <= 1 && !search)
      throw tpu::plan::PlanError("--a2a-chunks overlaps the expert-parallel all-to-alls: it needs --ep N (N > 1)");
    if (search && ep > 1) throw tpu::plan::PlanError("--search tries every --ep itself; do not give one");
    if (serve && (fsdp || dp)) throw tpu::plan::PlanError("--fsdp and --dp are training degrees; serving takes --tp (replicas fill the rest)");
    const tpu::plan::ModelShape m = tpu::plan::load_model(model);
    const tpu::plan::Slice s = tpu::plan::make_slice(chip, calibrated, topology, chips);
    const int64_t n = s.topo.chips();
    nlohmann::json out;
    std::string text;
    int rc = 0;
    if (serve) {
      w.tp = tp;
      w.ep = ep;
      const tpu::plan::Plan plan = tpu::plan::plan_serve(m, s, w, price);
      out = plan.to_json();
      text = plan.text();
      if (!plan.fits) rc = 1;
    } else {
      r.layout.tp = tp ? tp : 1;
      r.layout.dp = dp ? dp : 1;
      r.layout.ep = ep ? ep : 1;
      r.layout.slices = slices;
      r.layout.fsdp = fsdp ? fsdp : n / (r.layout.tp * r.layout.dp);
      if (r.global_batch == 0) r.global_batch = std::max<int64_t>(1, r.layout.fsdp * r.layout.dp * slices);
      if (search) {
        const auto plans = tpu::plan::search_train(m, s, r, price);
        if (plans.empty())
          throw tpu::plan::PlanError(fmt::format("no tp x fsdp x dp layout of {} chips fits {} with --global-batch {} --seq {}",
                                                 n, m.name, r.global_batch, r.seq));
        out = nlohmann::json::array();
        for (const auto& pl : plans) {
          out.push_back(pl.to_json());
          text += pl.text();
        }
      } else {
        if (!fsdp && n % (r.layout.tp * r.layout.dp) != 0)
          throw tpu::plan::PlanError(fmt::format("layout tp={} dp={} does not divide the mesh of {} chips", r.layout.tp, r.layout.dp, n));
        const tpu::plan::Plan plan = tpu::plan::plan_train(m, s, r, price);
        if (!plot.empty()) write_plot(plot, m, chip, calibrated, r, plan);
        out = plan.to_json();
        text = plan.text();
        if (!plan.fits) rc = 1;
      }
    }
    std::fputs(json ? (out.dump(2) + "\n").c_str() : text.c_str(), stdout);
    if (rc) std::fprintf(stderr, "tpu-plan: does not fit: %s\n", out["advice"].get<std::string>().c_str());
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpu-plan: %s\n", e.what());
    return 1;
  }
}
