// The one-row product against a weight of out x in (default 4096 x 4096) at each weight
// precision: f32 and bf16 through linear(), int8 through linear_int8() (weights read in place,
// widened in registers). GB/s counts the bytes of weight read per call, the quantity a decode
// step is bound by.
#include <benchmark/benchmark.h>

#include "tpucore/tpucore.h"

using namespace tpu;

namespace {

enum Precision { kF32 = 0, kBf16 = 1, kInt8 = 2 };

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
  } else {
    const DType dt = prec == kBf16 ? DType::bf16 : DType::f32;
    bytes_per_weight = static_cast<double>(dtype_size(dt));
    const Tensor wd = w.to(dt), xd = x.to(dt);
    for (auto _ : st) {
      y = linear(xd, wd);
      benchmark::DoNotOptimize(y.raw_data());
    }
  }
  st.SetLabel(prec == kInt8 ? "int8" : prec == kBf16 ? "bf16" : "f32");
  st.counters["GB/s"] = benchmark::Counter(1e-9 * bytes_per_weight * static_cast<double>(n * k),
                                           benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_gemv_weights)
    ->ArgsProduct({{kF32, kBf16, kInt8}, {1}, {4096}, {4096}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_gemv_weights)->ArgsProduct({{kF32, kBf16, kInt8}, {4}, {4096}, {4096}})->Unit(benchmark::kMicrosecond)->UseRealTime();

BENCHMARK_MAIN();
