#include "sim/timing_model.h"

#include <algorithm>
#include <iterator>

namespace tpu::sim::detail {

void IntervalUnion::add(uint64_t lo, uint64_t len) {
  uint64_t hi = lo + len;
  auto it = iv_.upper_bound(lo);
  if (it != iv_.begin() && std::prev(it)->second >= lo) --it;
  while (it != iv_.end() && it->first <= hi) {  // merge every interval overlapping or adjacent
    lo = std::min(lo, it->first), hi = std::max(hi, it->second);
    bytes_ -= it->second - it->first;
    it = iv_.erase(it);
  }
  iv_.emplace(lo, hi);
  bytes_ += hi - lo;
}

}  // namespace tpu::sim::detail

namespace tpu::sim {

double calibrated_cycles(const ChipConfig& cfg, const CountedWork& w) {
  const TimingConfig& t = cfg.timing;
  // Compute: each core's MXU work spread over its MXUs (narrow N included) at the sustained
  // fraction of the peak, or its vector-unit work; the busiest core sets the time. A program
  // that codegen did not split over the cores runs on core 0 alone.
  double c = 0, mxu = 0;
  for (const CoreWork& k : w.cores) {
    c = std::max({c, k.mxu_stream_cycles / (cfg.mxu.count * t.mxu_efficiency), k.vector_cycles});
    mxu += k.mxu_stream_cycles;
  }
  // Memory: the device's HBM (all its cores' bandwidth) is shared by the cores.
  const double bw = cfg.hbm_bytes_per_cycle() * t.megacore;
  const double m = double(w.compulsory_bytes()) / (bw * t.hbm_efficiency);
  const double fill = mxu > 0 ? cfg.mxu.fill_cycles : 0;
  const double priced = fill + std::max(c, m) + (1 - t.memory_overlap) * std::min(c, m);
  // Re-reads of a tiled kernel hide under compute, but never beyond the peak bandwidth.
  return t.launch_cycles + std::max(priced, double(w.traffic_bytes) / bw);
}

}  // namespace tpu::sim
