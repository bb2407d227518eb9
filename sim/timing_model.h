// The calibrated timing model (config.h, TimingConfig; sim/README.md "Timing models"): prices a
// program by the work the event timeline counted. Internal to the simulator (the executor).
#pragma once
#include <cstdint>
#include <map>
#include <vector>

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

struct CoreWork {
  double mxu_stream_cycles = 0;  // streaming cycles summed over the core's MXUs (padding included)
  double vector_cycles = 0;      // busy cycles of the core's busiest of vpu, eup, xlu
};

struct CountedWork {
  std::vector<CoreWork> cores;   // one per TensorCore the program ran on (1 unless megacore)
  uint64_t compulsory_bytes = 0; // HBM bytes touched at least once (read + written)
  uint64_t traffic_bytes = 0;    // all HBM bytes moved (read + written)
};

// launch + fill + max(C, M) + (1 - overlap) min(C, M), at least launch + traffic at peak bandwidth;
// C is the busiest core's compute, M the device's (shared) HBM time.
double calibrated_cycles(const ChipConfig& cfg, const CountedWork& w);

}  // namespace tpu::sim::detail
