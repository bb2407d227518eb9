// Host matmul: our GEMM kernels (f32, and bf16 in / f32 out) against Eigen's f32 GEMM.
// Both run on two threads (ours through the tpucore pool; Eigen split by column blocks over
// the same pool, since Eigen's own threading needs OpenMP). Counter GFLOP/s = 2*n^3.
// The libtorch (OpenBLAS / oneDNN) comparison is bench/peer/bench_matmul_torch.cpp.
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "tpucore/parallel.h"

namespace {

constexpr int kThreads = 2;
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

void set_gflops(benchmark::State& state, int64_t n) {
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(n) * double(n) * double(n) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

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
  tpu::set_num_threads(kThreads);
  const auto a = random_floats(n * n, 1), b = random_floats(n * n, 2);
  std::vector<float> c(static_cast<size_t>(n * n));
  for (auto _ : state) {
    tpu::kernels::gemm_f32(n, n, n, a.data(), n, 1, b.data(), n, 1, c.data(), n, false);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
  state.SetLabel(tpu::kernels::gemm_f32_kernel_name());
}

void BM_ours_bf16(benchmark::State& state) {
  const int64_t n = state.range(0);
  tpu::set_num_threads(kThreads);
  const auto a = to_bf16_bits(random_floats(n * n, 1)), b = to_bf16_bits(random_floats(n * n, 2));
  std::vector<float> c(static_cast<size_t>(n * n));
  for (auto _ : state) {
    tpu::kernels::gemm_bf16(n, n, n, a.data(), n, 1, b.data(), n, 1, c.data(), n, false);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
  state.SetLabel(tpu::kernels::gemm_bf16_kernel_name());
}

// Eigen f32 GEMM, C = A*B, with the columns of C split over the two pool threads.
void BM_eigen_f32(benchmark::State& state) {
  const int64_t n = state.range(0);
  tpu::set_num_threads(kThreads);
  const auto av = random_floats(n * n, 1), bv = random_floats(n * n, 2);
  const Eigen::Map<const RowMatrix> a(av.data(), n, n), b(bv.data(), n, n);
  RowMatrix c(n, n);
  for (auto _ : state) {
    tpu::parallel_for(0, kThreads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t j0 = n * t / kThreads, j1 = n * (t + 1) / kThreads;
        c.middleCols(j0, j1 - j0).noalias() = a * b.middleCols(j0, j1 - j0);
      }
    });
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
}

#define TPU_SIZES ->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime()
BENCHMARK(BM_ours_f32) TPU_SIZES;
BENCHMARK(BM_eigen_f32) TPU_SIZES;
BENCHMARK(BM_ours_bf16) TPU_SIZES;

}  // namespace

BENCHMARK_MAIN();
