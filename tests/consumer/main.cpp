// Uses the installed headers and library only: small computations checked against closed form,
// and the public entry points of the simulated chip (its counters and timing-only mode). Every
// public umbrella header is included, so a header missing from the installed tree fails here.
#include <cstdio>

#include "tpucore/core/allocator.h"
#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/data.h"
#include "tpucore/kernel.h"
#include "tpucore/devices.h"
#include "tpucore/dist.h"
#include "tpucore/core/log.h"
#include "tpucore/models.h"
#include "tpucore/nn.h"
#include "tpucore/ops.h"
#include "tpucore/optim.h"
#include "tpucore/core/parallel.h"
#include "tpucore/profiler.h"
#include "tpucore/safetensors.h"
#include "tpucore/streams.h"
#include "tpucore/tokenizer.h"

namespace {

int failures = 0;
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer: FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  // sum_{i<n} i = n(n-1)/2
  const int64_t n = 100;
  tpu::Tensor a = tpu::arange(n).to(tpu::DType::f32);
  const double got = tpu::sum(a).item<double>();
  check(got == n * (n - 1) / 2.0, "sum of arange on the cpu");
  bool bad_caught = false;
  try {
    tpu::Device d("gpu:0");
  } catch (const tpu::Error&) {
    bad_caught = true;
  }
  check(bad_caught, "a bad device name is a tpu::Error");

  // A tiny kernel in the interpreter: y = 2 x + 1 over blocks of 4 rows (the last one ragged).
  {
    namespace k = tpu::kernel;
    k::KernelDef def;
    def.name = "affine";
    def.grid = {3};
    def.in_specs = {{.block_shape = {4, 3}, .index_map = [](std::span<const int64_t> g) { return k::Index{g[0], 0}; }}};
    def.out_specs = def.in_specs;
    def.body = [](k::KernelContext& c) { c.out(0).store(c.in(0).load() * 2.0 + 1.0); };
    tpu::Tensor in = tpu::arange(30).to(tpu::DType::f32).reshape({10, 3});
    tpu::Tensor out = k::call(def, {in}, {{tpu::Shape{10, 3}, tpu::DType::f32}})[0];
    // sum_{i<30} (2 i + 1) = 30^2
    check(tpu::sum(out).item<double>() == 900.0, "a kernel::call in the interpreter");
    // Manual mode: a scalar-prefetched row index, x left in HBM, one async copy of that row.
    k::KernelDef man;
    man.name = "pick_row";
    man.num_scalar_prefetch = 1;
    man.num_semaphores = 1;
    man.in_specs = {{.name = "x", .memory = k::MemorySpace::any}};
    man.out_specs = {{.block_shape = {1, 3}}};
    man.scratch = {{.shape = {1, 3}}};
    man.body = [](k::KernelContext& c) {
      k::AsyncCopy cp = c.async_copy(c.in(0).at({c.scalar(0, 0), 0}, {1, 3}), c.scratch(0), 0);
      cp.start();
      cp.wait();
      c.out(0).store(c.scratch(0).load());
    };
    tpu::Tensor row = tpu::from_vector(std::vector<int32_t>{2}, tpu::Shape{1}, tpu::TensorOptions(tpu::DType::i32));
    tpu::Tensor picked = k::call(man, {row, in}, {{tpu::Shape{1, 3}, tpu::DType::f32}})[0];
    check(tpu::sum(picked).item<double>() == 6.0 + 7.0 + 8.0, "a manual-mode kernel with scalar prefetch");
  }

  // The simulated chip through the public API: an add on sim:0 runs a chip program (counted),
  // and in timing-only mode the same program costs the same cycles without computing.
  tpu::set_sim_chip("tiny");
  const tpu::Device sim("sim:0");
  tpu::Tensor x = tpu::full({8, 128}, 2.0).to(sim);
  tpu::Tensor y = tpu::full({8, 128}, 3.0).to(sim);
  (void)(x + y);  // builds and caches the program
  tpu::synchronize(sim);
  tpu::reset_sim_stats();
  const double five = tpu::sum(x + y).item<double>();
  tpu::synchronize(sim);
  const tpu::SimStats functional = tpu::sim_stats();
  check(five == 5.0 * 8 * 128, "x + y on sim:0");
  check(functional.runs >= 1 && functional.cycles > 0, "sim_stats counts the runs and cycles");
  tpu::reset_sim_stats();
  {
    tpu::SimTimingOnly timing;
    check(tpu::sim_timing_only(), "SimTimingOnly turns timing-only mode on");
    tpu::Tensor z = x + y;
    tpu::synchronize(sim);
  }
  const tpu::SimStats timed = tpu::sim_stats();
  check(!tpu::sim_timing_only(), "SimTimingOnly restores the mode");
  check(timed.runs_by_kernel.count("add") == 1 && timed.cycles_by_kernel.count("add") == 1 &&
            timed.cycles_by_kernel.at("add") == functional.cycles_by_kernel.at("add"),
        "timing-only: the add costs the cycles of the functional add");
  if (failures) return 1;
  std::printf("consumer: installed tpucore works (sum of arange(%lld) = %g; sim add: %.0f cycles)\n",
              static_cast<long long>(n), got, timed.cycles);
  return 0;
}
