// The calibrated timing model (config.h, TimingConfig; sim/README.md "Timing models"): prices a
// program by the work the event timeline counted (Stats::work). The executor applies it to every
// run on a calibrated chip; tools may re-price a run's counted work under other constants (the
// cross-validation of tpu-calib).
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "sim/config.h"
#include "sim/stats.h"

namespace tpu::sim::detail {

// Union of byte intervals [lo, hi): the bytes of HBM a program touched at least once.
class IntervalUnion {
 public:
  void add(uint64_t lo, uint64_t len);
  uint64_t bytes() const { return bytes_; }

 private:
  std::map<uint64_t, uint64_t> iv_;  // lo -> hi, disjoint and not adjacent
  uint64_t bytes_ = 0;
};

}  // namespace tpu::sim::detail

namespace tpu::sim {

// launch + fill + max(C, M) + (1 - overlap) min(C, M), at least launch + traffic at peak bandwidth;
// C is the busiest core's compute, M the device's (shared) HBM time.
double calibrated_cycles(const ChipConfig& cfg, const CountedWork& w);

}  // namespace tpu::sim
