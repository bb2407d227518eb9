// Simulated ICI collectives on timing-only pods (figures recorded in sim/README.md):
//   BM_Ici/<slice>/<collective>/<bytes>: all-reduce, all-gather and reduce-scatter of V bytes
//   (the book's V, sim/ici.h) over every axis of a v5e-like 4x4 and 16x16 and a v5p-like 4x4x4
//   slice. Counters:
//     sim_us        simulated time of the collective
//     achieved_GBps V / simulated time
//     limit_GBps    the topology's bandwidth limit for the collective: V / T_bw with
//                   T_bw = c x (N-1)/N x V / (D x W): W one link's bidirectional bandwidth,
//                   D spanned axes, N chips, c = 1 (AG, RS) or 2 (AR), doubled without wraparound
//     pct_of_limit  achieved / limit (target >= 90 % from 64 MB)
//     hop_model_us  the latency-bound model: ring hops (n/2 per axis with wraparound, n-1
//                   without; twice for AR) x 1 us
//     x_hop_model   sim_us / hop_model_us (target <= 2 at the small end)
// The wall time is the host's cost of simulating the collective (one group, by symmetry).
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "sim/pod.h"

using namespace tpu::sim;

namespace {

struct Slice {
  const char* chip;
  const char* shape;
};
const Slice kSlices[] = {{"v5e", "4x4"}, {"v5e", "16x16"}, {"v5p", "4x4x4"}};
const CollectiveKind kKinds[] = {CollectiveKind::all_reduce, CollectiveKind::all_gather, CollectiveKind::reduce_scatter};

void BM_Ici(benchmark::State& state, Slice s, CollectiveKind kind, uint64_t bytes) {
  Pod pod(s.chip, s.shape, PodOptions{true, false});
  const Topology& t = pod.topology();
  const int N = pod.size();
  CollectiveSpec spec;
  spec.kind = kind;
  spec.dtype = DType::bf16;
  // count such that the book's V is `bytes`: all-gather's V is the gathered output.
  spec.count = (kind == CollectiveKind::all_gather ? bytes / uint64_t(N) : bytes) / 2;
  spec.src.assign(size_t(N), 0);
  spec.dst.assign(size_t(N), 0);
  CollectiveResult r;
  for (auto _ : state) r = pod.collective(spec);
  const double V = double(r.bytes);
  int D = 0;
  bool wrap = true;
  double hops = 0;
  for (int a = 0; a < t.axes(); ++a) {
    if (t.shape[size_t(a)] == 1) continue;
    ++D;
    wrap = wrap && t.wrap[size_t(a)];
    hops += t.wrap[size_t(a)] ? t.shape[size_t(a)] / 2 : t.shape[size_t(a)] - 1;
  }
  const double c = (kind == CollectiveKind::all_reduce ? 2.0 : 1.0) * (wrap ? 1.0 : 2.0);
  const double t_bw = c * (1.0 - 1.0 / N) * V / (D * t.ici.link_bidir_bytes_per_s());
  const double hop_model = (kind == CollectiveKind::all_reduce ? 2 : 1) * hops * t.ici.hop_latency_us;
  state.counters["sim_us"] = r.seconds * 1e6;
  state.counters["achieved_GBps"] = r.achieved_gbps;
  state.counters["limit_GBps"] = V / t_bw / 1e9;
  state.counters["pct_of_limit"] = 100.0 * t_bw / r.seconds;
  state.counters["hop_model_us"] = hop_model;
  state.counters["x_hop_model"] = r.seconds * 1e6 / hop_model;
}

const bool registered = [] {
  for (const Slice& s : kSlices)
    for (CollectiveKind k : kKinds)
      for (uint64_t b : {uint64_t(4) << 10, uint64_t(64) << 10, uint64_t(1) << 20, uint64_t(16) << 20,
                         uint64_t(64) << 20, uint64_t(256) << 20}) {
        const std::string name = std::string("BM_Ici/") + s.chip + "_" + s.shape + "/" + collective_name(k) + "/" +
                                 std::to_string(b >> 10) + "KiB";
        benchmark::RegisterBenchmark(name.c_str(), BM_Ici, s, k, b)->Unit(benchmark::kMicrosecond);
      }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
