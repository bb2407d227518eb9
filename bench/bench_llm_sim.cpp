// A Llama-3.1-8B-shaped model on the simulated chip (sim:0, the v5e preset on its default
// calibrated timing model unless TPU_SIM_CHIP says otherwise), timing-only: the programs'
// arithmetic is skipped, the cycle counts are those of functional runs. bf16 weights, eager (the
// library's own DecoderLayer, KVCache, rotary tables and attention kernels, as generate() runs
// them). All 32 layers are alike, so one layer is costed and counted 32 times; the final RMSNorm
// and the lm_head (128256 x 4096) are costed once; the embedding lookup is left out.
//  - BM_Llama8B_Prefill/B/T: a prefill of B sequences of T tokens (causal attention, logits of
//    every position). Counter MFU_pct: model FLOPs (2 x parameters x tokens plus attention,
//    causal counted as half) over chip time x the chip's bf16 peak.
//  - BM_Llama8B_Decode/B/S: one decode step of B sequences after S cached positions (the decode
//    attention kernel reads the cache from HBM). Counter HBM_BW_pct: HBM bytes moved over chip
//    time x the chip's HBM bandwidth; HBM_vs_min: bytes moved over the weights plus the cache
//    read once; tokens_per_s_chip: B over the chip time of the step.
//  - BM_SmallLlama_Generate/0|1: the fortunes model's shape generating text, eager or compiled
//    (chip cycles per token; see below).
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>

#include "device/sim_driver.h"
#include "tpucore/autograd.h"
#include "tpucore/devices.h"
#include "tpucore/models.h"
#include "tpucore/streams.h"

namespace {

using namespace tpu;

const Device kDev("sim:0");
constexpr int64_t kLayers = 32, kHidden = 4096, kInter = 14336, kHeads = 32, kKvHeads = 8, kHeadDim = 128,
                  kVocab = 128256;

models::ModelConfig llama8b() {
  models::ModelConfig c;
  c.vocab_size = kVocab, c.hidden_size = kHidden, c.intermediate_size = kInter, c.num_hidden_layers = 1;
  c.num_attention_heads = kHeads, c.num_key_value_heads = kKvHeads, c.head_dim = kHeadDim;
  c.rope_theta = 500000.0, c.rms_norm_eps = 1e-5;
  return c;
}

struct Parts {
  std::shared_ptr<models::DecoderLayer> layer;
  std::shared_ptr<nn::RMSNorm> norm;
  Tensor head;  // [vocab, hidden], never written (timing-only)
  std::vector<double> inv_freq;
  int64_t layer_params = 0;
};

Parts& parts() {
  static Parts p = [] {
    Parts q;
    const models::ModelConfig c = llama8b();
    NoGradGuard ng;
    q.layer = std::make_shared<models::DecoderLayer>(c, nullptr);
    q.layer->to(DType::bf16);
    q.layer->to(kDev);
    q.layer->eval();
    q.layer_params = q.layer->num_parameters();
    q.norm = std::make_shared<nn::RMSNorm>(Shape{kHidden}, c.rms_norm_eps);
    q.norm->to(DType::bf16);
    q.norm->to(kDev);
    q.head = empty({kVocab, kHidden}, {DType::bf16, kDev});
    q.inv_freq = nn::rope_inv_freq(kHeadDim, c.rope_theta);
    return q;
  }();
  return p;
}

// Chip counters of one call of fn.
struct Cost {
  double cycles = 0, flops = 0, bytes = 0;
};
template <class F>
Cost measure(F&& fn) {
  synchronize(kDev);
  reset_sim_stats();
  fn();
  synchronize(kDev);
  const SimStats s = sim_stats();
  return {s.cycles, s.mxu_flops, double(s.hbm_bytes)};
}

double clock_hz() { return device_properties(kDev).clock_ghz * 1e9; }

// One layer, then the final norm and the head, over x [B, T, hidden] after `past` cached positions.
std::pair<Cost, Cost> step_cost(int64_t b, int64_t t, int64_t past) {
  Parts& p = parts();
  SimTimingOnly timing;
  NoGradGuard ng;
  nn::KVCache cache(1, b, kKvHeads, past + t, kHeadDim, DType::bf16, kDev);
  cache.advance(past);
  std::vector<int64_t> pos;
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < t; ++i) pos.push_back(past + i);
  auto [cos, sin] = nn::rope_tables(pos, b, p.inv_freq, DType::bf16, kDev);
  const Tensor x = empty({b, t, kHidden}, {DType::bf16, kDev});
  Tensor h;
  const Cost layer = measure([&] { h = p.layer->forward(x, cos, sin, {}, &cache, 0); });
  const Cost rest = measure([&] { (void)linear(p.norm->forward(h), p.head); });
  return {layer, rest};
}

