// Elementwise benchmarks: eager overhead of a tiny `a + b` (1 and 64 floats, new output each
// call), bandwidth of `add` on 16M floats against std::memcpy of 64 MiB in the same binary,
// the eager chain relu(x * w + b) on 16M floats (three ops, three fresh outputs), and the
// vector-math kernels of the AVX-512 and AVX2 targets in cache (BM_vec_kernel).
//
// Bytes counters count memory traffic (bytes read + bytes written): add moves 3 x 64 MiB per
// call, memcpy 2 x 64 MiB, so their GB/s figures are directly comparable. cpu_ms_all_threads
// is the process CPU time per call (all threads): the fair figure on a shared machine.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/cpu/vec_math.h"
#include "tpucore/core/allocator.h"
#include "tpucore/ops.h"

namespace {

constexpr int64_t k16M = int64_t{1} << 24;

double process_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-3;
}
void set_cpu_ms(benchmark::State& state, double c0) {
  state.counters["cpu_ms_all_threads"] = (process_cpu_ms() - c0) / static_cast<double>(state.iterations());
}

void BM_tiny_add(benchmark::State& state) {
  const int64_t n = state.range(0);
  const tpu::Tensor a = tpu::ones({n}), b = tpu::ones({n});
  for (auto _ : state) {
    tpu::Tensor c = a + b;
    benchmark::DoNotOptimize(c.raw_data());
  }
}
BENCHMARK(BM_tiny_add)->Arg(1)->Arg(64);

void BM_add_16M(benchmark::State& state) {
  const tpu::Tensor a = tpu::rand({k16M}), b = tpu::rand({k16M});
  for (auto _ : state) {
    tpu::Tensor c = a + b;
    benchmark::DoNotOptimize(c.raw_data());
  }
  state.SetBytesProcessed(state.iterations() * k16M * 4 * 3);
}
BENCHMARK(BM_add_16M)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_memcpy_64MiB(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(k16M) * 4;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes) * 2);
}
BENCHMARK(BM_memcpy_64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_relu_mul_add_16M(benchmark::State& state) {
  const tpu::Tensor x = tpu::randn({k16M}), w = tpu::randn({k16M}), b = tpu::randn({k16M});
  const double c0 = process_cpu_ms();
  for (auto _ : state) {
    tpu::Tensor y = tpu::relu(x * w + b);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_cpu_ms(state, c0);
  // x, w read + t1 write; t1, b read + t2 write; t2 read + y write.
  state.SetBytesProcessed(state.iterations() * k16M * 4 * 8);
}
BENCHMARK(BM_relu_mul_add_16M)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_unary_16M(benchmark::State& state) {
  const tpu::Tensor x = tpu::randn({k16M});
  const int which = static_cast<int>(state.range(0));
  const double c0 = process_cpu_ms();
  for (auto _ : state) {
    tpu::Tensor y = which == 0 ? tpu::exp(x) : which == 1 ? tpu::tanh(x) : which == 2 ? tpu::gelu(x) : tpu::sigmoid(x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_cpu_ms(state, c0);
  state.SetLabel(which == 0 ? "exp" : which == 1 ? "tanh" : which == 2 ? "gelu" : "sigmoid");
  state.SetBytesProcessed(state.iterations() * k16M * 4 * 2);
}
BENCHMARK(BM_unary_16M)->DenseRange(0, 3)->Unit(benchmark::kMillisecond)->UseRealTime();

// One vector-math kernel in cache (4096 floats, one thread), per target: arg 0 the function
// (gelu, exp, tanh, log, and the fused one-pass program gelu(x * w + b)), arg 1 the table (0:
// AVX-512, 1: AVX2). items/s is elements per second of thread CPU time; skipped when the CPU
// lacks the target.
void BM_vec_kernel(benchmark::State& state) {
  namespace vc = tpu::ops::cpu;
  const vc::VecMathTable* t = state.range(1) == 0 ? vc::vec_math_avx512() : vc::vec_math_avx2();
  if (!t) {
    state.SkipWithError("target not available on this CPU");
    return;
  }
  constexpr int64_t n = 4096;
  std::vector<float> x(n), w(n, 1.1f), b(n, 0.1f), y(n);
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>((i % 97) - 48) * 0.09f;
  const int which = static_cast<int>(state.range(0));
  const vc::VecUnary un[] = {vc::VecUnary::gelu_erf, vc::VecUnary::exp, vc::VecUnary::tanh, vc::VecUnary::log};
  vc::VecStep s[3];
  s[0].kind = s[1].kind = vc::VecStepKind::binary;
  s[0].bin = vc::VecBinary::mul, s[0].in0 = 0, s[0].in1 = 1, s[0].out = 3;
  s[1].bin = vc::VecBinary::add, s[1].in0 = 3, s[1].in1 = 2, s[1].out = 4;
  s[2].kind = vc::VecStepKind::unary, s[2].un = vc::VecUnary::gelu_erf, s[2].in0 = 4, s[2].out = 5;
  vc::VecOperand ops[6];
  ops[0].in = x.data(), ops[1].in = w.data(), ops[2].in = b.data(), ops[5].out = y.data();
  if (which == 3)
    for (float& v : x) v = std::fabs(v) + 0.5f;
  for (auto _ : state) {
    if (which < 4) t->get(un[which])(y.data(), x.data(), n);
    else vc::run_vec_program(*t, s, 3, ops, 6, n);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetLabel(std::string(t->name) + " " + (which == 0 ? "gelu" : which == 1 ? "exp" : which == 2 ? "tanh" : which == 3 ? "log" : "fused gelu(x*w+b)"));
}
BENCHMARK(BM_vec_kernel)->ArgsProduct({{0, 1, 2, 3, 4}, {0, 1}});

}  // namespace

BENCHMARK_MAIN();
