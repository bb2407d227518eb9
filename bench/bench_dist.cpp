// All-reduce over gloo between processes on loopback: through tpu::dist (with and without the
// header check) against the same Gloo ring all-reduce called directly, in the same run.
//
//   tpu-run -n 2 ./bench_dist [--benchmark_filter=...]      (also -n 4)
//
// Each rank runs the same benchmarks with fixed iteration counts (the ranks must issue the
// same collectives), only rank 0 reports. Sizes 1 KB .. $TPU_BENCH_DIST_MAX_MB (default 256) MB
// of f32. Both paths use a Gloo context of their own over the TCP transport, the ring algorithm
// and the same plain-loop f32 sum; the tpu::dist path adds its queue hand-off, the optional
// header exchange and the tensor plumbing, which is what this measures.
#include <benchmark/benchmark.h>
#include <gloo/allreduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "tpucore/dist.h"
#include "tpucore/ops.h"

namespace {

std::shared_ptr<gloo::Context> g_direct;

int64_t max_bytes() {
  const char* v = std::getenv("TPU_BENCH_DIST_MAX_MB");
  return (v ? std::atoll(v) : 256) << 20;
}

int64_t iterations(int64_t bytes) {  // same on every rank; ~0.3-2 s per size on loopback
  return std::clamp<int64_t>((int64_t{64} << 20) / bytes, 6, 2000);
}

void sum_f32(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<float*>(out);
  const auto* x = static_cast<const float*>(a);
  const auto* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

void BM_GlooDirect(benchmark::State& state) {
  const int64_t n = state.range(0) / 4;
  std::vector<float> buf(static_cast<size_t>(n), 1.0f);
  for (auto _ : state) {
    gloo::AllreduceOptions o(g_direct);
    o.setOutput(buf.data(), static_cast<size_t>(n));
    o.setReduceFunction(sum_f32);
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    gloo::allreduce(o);
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void run_dist(benchmark::State& state, bool check) {
  const int64_t n = state.range(0) / 4;
  tpu::Tensor t = tpu::ones(tpu::Shape{n});
  auto g = tpu::dist::world();
  g->set_check_consistency(check);
  for (auto _ : state) g->all_reduce(t);
  g->set_check_consistency(true);
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
void BM_TpuDist(benchmark::State& state) { run_dist(state, true); }
void BM_TpuDistNoCheck(benchmark::State& state) { run_dist(state, false); }

// The three paths call by call (direct, tpu::dist, tpu::dist without the header check), each
// timed on its own: on a loaded machine the per-size ratio is steadier than separate runs.
// Direct Gloo works on the tensor's own memory: the buffer matters (a std::vector of the same
// size ran 1.5-2x faster at 256 KB - 1 MB on the loaded machine, for both paths), so only the
// code path differs.
void BM_Interleaved(benchmark::State& state) {
  const int64_t n = state.range(0) / 4;
  tpu::Tensor t = tpu::ones(tpu::Shape{n});
  float* buf = static_cast<float*>(t.raw_data());
  auto g = tpu::dist::world();
  double direct = 0, dist = 0, nocheck = 0;
  using clock = std::chrono::steady_clock;
  auto run_direct = [&] {
    gloo::AllreduceOptions o(g_direct);
    o.setOutput(buf, static_cast<size_t>(n));
    o.setReduceFunction(sum_f32);
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    gloo::allreduce(o);
  };
  auto run_dist = [&](bool check) {
    g->set_check_consistency(check);
    g->all_reduce(t);
    g->set_check_consistency(true);
  };
  auto timed = [](auto&& f) {
    auto t0 = clock::now();
    f();
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  int64_t i = 0;
  for (auto _ : state) {  // the order rotates each iteration, so no path always goes first
    double a = 0, b = 0, c = 0;
    switch (i++ % 3) {
      case 0: a = timed(run_direct); b = timed([&] { run_dist(true); }); c = timed([&] { run_dist(false); }); break;
      case 1: b = timed([&] { run_dist(true); }); c = timed([&] { run_dist(false); }); a = timed(run_direct); break;
      default: c = timed([&] { run_dist(false); }); a = timed(run_direct); b = timed([&] { run_dist(true); }); break;
    }
    direct += a;
    dist += b;
    nocheck += c;
    state.SetIterationTime(a + b + c);
  }
  const double it = static_cast<double>(state.iterations());
  state.counters["direct_us"] = direct / it * 1e6;
  state.counters["dist_us"] = dist / it * 1e6;
  state.counters["nocheck_us"] = nocheck / it * 1e6;
  state.counters["overhead_pct"] = (dist / direct - 1) * 100;
  state.counters["nocheck_overhead_pct"] = (nocheck / direct - 1) * 100;
}

void register_all() {
  for (int64_t b = 1024; b <= max_bytes(); b *= 4)
    benchmark::RegisterBenchmark("BM_Interleaved", BM_Interleaved)->Arg(b)->Iterations(iterations(b))->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  for (int64_t b = 1024; b <= max_bytes(); b *= 4) {
    for (auto [name, fn] : {std::pair{"BM_GlooDirect", &BM_GlooDirect}, std::pair{"BM_TpuDist", &BM_TpuDist},
                            std::pair{"BM_TpuDistNoCheck", &BM_TpuDistNoCheck}})
      benchmark::RegisterBenchmark(name, fn)->Arg(b)->Iterations(iterations(b))->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
}

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  tpu::dist::init_process_group();
  const int rank = tpu::dist::get_rank(), world = tpu::dist::get_world_size();
  // The direct Gloo context: its own rendezvous through a file store next to the TCP one.
  std::string dir = (std::filesystem::temp_directory_path() / ("tpu_bench_dist_" + std::string(std::getenv("MASTER_PORT")))).string();
  if (rank == 0) {  // a fresh directory: stale keys of an earlier run would misdirect the mesh
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  tpu::dist::barrier();
  {
    gloo::rendezvous::FileStore store(dir);
    auto dev = gloo::transport::tcp::CreateDevice("127.0.0.1");
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
    ctx->connectFullMesh(store, dev);
    g_direct = ctx;
  }
  tpu::dist::barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("world_size", std::to_string(world));
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  tpu::dist::barrier();
  g_direct.reset();
  tpu::dist::destroy_process_group();
  return 0;
}
