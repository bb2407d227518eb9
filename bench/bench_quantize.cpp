// Weight precision on the decode path. BM_gemv_weights: the one-row (four- and 16-row) product
// against a weight of out x in (default 4096 x 4096) at each precision: f32, bf16 and f16 through
// linear(), int8 through linear_int8(), int4 (groups of 32, f32 or f16 scales) through linear_int4() and fp8 e4m3
// (per-row scales, or 128 x 128 block scales) through linear_fp8() (weights
// read in place, widened in registers, or on AVX-512 VNNI multiplied as bytes by the rows of x
// quantized in blocks of 32; TPU_CPU_FEATURES=avx2 measures the float-activation path). GB/s counts the bytes of weight (and scales) read per
// call, the quantity a decode step is bound by. BM_decode_quantized: greedy decode tokens/s of a
// small random Llama (hidden 1024, 4 layers, intermediate 2816, vocab 8192) in f32, with its
// decoder Linears quantized to int8 or int4 (models::quantize_causal_lm). The thread count is
// the pool's (TPU_NUM_THREADS).
// BM_kv_cache_attend: one layer's decode attention over an f32, bf16, int8 or e4m3 KV cache.
// BM_sim_quantized_step: the seven projections of one Llama-3-8B-shaped decoder layer (hidden
// 4096, q 4096, k/v 1024, o 4096, gate/up 14336, down 4096) on a simulated chip (sim:1, v6e or v7
// with their calibrated timing, or TPU_BENCH_SIM_IDEAL=1 for the ideal event timeline), timing-only,
// for a decode step (8 tokens) and a prefill step (1024 tokens) at bf16 (linear), int8
// (linear_int8), fp8 (linear_fp8) and int4 (linear_int4, groups of 32) weights; counters: simulated microseconds per layer, HBM
// bytes and the share of the chip's HBM bandwidth they take over the step, the MXU FLOP rate of
// the projections' matmul kernels alone (TFLOP/s), and tokens/s of a 32-layer model's
// projections (attention and the rest of the layer not counted).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "codegen/launch.h"
#include "device/sim_driver.h"
#include "ops/cpu/kernels/gemv_int4.h"
#include "ops/int4_repack.h"
#include "sim/presets.h"
#include "tpucore/models/generate.h"
#include "tpucore/tpucore.h"

using namespace tpu;

