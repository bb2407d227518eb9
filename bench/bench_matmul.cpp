// Host matmul: our GEMM kernels (f32, and bf16 in / f32 out) against Eigen's f32 GEMM.
// Second argument: threads (ours through the tpucore pool; Eigen split by column blocks over
// the same pool, since Eigen's own threading needs OpenMP). Counter GFLOP/s = 2*n^3;
// cpu_ms_all_threads is the process CPU time per product (fair on a shared machine).
// The libtorch (OpenBLAS / oneDNN) comparison is bench/peer/bench_matmul_torch.cpp.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <sys/resource.h>

#include <Eigen/Core>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/parallel.h"

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

double process_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-3;
}

// Sets the thread count from the second argument and measures process CPU time until finish().
struct Run {
  benchmark::State& state;
  int64_t n;
  int threads;
  double cpu0;
  explicit Run(benchmark::State& s)
      : state(s), n(s.range(0)), threads(static_cast<int>(s.range(1))), cpu0(0) {
    tpu::set_num_threads(threads);
    cpu0 = process_cpu_ms();
  }
  void finish(const char* label) {
    state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(n) * double(n) * double(n) * 1e-9,
                                                   benchmark::Counter::kIsIterationInvariantRate);
    state.counters["cpu_ms_all_threads"] = (process_cpu_ms() - cpu0) / double(state.iterations());
    state.SetLabel(label);
  }
};

std::vector<float> random_floats(int64_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> to_bf16_bits(const std::vector<float>& f) {
  std::vector<uint16_t> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    uint32_t b;
    std::memcpy(&b, &f[i], sizeof b);
    out[i] = static_cast<uint16_t>(b >> 16);
  }
  return out;
}

void BM_ours_f32(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto a = random_floats(n * n, 1), b = random_floats(n * n, 2);
  std::vector<float> c(static_cast<size_t>(n * n));
  Run run(state);
  for (auto _ : state) {
    tpu::kernels::gemm_f32(n, n, n, a.data(), n, 1, b.data(), n, 1, c.data(), n, false);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  run.finish(tpu::kernels::gemm_f32_kernel_name());
}

// bf16 C = A B with B [n, n] row-major, or (b_transposed) B = W^T, the layout of a linear layer
// (x W^T, W [n, n] row-major: B's columns are contiguous along K), which packs B through the
// transposing packer.
void run_ours_bf16(benchmark::State& state, bool b_transposed) {
  const int64_t n = state.range(0);
  const auto a = to_bf16_bits(random_floats(n * n, 1)), b = to_bf16_bits(random_floats(n * n, 2));
  const int64_t b_rs = b_transposed ? 1 : n, b_cs = b_transposed ? n : 1;
  std::vector<float> c(static_cast<size_t>(n * n));
  Run run(state);
  for (auto _ : state) {
    tpu::kernels::gemm_bf16(n, n, n, a.data(), n, 1, b.data(), b_rs, b_cs, c.data(), n, false);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  run.finish(tpu::kernels::gemm_bf16_kernel_name());
}
void BM_ours_bf16(benchmark::State& state) { run_ours_bf16(state, false); }
void BM_ours_bf16_bt(benchmark::State& state) { run_ours_bf16(state, true); }

// Eigen f32 GEMM, C = A*B, with the columns of C split over the pool threads.
void BM_eigen_f32(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto av = random_floats(n * n, 1), bv = random_floats(n * n, 2);
  const Eigen::Map<const RowMatrix> a(av.data(), n, n), b(bv.data(), n, n);
  RowMatrix c(n, n);
  Run run(state);
  const int nt = run.threads;
  for (auto _ : state) {
    tpu::parallel_for(0, nt, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t j0 = n * t / nt, j1 = n * (t + 1) / nt;
        c.middleCols(j0, j1 - j0).noalias() = a * b.middleCols(j0, j1 - j0);
      }
    });
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  run.finish("eigen");
}

// The core's f32 multiply-add ceiling, to read the GEMM figures against: one thread, 24
// independent accumulators (more than the FMA latency times the FMA ports), operands in
// registers, no memory traffic. Returns the multiply-adds done (vector lanes x instructions).
__attribute__((target("avx512f"))) double fma_loop_avx512(int64_t iters) {
  __m512 acc[24], x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1e-7f);
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (auto& a : acc) a = _mm512_fmadd_ps(x, y, a);
    asm volatile("" : "+v"(x));  // keeps the loop from being folded
  }
  __m512 t = acc[0];
  for (int i = 1; i < 24; ++i) t = _mm512_add_ps(t, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, t);
  benchmark::DoNotOptimize(lanes);
  return 16.0 * 24.0 * static_cast<double>(iters);
}
__attribute__((target("avx2,fma"))) double fma_loop_avx2(int64_t iters) {
  __m256 acc[12], x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1e-7f);
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (auto& a : acc) a = _mm256_fmadd_ps(x, y, a);
    asm volatile("" : "+x"(x));
  }
  alignas(32) float lanes[8];
  __m256 t = acc[0];
  for (int i = 1; i < 12; ++i) t = _mm256_add_ps(t, acc[i]);
  _mm256_store_ps(lanes, t);
  benchmark::DoNotOptimize(lanes);
  return 8.0 * 12.0 * static_cast<double>(iters);
}

// Argument: 512 (AVX-512) or 256 (AVX2 + FMA).
void BM_fma_peak(benchmark::State& state) {
  const bool wide = state.range(0) == 512;
  const tpu::CpuFeatures& f = tpu::cpu_features();
  if (wide ? !f.avx512f : !(f.avx2 && f.fma)) {
    state.SkipWithError("this CPU lacks the instructions");
    return;
  }
  double macs = 0;
  for (auto _ : state) macs += wide ? fma_loop_avx512(1 << 20) : fma_loop_avx2(1 << 20);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * macs * 1e-9, benchmark::Counter::kIsRate);
  state.SetLabel(wide ? "avx512 fma, 1 thread" : "avx2 fma, 1 thread");
}
BENCHMARK(BM_fma_peak)->Arg(512)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime();

// (n, threads)
#define TPU_SIZES \
  ->ArgsProduct({{256, 512, 1024, 2048}, {1, 2}})->ArgNames({"n", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime()
BENCHMARK(BM_ours_f32) TPU_SIZES;
BENCHMARK(BM_eigen_f32) TPU_SIZES;
BENCHMARK(BM_ours_bf16) TPU_SIZES;
BENCHMARK(BM_ours_bf16_bt) TPU_SIZES;

}  // namespace

BENCHMARK_MAIN();
