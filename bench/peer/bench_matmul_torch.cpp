// Peer benchmark: our host GEMM against libtorch's matmul (OpenBLAS for f32, oneDNN for bf16)
// in the same run, on one and on two threads (second argument). Counters: GFLOP/s = 2*n^3 per
// product per second of wall time; GFLOP/cpu_s per second of process CPU time (all threads),
// the fair figure on a host shared with other work.
//
// OpenBLAS honours OPENBLAS_CORETYPE (which can force an older kernel); run this binary both
// with the environment as set and with `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <dlfcn.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "tpucore/core/parallel.h"

namespace {

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Called first by every case: lets the threads of the case before go idle before this one's clocks
// start. The pthreads build of OpenBLAS keeps its workers spinning for up to 2^28 cycles (~0.1 s)
// after each call; without the pause that spinning took a core from, and was charged to the CPU
// time of, whichever case ran next (ours spin up to 200 us).
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }

// OpenBLAS's own thread count, when libtorch's BLAS is OpenBLAS: torch::set_num_threads sets
// libtorch's intra-op threads but leaves OpenBLAS on all cores, so "one thread" would have run
// OpenBLAS on two.
void set_openblas_threads(int n) {
  using SetThreads = void (*)(int);
  static const auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (fn) fn(n);
}

// Process CPU time from construction to set_gflops (after the timed loop).
struct CpuClock {
  double t0 = process_cpu_seconds();
};

void set_gflops(benchmark::State& state, int64_t n, const CpuClock& clk) {
  const double gflop = 2.0 * double(n) * double(n) * double(n) * 1e-9;
  state.counters["GFLOP/s"] = benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/cpu_s"] = gflop * double(state.iterations()) / (process_cpu_seconds() - clk.t0);
}

void BM_ours_f32(benchmark::State& state) {
  const int64_t n = state.range(0);
  settle();
  tpu::set_num_threads(static_cast<int>(state.range(1)));
  torch::InferenceMode guard;
  torch::manual_seed(0);
  auto a = torch::randn({n, n}), b = torch::randn({n, n}), c = torch::empty({n, n});
  const CpuClock clk;
  for (auto _ : state) {
    tpu::kernels::gemm_f32(n, n, n, a.data_ptr<float>(), n, 1, b.data_ptr<float>(), n, 1,
                           c.data_ptr<float>(), n, false);
    benchmark::DoNotOptimize(c.data_ptr<float>());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n, clk);
  state.SetLabel(tpu::kernels::gemm_f32_kernel_name());
}

void BM_torch_f32(benchmark::State& state) {
  const int64_t n = state.range(0);
  settle();
  set_openblas_threads(static_cast<int>(state.range(1)));
  torch::set_num_threads(static_cast<int>(state.range(1)));
  torch::InferenceMode guard;
  torch::manual_seed(0);
  auto a = torch::randn({n, n}), b = torch::randn({n, n}), c = torch::empty({n, n});
  const CpuClock clk;
  for (auto _ : state) {
    torch::mm_out(c, a, b);
    benchmark::DoNotOptimize(c.data_ptr<float>());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n, clk);
  const char* ct = std::getenv("OPENBLAS_CORETYPE");
  state.SetLabel(std::string("OPENBLAS_CORETYPE=") + (ct ? ct : "(unset)"));
}

// bf16 bits of a bf16 tensor (same storage layout as uint16_t).
const uint16_t* bits(const torch::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
}

void BM_ours_bf16(benchmark::State& state) {
  const int64_t n = state.range(0);
  settle();
  tpu::set_num_threads(static_cast<int>(state.range(1)));
  torch::InferenceMode guard;
  torch::manual_seed(0);
  auto a = torch::randn({n, n}).to(torch::kBFloat16), b = torch::randn({n, n}).to(torch::kBFloat16);
  auto c = torch::empty({n, n});
  const CpuClock clk;
  for (auto _ : state) {
    tpu::kernels::gemm_bf16(n, n, n, bits(a), n, 1, bits(b), n, 1, c.data_ptr<float>(), n, false);
    benchmark::DoNotOptimize(c.data_ptr<float>());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n, clk);
  state.SetLabel(tpu::kernels::gemm_bf16_kernel_name());
}

// libtorch's bf16 matmul: bf16 in, f32 accumulate (oneDNN), bf16 out.
void BM_torch_bf16(benchmark::State& state) {
  const int64_t n = state.range(0);
  settle();
  torch::set_num_threads(static_cast<int>(state.range(1)));
  torch::InferenceMode guard;
  torch::manual_seed(0);
  auto a = torch::randn({n, n}).to(torch::kBFloat16), b = torch::randn({n, n}).to(torch::kBFloat16);
  auto c = torch::empty({n, n}, torch::kBFloat16);
  const CpuClock clk;
  for (auto _ : state) {
    torch::mm_out(c, a, b);
    benchmark::DoNotOptimize(c.data_ptr<at::BFloat16>());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n, clk);
}

#define TPU_SIZES ->ArgsProduct({{256, 512, 1024, 2048}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime()
BENCHMARK(BM_ours_f32) TPU_SIZES;
BENCHMARK(BM_torch_f32) TPU_SIZES;
BENCHMARK(BM_ours_bf16) TPU_SIZES;
BENCHMARK(BM_torch_bf16) TPU_SIZES;

}  // namespace

BENCHMARK_MAIN();
