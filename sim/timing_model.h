// The calibrated timing model (config.h, TimingConfig; sim/README.md "Timing models"): prices a
// program by the work the event timeline counted. Internal to the simulator (the executor).
#pragma once
#include <cstdint>
#include <map>

#include "sim/config.h"

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

struct CountedWork {
  double mxu_stream_cycles = 0;  // streaming cycles summed over all MXUs (padding included)
  double vector_cycles = 0;      // busy cycles of the busiest of vpu, eup, xlu
  uint64_t compulsory_bytes = 0; // HBM bytes touched at least once (read + written)
  uint64_t traffic_bytes = 0;    // all HBM bytes moved (read + written)
};

// launch + fill + max(C, M) + (1 - overlap) min(C, M), at least launch + traffic at peak bandwidth.
double calibrated_cycles(const ChipConfig& cfg, const CountedWork& w);

}  // namespace tpu::sim::detail
