// The main example: a small language model generates text on the simulated TPU chip.
//
// The model is the Llama-style fortunes model (examples/fortunes_model.h; BPE tokens): trained on
// the cpu on the Debian `fortunes` corpus the first time (about three minutes) and saved as a
// Hugging Face checkpoint, then reused. It is loaded like any checkpoint onto `sim:0` in bf16
// and generates a fortune twice, eager (every op a chip kernel as it is called) and compiled
// (tpu::compile over the decode step: one compile, then every step reuses it), printing host
// tokens/s, chip cycles per token, MFU and HBM bandwidth use on the named chip and timing model.
// The compiled step is then run once more with emulate_precision_casts (tpucore/compile.h: the
// fused kernels round every bf16 intermediate where eager does and compute each op as eager
// does), and its tokens must equal the eager ones: the example fails if they do not. Last, the
// profiler's table of the compiled run and its Chrome/Perfetto trace.
//
//   main_example [--chip v5e] [--model DIR] [--tokens N] [--train-seconds S] [--trace FILE]
#include <chrono>
#include <string>
#include <vector>

#include "device/sim_driver.h"
#include "fortunes_model.h"
#include "tools/cli_args.h"
#include "tpucore/devices.h"
#include "tpucore/profiler.h"
#include "tpucore/streams.h"

