// Weight precision on the decode path. BM_gemv_weights: the one-row (four- and 16-row) product
// against a weight of out x in (default 4096 x 4096) at each precision: f32, bf16 and f16 through
// linear(), int8 through linear_int8() and int4 (groups of 32) through linear_int4() (weights
// read in place, widened in registers, or on AVX-512 VNNI multiplied as bytes by the rows of x
// quantized in blocks of 32; TPU_CPU_FEATURES=avx2 measures the float-activation path). GB/s counts the bytes of weight (and scales) read per
// call, the quantity a decode step is bound by. BM_decode_quantized: greedy decode tokens/s of a
// small random Llama (hidden 1024, 4 layers, intermediate 2816, vocab 8192) in f32, with its
// decoder Linears quantized to int8 or int4 (models::quantize_causal_lm). The thread count is
// the pool's (TPU_NUM_THREADS).
#include <benchmark/benchmark.h>

#include "tpucore/models/generate.h"
#include "tpucore/tpucore.h"

using namespace tpu;

namespace {

enum Precision { kF32 = 0, kBf16 = 1, kInt8 = 2, kInt4 = 3, kF16 = 4 };

const char* precision_name(Precision p) {
  switch (p) {
    case kInt4: return "int4";
    case kInt8: return "int8";
    case kBf16: return "bf16";
    case kF16: return "f16";
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
  } else if (prec == kInt4) {
    const Int4Weight q = quantize_int4(w, 32);
    bytes_per_weight = 0.5 + 4.0 / 32;
    for (auto _ : st) {
      y = linear_int4(x, q);
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
  for (auto _ : st) {
    const auto out = models::generate(m, {{1, 2, 3, 4}}, gc);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetLabel(precision_name(prec));
  st.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(new_tokens), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_gemv_weights)
    ->ArgsProduct({{kF32, kBf16, kF16, kInt8, kInt4}, {1, 4, 16}, {4096}, {4096}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_decode_quantized)->ArgsProduct({{kF32, kInt8, kInt4}, {64}})->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
