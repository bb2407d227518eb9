// Region: the bytes one operand touches, as a strided box
//   base + i0*s0 + i1*s1 + [0, run)   for i0 < n0, i1 < n1
// Used for bounds checks, the timing scoreboard (VMEM/HBM dependencies) and the race checker.
#pragma once
#include <cstdint>

#include "sim/types.h"

namespace tpu::sim {

struct Region {
  Space space = Space::vmem;
  uint64_t base = 0;
  uint64_t run = 0;   // contiguous bytes per innermost chunk (0 = empty region)
  uint64_t n0 = 1, s0 = 0;
  uint64_t n1 = 1, s1 = 0;

  bool empty() const { return run == 0; }
  uint64_t lo() const { return base; }
  uint64_t hi() const { return base + (n0 - 1) * s0 + (n1 - 1) * s1 + run; }  // one past the last byte
  uint64_t bytes() const { return run * n0 * n1; }  // bytes moved (with repeats)
  bool operator==(const Region&) const = default;
  // Merges contiguous dimensions and drops broadcast (stride 0) repeats.
  void normalize();
};

// Exact test whether two regions share a byte. Falls back to the bounding-interval test
// (conservative) when the exact test would be too expensive.
bool regions_overlap(const Region& a, const Region& b);

}  // namespace tpu::sim