namespace {

enum Precision { kF32 = 0, kBf16 = 1, kInt8 = 2, kInt4 = 3, kF16 = 4, kFp8 = 5, kFp8Block = 6, kInt4F16 = 7 };

const char* precision_name(Precision p) {
  switch (p) {
    case kInt4: return "int4";
    case kInt4F16: return "int4-f16";
    case kInt8: return "int8";
    case kBf16: return "bf16";
    case kF16: return "f16";
    case kFp8: return "fp8";
    case kFp8Block: return "fp8-block128";
    default: return "f32";
  }
}

void BM_gemv_weights(benchmark::State& st) {
  const auto prec = static_cast<Precision>(st.range(0));
  const int64_t rows = st.range(1), n = st.range(2), k = st.range(3);
  NoGradGuard ng;
  const Tensor w = randn({n, k});
  const Tensor x = randn({rows, k});
  Tensor y;
  double bytes_per_weight = 4;
  if (prec == kInt8) {
    const Int8Weight q = quantize_int8(w);
    bytes_per_weight = 1;
    for (auto _ : st) {
      y = linear_int8(x, q);
      benchmark::DoNotOptimize(y.raw_data());
    }
  } else if (prec == kInt4 || prec == kInt4F16) {
    const Int4Weight q = quantize_int4(w, 32, prec == kInt4F16 ? DType::f16 : DType::f32);
    bytes_per_weight = 0.5 + (prec == kInt4F16 ? 2.0 : 4.0) / 32;
    for (auto _ : st) {
      y = linear_int4(x, q);
      benchmark::DoNotOptimize(y.raw_data());
    }
  } else if (prec == kFp8 || prec == kFp8Block) {
    // fp8 e4m3 with per-row scales, or (fp8-block128) DeepSeek-V3's one scale per 128 x 128 block.
    Fp8Weight q = quantize_fp8(w);
    if (prec == kFp8Block) {
      const int64_t nr = (n + 127) / 128, nc = (k + 127) / 128;
      q.scale = from_vector(std::vector<float>(static_cast<size_t>(nr * nc), 0.01f), Shape{nr, nc});
      q.block_n = q.block_k = 128;
    }
    bytes_per_weight = 1 + static_cast<double>(q.scale.nbytes()) / static_cast<double>(n * k);
    for (auto _ : st) {
      y = linear_fp8(x, q);
      benchmark::DoNotOptimize(y.raw_data());
    }
  } else {
    const DType dt = prec == kBf16 ? DType::bf16 : prec == kF16 ? DType::f16 : DType::f32;
    bytes_per_weight = static_cast<double>(dtype_size(dt));
    const Tensor wd = w.to(dt), xd = x.to(dt);
    for (auto _ : st) {
      y = linear(xd, wd);
      benchmark::DoNotOptimize(y.raw_data());
    }
  }
  st.SetLabel(precision_name(prec));
  st.counters["GB/s"] = benchmark::Counter(1e-9 * bytes_per_weight * static_cast<double>(n * k),
                                           benchmark::Counter::kIsIterationInvariantRate);
}

// The int4 vnni kernels themselves (groups of 32, f16 scales), on the canonical layout read in
// place (kernel 0, gemv_int4_vnni) and on the repacked panel layout (kernel 1,
// gemv_int4_panels): rows x out x in, and `mb` > 0 rotates over copies of the weight filling
// that many MB (as a model's weights stream through the caches on a decode step; 0: one copy,
// cache-resident). Skipped without AVX-512 VNNI.
void BM_gemv_int4_kernel(benchmark::State& st) {
  const bool panels = st.range(0) == 1;
  const int64_t rows = st.range(1), n = st.range(2), k = st.range(3), mb = st.range(4);
  if (!kernels::int4_panel_supported(k, 32)) {
    st.SkipWithError("no AVX-512 VNNI");
    return;
  }
  NoGradGuard ng;
  const Int4Weight q = quantize_int4(randn({n, k}), 32, DType::f16);
  const Tensor x = randn({rows, k});
  const kernels::Int4Scales sc(q.scale.data<f16>());
  const int64_t canon = n * k / 2 + q.scale.nbytes(), packed = kernels::int4_panel_bytes(n, k, 32, true);
  const int64_t bytes = panels ? packed : canon;
  const int64_t copies = std::max<int64_t>(1, mb * (int64_t{1} << 20) / bytes);
  std::vector<std::vector<uint8_t>> w(static_cast<size_t>(copies));
  std::vector<uint8_t> one(static_cast<size_t>(bytes));
  if (panels) {
    kernels::int4_pack_panels(n, k, 32, q.q.data<uint8_t>(), sc, one.data());
  } else {
    std::memcpy(one.data(), q.q.data<uint8_t>(), static_cast<size_t>(n * k / 2));
    std::memcpy(one.data() + n * k / 2, q.scale.raw_data(), q.scale.nbytes());
  }
  for (auto& c : w) c = one;
  std::vector<float> y(static_cast<size_t>(rows * n));
  size_t i = 0;
  for (auto _ : st) {
    const uint8_t* wp = w[i++ % w.size()].data();
    if (panels)
      kernels::gemv_int4_panels(rows, n, k, 32, x.data<float>(), k, wp, true, y.data(), n);
    else
      kernels::gemv_int4_vnni(rows, n, k, 32, x.data<float>(), k, wp,
                              kernels::Int4Scales(reinterpret_cast<const f16*>(wp + n * k / 2)), y.data(), n);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetLabel(panels ? "panels" : "in-place");
  st.counters["GB/s"] = benchmark::Counter(1e-9 * static_cast<double>(canon), benchmark::Counter::kIsIterationInvariantRate);
}

// The one-time repacking of an int4 weight (groups of 32, f16 scales) to the panel layout, as the
// cpu linear_int4 op does on a weight's first few-row product; GB/s of canonical weight bytes.
void BM_int4_pack_panels(benchmark::State& st) {
  const int64_t n = st.range(0), k = st.range(1);
  const Int4Weight q = quantize_int4(randn({n, k}), 32, DType::f16);
  std::vector<uint8_t> out(static_cast<size_t>(kernels::int4_panel_bytes(n, k, 32, true)));
  for (auto _ : st) {
    kernels::int4_pack_panels(n, k, 32, q.q.data<uint8_t>(), kernels::Int4Scales(q.scale.data<f16>()), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  st.counters["GB/s"] = benchmark::Counter(1e-9 * static_cast<double>(n * k / 2 + q.scale.nbytes()),
                                           benchmark::Counter::kIsIterationInvariantRate);
}

// One-row greedy decode of bench_llama_cpp's model (12 layers, hidden 768, MLP 2048, 12 / 4
// heads, vocab 32000, untied head; projections and head int4 in groups of 32) with the cpu
// linear_int4 op's repacked weights on (1) or off (0, the in-place kernel): one model built once,
// the cache switched between the runs (so --benchmark_enable_random_interleaving interleaves the
// two), 16 tokens after an 8-token prompt per iteration, a warm-up generation (and the repacking)
// untimed.
void BM_decode_int4_repack(benchmark::State& st) {
  static models::CausalLM* m = [] {
    models::ModelConfig cfg;
    cfg.model_type = "llama";
    cfg.vocab_size = 32000, cfg.hidden_size = 768, cfg.intermediate_size = 2048;
    cfg.num_hidden_layers = 12, cfg.num_attention_heads = 12, cfg.num_key_value_heads = 4;
    cfg.tie_word_embeddings = false, cfg.max_position_embeddings = 2048;
    Generator g(1);
    auto* lm = new models::CausalLM(cfg, &g);
    lm->eval();
    models::quantize_causal_lm(*lm, nn::WeightQuant::int4, 32, true);
    return lm;
  }();
  ops::set_int4_repack_cap_mb(st.range(0) == 1 ? -1 : 0);
  models::GenerationConfig gc;
  gc.max_new_tokens = 2;
  const std::vector<std::vector<int64_t>> prompt = {{1, 5, 9, 13, 17, 21, 25, 29}};
  benchmark::DoNotOptimize(models::generate(*m, prompt, gc).data());
  gc.max_new_tokens = 16;
  for (auto _ : st) benchmark::DoNotOptimize(models::generate(*m, prompt, gc).data());
  st.SetLabel(st.range(0) == 1 ? "repacked" : "in place");
  st.counters["tokens/s"] = benchmark::Counter(16, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["repack MB"] = static_cast<double>(ops::int4_repack_stats().bytes) / (1 << 20);
  ops::set_int4_repack_cap_mb(-1);
}

void BM_decode_quantized(benchmark::State& st) {
  const auto prec = static_cast<Precision>(st.range(0));
  const int64_t new_tokens = st.range(1);
  const std::string cfg = R"({"model_type": "llama", "vocab_size": 8192, "hidden_size": 1024,
    "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
    "max_position_embeddings": 1024, "tie_word_embeddings": false})";
  Generator g(1);
  models::CausalLM m(models::ModelConfig::from_json(cfg), &g);
  m.eval();
  if (prec == kInt8) models::quantize_causal_lm(m, nn::WeightQuant::int8);
  if (prec == kInt4) models::quantize_causal_lm(m, nn::WeightQuant::int4, 32);
  models::GenerationConfig gc;
  gc.max_new_tokens = new_tokens;
  {
    // One short untimed generation first: one-time work (the int4 weights' repacking for the
    // few-row kernel, buffers) stays out of the tokens/s.
    models::GenerationConfig warm = gc;
    warm.max_new_tokens = 2;
    benchmark::DoNotOptimize(models::generate(m, {{1, 2, 3, 4}}, warm).data());
  }
  for (auto _ : st) {
    const auto out = models::generate(m, {{1, 2, 3, 4}}, gc);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetLabel(precision_name(prec));
  st.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(new_tokens), benchmark::Counter::kIsIterationInvariantRate);
}

// One decode step of one attention layer over a KV cache of `context` positions (Llama-3-8B's
// attention: 32 query heads, 8 kv heads, head size 128): the cache in f32, bf16, int8 or e4m3
// (update_and_attend, the quantized bytes read in place), and the int8 cache read the general
// way for comparison (update() returns the cache dequantized to f32, then attention over it).
void BM_kv_cache_attend(benchmark::State& st) {
  const int kind = static_cast<int>(st.range(0));  // 0 f32, 1 bf16, 2 int8, 3 e4m3, 4 int8 dequantized first
  const int64_t context = st.range(1), H = 32, HK = 8, D = 128;
  const DType dt = kind == 0 ? DType::f32 : kind == 1 ? DType::bf16 : kind == 3 ? DType::f8e4m3 : DType::i8;
  NoGradGuard ng;
  Generator g(3);
  nn::KVCache c(1, 1, HK, context, D, dt);
  const Tensor kp = rand({1, HK, context - 1, D}, {}, &g), vp = rand({1, HK, context - 1, D}, {}, &g);
  c.update(0, kp, vp);
  c.advance(context - 1);
  const DType act = kind == 1 ? DType::bf16 : DType::f32;  // the activations' dtype (a bf16 model's for bf16)
  const Tensor q = to(rand({1, H, 1, D}, {}, &g), act), k = to(rand({1, HK, 1, D}, {}, &g), act),
               v = to(rand({1, HK, 1, D}, {}, &g), act);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (auto _ : st) {  // the step writes position context - 1 and attends over all positions
    if (kind == 4) {
      const auto [kc, vc] = c.update(0, k, v);
      benchmark::DoNotOptimize(scaled_dot_product_attention(q, kc, vc, {}, false, scale).raw_data());
    } else {
      benchmark::DoNotOptimize(c.update_and_attend(0, q, k, v, {}, scale).raw_data());
    }
  }
  static const char* names[] = {"f32", "bf16", "int8", "e4m3", "int8, dequantized first"};
  st.SetLabel(names[kind]);
  const double bytes = static_cast<double>(c.nbytes());  // the whole cache is live: every byte is read once
  st.counters["cache MB"] = bytes / 1e6;
  st.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_sim_quantized_step(benchmark::State& st) {
  const bool v7 = st.range(0) == 7;
  const auto prec = static_cast<Precision>(st.range(1));
  const int64_t tokens = st.range(2);
  const char* ideal = std::getenv("TPU_BENCH_SIM_IDEAL");
  const std::string chip = std::string(v7 ? "v7" : "v6e") + (ideal && ideal[0] == '1' ? "-ideal" : "");
  const std::string prev = device::sim_chip(1);
  device::set_sim_chip(chip, 1);
  const sim::ChipConfig cfg = sim::preset_config(chip);
  const bool was = codegen::timing_only();
  codegen::set_timing_only(true);
  double us = 0, bytes = 0, mm_cycles = 0, flops = 0;
  {
    NoGradGuard ng;
    const Device d("sim:1");
    const int64_t shapes[7][2] = {{4096, 4096}, {1024, 4096}, {1024, 4096}, {4096, 4096},
                                  {14336, 4096}, {14336, 4096}, {4096, 14336}};  // [out, in]
    std::vector<Tensor> ws, ss;
    for (const auto& sh : shapes) {
      const DType wt = prec == kBf16 ? DType::bf16 : prec == kInt8 ? DType::i8 : DType::u8;
      // timing-only: values do not matter
      ws.push_back(empty({sh[0], prec == kInt4 ? sh[1] / 2 : sh[1]}, {wt, d}));
      ss.push_back(prec == kInt4 ? empty({sh[0], sh[1] / 32}, {DType::f32, d}) : empty({sh[0]}, {DType::f32, d}));
      flops += 2.0 * double(tokens) * double(sh[0]) * double(sh[1]);
    }
    std::vector<Tensor> xs;
    for (const auto& sh : shapes) xs.push_back(empty({tokens, sh[1]}, {DType::bf16, d}));
    auto step = [&] {
      for (size_t i = 0; i < 7; ++i) {
        const Tensor y = prec == kBf16   ? linear(xs[i], ws[i])
                         : prec == kInt8 ? linear_int8(xs[i], ws[i], ss[i])
                         : prec == kInt4 ? linear_int4(xs[i], ws[i], ss[i])
                                         : linear_fp8(xs[i], ws[i], ss[i]);
        (void)y;
      }
      synchronize(d);
    };
    step();  // builds the programs
    const char* kernel = prec == kBf16   ? "linear"
                         : prec == kInt8 ? "linear_int8"
                         : prec == kInt4 ? "linear_int4"
                                         : "linear_fp8";
    for (auto _ : st) {
      codegen::reset_stats();
      step();
      const codegen::CodegenStats cs = codegen::stats();
      us = cs.cycles / (cfg.clock_ghz * 1e3);
      bytes = double(cs.hbm_bytes);
      mm_cycles = cs.cycles_by_kernel.count(kernel) ? cs.cycles_by_kernel.at(kernel) : 0;
    }
  }
  codegen::set_timing_only(was);
  device::set_sim_chip(prev, 1);
  st.SetLabel(chip + " " + (prec == kBf16 ? "bf16" : precision_name(prec)) + (tokens <= 8 ? " decode" : " prefill"));
  st.counters["sim_us"] = us;
  st.counters["HBM_MB"] = bytes / 1e6;
  st.counters["HBM_use"] = us > 0 ? bytes / (us * 1e-6) / (cfg.memory.hbm_bandwidth_gbps * 1e9) : 0;
  st.counters["mm_TFLOPs"] = mm_cycles > 0 ? flops / (mm_cycles / (cfg.clock_ghz * 1e9)) / 1e12 : 0;
  st.counters["tokens/s"] = us > 0 ? double(tokens) / (32 * us * 1e-6) : 0;
}

}  // namespace

BENCHMARK(BM_sim_quantized_step)
    ->ArgsProduct({{6, 7}, {kBf16, kInt8, kFp8, kInt4}, {8, 1024}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_gemv_weights)
    ->ArgsProduct({{kF32, kBf16, kF16, kInt8, kInt4, kInt4F16, kFp8, kFp8Block}, {1, 4, 16}, {4096}, {4096}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
// The shapes of a small Llama's projections (hidden 768, intermediate 2048), where an int4 panel
// of 16 unpacked weight rows fits the L1d.
BENCHMARK(BM_gemv_weights)
    ->ArgsProduct({{kInt8, kInt4, kInt4F16}, {1, 16}, {2048}, {768}})
    ->Args({kInt8, 16, 768, 2048})
    ->Args({kInt4F16, 16, 768, 2048})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
// The model's shapes (qkv, o, gate/up, down, head), cache-resident and streaming over 64 MB.
BENCHMARK(BM_gemv_int4_kernel)
    ->ArgsProduct({{0, 1}, {1}, {2048}, {768}, {0, 64}})
    ->ArgsProduct({{0, 1}, {1}, {768}, {2048}, {0, 64}})
    ->ArgsProduct({{0, 1}, {1}, {32000}, {768}, {0}})
    ->ArgsProduct({{0, 1}, {4}, {2048}, {768}, {0}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_int4_pack_panels)->Args({32000, 768})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_decode_int4_repack)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_kv_cache_attend)->ArgsProduct({{0, 1, 2, 3, 4}, {512, 4096}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_decode_quantized)->ArgsProduct({{kF32, kInt8, kInt4}, {64}})->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
