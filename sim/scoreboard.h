// Internal: the dependency scoreboard of the timing model (see README, "Dependencies").
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "sim/region.h"

namespace tpu::sim::detail {

// In-flight accesses of compute instructions, for VMEM/HBM dependencies; one list for reads
// and one for writes, stored as arrays so the scan over them stays cheap.
struct BoardList {
  std::vector<uint64_t> lo, hi;  // bounding interval (fast reject)
  std::vector<double> t;         // reads: last read done; writes: result ready
  std::vector<int32_t> unit;
  std::vector<uint8_t> space;
  std::vector<Region> r;
  size_t size() const { return t.size(); }
  void push(const Region& rg, double tt, int u) {
    // The same bytes accessed again by the same unit supersede the older entry (a chain of
    // accumulating matmuls into one tile), which keeps the lists short.
    const size_t n = t.size();
    for (size_t i = n; i-- > (n > 8 ? n - 8 : 0);)
      if (unit[i] == u && lo[i] == rg.lo() && r[i] == rg) {
        t[i] = std::max(t[i], tt);
        return;
      }
    lo.push_back(rg.lo());
    hi.push_back(rg.hi());
    t.push_back(tt);
    unit.push_back(u);
    space.push_back(uint8_t(rg.space));
    r.push_back(rg);
  }
  void prune(double before) {
    size_t k = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] <= before) continue;
      lo[k] = lo[i], hi[k] = hi[i], t[k] = t[i], unit[k] = unit[i], space[k] = space[i], r[k] = r[i];
      ++k;
    }
    lo.resize(k), hi.resize(k), t.resize(k), unit.resize(k), space.resize(k), r.resize(k);
  }
  void clear() { prune(std::numeric_limits<double>::infinity()); }
  // Latest t among entries of other units whose bytes overlap `rg`, at least d.
  double scan(const Region& rg, int u, double d) const {
    const uint64_t l = rg.lo(), h = rg.hi();
    const uint8_t sp = uint8_t(rg.space);
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] <= d || unit[i] == u || space[i] != sp || hi[i] <= l || h <= lo[i]) continue;
      if (regions_overlap(r[i], rg)) d = t[i];
    }
    return d;
  }
};

}  // namespace tpu::sim::detail