void report(benchmark::State& st, const Cost& layer, const Cost& rest, double model_flops, double min_bytes,
            int64_t tokens) {
  const DeviceProperties d = device_properties(kDev);
  const double cycles = kLayers * layer.cycles + rest.cycles, seconds = cycles / clock_hz();
  const double bytes = kLayers * layer.bytes + rest.bytes;
  st.counters["chip_ms"] = seconds * 1e3;
  st.counters["MFU_pct"] = 100.0 * model_flops / seconds / d.peak_flops;
  st.counters["MXU_util_pct"] = 100.0 * (kLayers * layer.flops + rest.flops) / seconds / d.peak_flops;
  st.counters["HBM_GB"] = bytes / 1e9;
  st.counters["HBM_vs_min"] = bytes / min_bytes;
  st.counters["tokens_per_s_chip"] = double(tokens) / seconds;
  st.counters["HBM_BW_pct"] = 100.0 * bytes / seconds / (device::sim_device(0).config().memory.hbm_bandwidth_gbps * 1e9);
  st.SetLabel(d.name + ", " + device::sim_device(0).config().timing.model + " timing model");
}

void BM_Llama8B_Prefill(benchmark::State& st) {
  const int64_t b = st.range(0), t = st.range(1);
  Cost layer, rest;
  for (auto _ : st) std::tie(layer, rest) = step_cost(b, t, 0);
  const double tokens = double(b * t);
  const double params = double(kLayers * parts().layer_params) + double(kVocab * kHidden);
  const double attn = kLayers * 2.0 * 2.0 * kHeads * kHeadDim * double(b) * double(t) * double(t + 1) / 2.0;
  const double weights = 2.0 * params;
  report(st, layer, rest, 2.0 * params * tokens + attn, weights + tokens * kHidden * 2.0 * 2, b * t);
}

void BM_Llama8B_Decode(benchmark::State& st) {
  const int64_t b = st.range(0), past = st.range(1);
  Cost layer, rest;
  for (auto _ : st) std::tie(layer, rest) = step_cost(b, 1, past);
  const double params = double(kLayers * parts().layer_params) + double(kVocab * kHidden);
  const double attn = kLayers * 2.0 * 2.0 * kHeads * kHeadDim * double(b) * double(past + 1);
  const double cache_bytes = kLayers * 2.0 * double(b) * kKvHeads * double(past + 1) * kHeadDim * 2.0;
  report(st, layer, rest, 2.0 * params * double(b) + attn, 2.0 * params + cache_bytes, b);
}

// The fortunes model's shape (examples/fortunes_model.h: 3 layers, hidden 128, 4/2 heads of dim
// 32, SwiGLU 384, byte vocabulary 257, tied embeddings; random weights, bf16) generating 64
// greedy tokens after a 2-token prompt with generate(), eager (arg 0) or compiled (arg 1, the
// step compiled by a first call, then measured). Counter cycles_per_token: the chip's cycles of
// the whole call (prefill included) over the tokens.
void BM_SmallLlama_Generate(benchmark::State& st) {
  const bool compiled = st.range(0) != 0;
  models::ModelConfig c;
  c.vocab_size = 257, c.hidden_size = 128, c.intermediate_size = 384, c.num_hidden_layers = 3;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.rms_norm_eps = 1e-5, c.tie_word_embeddings = true;
  Generator gen(5);
  models::CausalLM m(c, &gen);
  m.to(DType::bf16);
  m.to(kDev);
  m.eval();
  models::GenerationConfig g;
  g.max_new_tokens = 64;
  g.compile = compiled;
  g.compile_name = "bench_small_llama_step";
  const std::vector<std::vector<int64_t>> prompt{{256, 84}};
  if (compiled) models::generate(m, prompt, g);  // compiles
  Cost cost;
  size_t n = 0;
  for (auto _ : st) cost = measure([&] { n = models::generate(m, prompt, g)[0].size(); });
  st.counters["cycles_per_token"] = cost.cycles / double(n);
  st.counters["tokens"] = double(n);
  st.SetLabel(device_properties(kDev).name + ", " + device::sim_device(0).config().timing.model + " timing model");
}

}  // namespace

BENCHMARK(BM_SmallLlama_Generate)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_Llama8B_Prefill)->Args({1, 512})->Args({32, 512})->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK(BM_Llama8B_Decode)->Args({1, 1024})->Args({32, 1024})->Unit(benchmark::kSecond)->Iterations(1);

BENCHMARK_MAIN();
