// Internal: DMA engines. The HBM bandwidth is one shared resource: a profile of bandwidth
// already promised to DMAs over time. A new transfer takes, in each time slice from its
// start, min(its engine rate, bandwidth left), until its bytes are moved. DMAs are placed in
// program order, so earlier DMAs keep their rate and later ones use what is left; the total
// bytes per cycle never exceed the configured HBM bandwidth.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "sim/memory.h"

namespace tpu::sim::detail {

class BandwidthProfile {
 public:
  explicit BandwidthProfile(double capacity_bytes_per_cycle);
  // Moves `bytes` starting at t0 at most `max_rate` bytes/cycle; returns the end time.
  double allocate(double t0, double bytes, double max_rate);
  // Forgets the profile before t (no transfer will start earlier).
  void prune(double t);
  size_t segments() const { return times_.size() - head_; }

 private:
  size_t split(double t);  // index of a breakpoint at exactly t
  double cap_;
  std::vector<double> times_;  // segment i spans [times_[i], times_[i+1]); the last is open
  std::vector<double> used_;
  size_t head_ = 0;
};

struct DmaGeometry {
  uint64_t dst = 0, src = 0;
  std::array<int64_t, 3> shape{1, 1, 0};  // planes, rows, bytes per row
  std::array<int64_t, 2> dst_stride{0, 0}, src_stride{0, 0};
};

// Copies in plane/row order (so overlapping copies behave like a row-by-row copy).
void dma_copy(Memory& dst_mem, const Memory& src_mem, const DmaGeometry& g, std::vector<uint8_t>& tmp);

}  // namespace tpu::sim::detail