namespace {

using namespace tpu;

struct RunFigures {
  std::vector<int64_t> tokens;
  double host_s = 0;
  SimStats chip;
};

RunFigures run(models::CausalLM& m, const std::vector<int64_t>& prompt, const models::GenerationConfig& g) {
  const Device dev = m.device();
  synchronize(dev);
  reset_sim_stats();
  RunFigures r;
  const auto t0 = std::chrono::steady_clock::now();
  r.tokens = models::generate(m, {prompt}, g)[0];
  synchronize(dev);
  r.host_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.chip = sim_stats();
  return r;
}

void report(const char* label, const RunFigures& r, const sim::ChipConfig& cfg, const Tokenizer& tok) {
  const double n = static_cast<double>(r.tokens.size());
  const double chip_s = r.chip.cycles / (cfg.clock_ghz * 1e9);
  const double mfu = chip_s > 0 ? r.chip.mxu_flops / chip_s / cfg.peak_flops() : 0;
  const double bw = chip_s > 0 ? static_cast<double>(r.chip.hbm_bytes) / chip_s / (cfg.memory.hbm_bandwidth_gbps * 1e9) : 0;
  std::vector<int64_t> ids;
  for (int64_t t : r.tokens)
    if (t != fortunes::kEot) ids.push_back(t);
  const std::string text = tok.decode(ids);
  fmt::print("\n== {}: {} tokens\n{}\n", label, r.tokens.size(), text);
  fmt::print("host: {:.2f} s, {:.1f} tokens/s (simulating the chip on the host)\n", r.host_s, n / r.host_s);
  // Eager decode runs "decode_attention"; compiled decode the live-length "kv_cache_attention".
  uint64_t decode_runs = 0;
  for (const char* k : {"decode_attention", "kv_cache_attention"})
    if (auto it = r.chip.runs_by_kernel.find(k); it != r.chip.runs_by_kernel.end()) decode_runs += it->second;
  fmt::print("chip: {:.0f} cycles/token ({:.1f} us/token, {:.0f} tokens/s of chip time), {} programs "
             "({} of the decode attention kernel), {} host fallbacks\n",
             r.chip.cycles / n, chip_s / n * 1e6, n / chip_s, r.chip.runs,
             decode_runs, r.chip.host_fallbacks);
  fmt::print("      MFU {:.2f}% of {:.1f} TFLOP/s, HBM bandwidth use {:.2f}% of {:.0f} GB/s "
             "({:.2f} MB moved per token)\n",
             100 * mfu, cfg.peak_flops() / 1e12, 100 * bw, cfg.memory.hbm_bandwidth_gbps,
             static_cast<double>(r.chip.hbm_bytes) / n / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  std::string chip = "v5e", dir = "fortunes_model", trace_path = "llm_trace.json";
  int64_t tokens = 64;
  double train_seconds = 170;
  cli::Parser args("main_example",
                   "A small language model (the fortunes model, trained on the cpu once and cached) generating\n"
                   "text on the simulated chip sim:0, eager and compiled: tokens/s, cycles/token, MFU, the\n"
                   "profiler table and a Chrome/Perfetto trace.");
  args.value("--chip", "NAME", "chip preset or config JSON for sim:0 (default v5e)", [&](const std::string& v) { chip = v; });
  args.value("--model", "DIR", "checkpoint folder, trained there when missing (default fortunes_model)",
             [&](const std::string& v) { dir = v; });
  args.value("--tokens", "N", "tokens to generate (default 64)", [&](const std::string& v) { tokens = args.to_int(v); });
  args.value("--train-seconds", "S", "training time when the checkpoint is missing (default 170)",
             [&](const std::string& v) { train_seconds = static_cast<double>(args.to_int(v)); });
  args.value("--trace", "FILE", "trace of the compiled run (default llm_trace.json)",
             [&](const std::string& v) { trace_path = v; });
  if (auto rc = args.parse(argc, argv)) return *rc;
  try {
    TPU_CHECK(tokens > 0, "--tokens must be positive, got {}", tokens);
    if (!fortunes::is_current(dir)) {
      fmt::print("no checkpoint of the current recipe in {}: training the fortunes model on the cpu for {:.0f} s (once)\n", dir,
                 train_seconds);
      fortunes::train(dir, train_seconds);
    } else {
      fmt::print("using the cached checkpoint in {}\n", dir);
    }
    set_sim_chip(chip, 0);
    const sim::ChipConfig& cfg = device::sim_device(0).config();
    fmt::print("chip: sim:0 = {} ({} timing model), {} MXU(s) of {}x{} at {:.0f} MHz, {:.1f} TFLOP/s bf16, "
               "{:.0f} GB/s HBM\n",
               cfg.name, cfg.timing.model, cfg.mxu.count, cfg.mxu.rows, cfg.mxu.cols, cfg.clock_ghz * 1e3,
               cfg.peak_flops() / 1e12, cfg.memory.hbm_bandwidth_gbps);

    auto model = models::load_causal_lm(dir, Device("sim:0"), DType::bf16);
    model->eval();
    const Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
    fmt::print("model: {} parameters in bf16 on sim:0 ({} layers, hidden {}, {}/{} heads)\n",
               model->num_parameters(), model->config.num_hidden_layers, model->config.hidden_size,
               model->config.num_attention_heads, model->config.num_key_value_heads);
    std::vector<int64_t> prompt{fortunes::kEot};
    for (int64_t t : tok.encode("The")) prompt.push_back(t);

    // Positions past the context the model was trained on (max_position_embeddings) were never
    // seen in training: generation stops there.
    const int64_t room = model->config.max_position_embeddings - static_cast<int64_t>(prompt.size());
    TPU_CHECK(room > 0, "the model's context ({} positions) has no room after the prompt",
              model->config.max_position_embeddings);
    if (tokens > room) {
      fmt::print("(--tokens {} capped at {}: the model was trained on {} positions)\n", tokens, room,
                 model->config.max_position_embeddings);
      tokens = room;
    }
    models::GenerationConfig g = fortunes::sampling();
    g.max_new_tokens = tokens;
    g.seed = 7;
    const RunFigures eager = run(*model, prompt, g);
    report("eager", eager, cfg, tok);

    g.compile = true;
    g.compile_name = "decode_step";
    const RunFigures first = run(*model, prompt, g);
    fmt::print("\n(compiled, first call: {:.2f} s of host time including the compile)\n", first.host_s);
    const RunFigures compiled = run(*model, prompt, g);
    report("compiled (tpu::compile of the decode step, reused)", compiled, cfg, tok);
    fmt::print("(these compiled tokens {} the eager ones: by default fused kernels keep bf16 intermediates in f32)\n",
               compiled.tokens == eager.tokens ? "equal" : "differ from");

    // Eager-equal numerics: the same compiled step under emulate_precision_casts (a recompile,
    // named in jit::stats(); the process default reaches the step generate() compiles).
    jit::set_emulate_precision_casts(true);
    const RunFigures emulated = run(*model, prompt, g);
    jit::set_emulate_precision_casts(false);
    if (emulated.tokens != eager.tokens) {
      size_t at = 0;
      while (at < emulated.tokens.size() && at < eager.tokens.size() && emulated.tokens[at] == eager.tokens[at]) ++at;
      fmt::print(stderr, "main_example: FAILED: compiled tokens with emulate_precision_casts differ from the eager ones "
                         "(first at token {} of {})\n", at, eager.tokens.size());
      return 1;
    }
    fmt::print("compiled tokens with emulate_precision_casts equal the eager ones ({} tokens, bit-equal numerics; "
               "{:.0f} chip cycles/token, {:.2f} s of host time)\n",
               eager.tokens.size(), emulated.chip.cycles / static_cast<double>(emulated.tokens.size()), emulated.host_s);

    {
      profiler::Profile prof;
      models::generate(*model, {prompt}, g);
      prof.stop();
      fmt::print("\n== profile of the compiled run\n{}", prof.table(14));
      prof.export_chrome_trace(trace_path);
      fmt::print("trace written to {} (open it in https://ui.perfetto.dev)\n", trace_path);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "main_example: {}\n", e.what());
    return 1;
  }
}
