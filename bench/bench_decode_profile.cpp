// Per-op host time of cpu decode steps of bench_llama_cpp's model (12 layers, hidden 768, MLP
// 2048, 12 / 4 heads, vocab 32000, untied head), from tpu::profiler: where a decode step goes
// outside the weight products.
//
//   bench_decode_profile [--precision f32|bf16|f16|int8|int4] [--rows N] [--steps N] [--threads N]
//                        [--repeat N] [--no-profile]
//
// Prints the rate (generated tokens/s over all rows) and the profiler's table of the decode
// steps (the prompt's prefill is not recorded). --repeat N decodes the prompts N times (a longer
// run of short-context steps, e.g. under perf): the rate covers every repeat, the table the last.
// --no-profile leaves the profiler off (its per-op cost out of the rate).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "../tools/cli_args.h"
#include "tpucore/core/parallel.h"
#include "tpucore/models.h"
#include "tpucore/profiler.h"
#include "tpucore/quantize.h"
#include "tpucore/tpucore.h"

using namespace tpu;

int main(int argc, char** argv) {
  std::string prec = "int4";
  int64_t rows = 1, steps = 32, repeat = 1;
  bool profile = true;
  int threads = 2;
  cli::Parser p("bench_decode_profile", "per-op host time of cpu decode steps of a Llama of ~125M parameters");
  p.value("--precision", "P", "f32, bf16, f16, int8 or int4 (default int4)", [&](const std::string& v) { prec = v; });
  p.value("--rows", "N", "sequences decoded together (default 1)", [&](const std::string& v) { rows = p.to_int(v); });
  p.value("--steps", "N", "decode steps recorded (default 32)", [&](const std::string& v) { steps = p.to_int(v); });
  p.value("--threads", "N", "threads (default 2)", [&](const std::string& v) { threads = static_cast<int>(p.to_int(v)); });
  p.value("--repeat", "N", "decode the prompts N times (default 1)", [&](const std::string& v) { repeat = p.to_int(v); });
  p.flag("--no-profile", "no profiler (rate only)", [&] { profile = false; });
  if (auto rc = p.parse(argc, argv)) return *rc;
  try {
    TPU_CHECK(rows >= 1 && steps >= 1 && threads >= 1 && repeat >= 1,
              "bench_decode_profile: --rows, --steps, --threads and --repeat must be >= 1");
    set_num_threads(threads);
    models::ModelConfig cfg;
    cfg.vocab_size = 32000, cfg.hidden_size = 768, cfg.intermediate_size = 2048;
    cfg.num_hidden_layers = 12, cfg.num_attention_heads = 12, cfg.num_key_value_heads = 4;
    cfg.tie_word_embeddings = false, cfg.max_position_embeddings = 2048;
    Generator gen(1);
    models::CausalLM m(cfg, &gen);
    m.eval();
    if (prec == "bf16") m.to(DType::bf16);
    else if (prec == "f16") m.to(DType::f16);
    else if (prec == "int8") models::quantize_causal_lm(m, nn::WeightQuant::int8, 32, true);
    else if (prec == "int4") models::quantize_causal_lm(m, nn::WeightQuant::int4, 32, true);
    else TPU_CHECK(prec == "f32", "bench_decode_profile: unknown precision '{}' (f32, bf16, f16, int8, int4)", prec);
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int64_t> q;
      for (int64_t i = 0; i < 8; ++i) q.push_back((r * 7919 + i * 104729 + 13) % cfg.vocab_size);
      prompts.push_back(q);
    }
    models::GenerationConfig g;
    g.max_new_tokens = steps + 1;
    std::unique_ptr<profiler::Profile> prof;
    using clock = std::chrono::steady_clock;
    double secs = 0;
    for (int64_t rep = 0; rep < repeat; ++rep) {
      size_t done = 0;
      clock::time_point t0;
      models::generate(m, prompts, g, [&](size_t, int64_t) {
        if (++done == prompts.size()) {  // the first token: prefill over, record the decode steps
          if (profile && rep + 1 == repeat) {
            profiler::ProfileOptions o;
            o.chip_timeline = false;
            o.record_shapes = false;
            prof = std::make_unique<profiler::Profile>(o);
          }
          t0 = clock::now();
        }
        return true;
      });
      secs += std::chrono::duration<double>(clock::now() - t0).count();
    }
    if (prof) prof->stop();
    const double n = static_cast<double>(steps * repeat);
    std::printf("%s, %lld rows, %lld steps x %lld, %d threads: %.1f tokens/s (%.3f ms per step%s)\n", prec.c_str(),
                static_cast<long long>(rows), static_cast<long long>(steps), static_cast<long long>(repeat), threads,
                static_cast<double>(rows) * n / secs, secs * 1e3 / n, prof ? ", the last repeat profiled" : "");
    if (prof) std::printf("%s\n", prof->table(30).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode_profile: %s\n", e.what());
    return 1;
  }
  return 0;
}
