#include "sim/region.h"

#include <algorithm>
#include <utility>

namespace tpu::sim {

void Region::normalize() {
  if (run == 0) return;
  for (int iter = 0; iter < 2; ++iter) {
    if (n0 <= 1 || s0 == 0) { n0 = 1; s0 = 0; }
    if (n1 <= 1 || s1 == 0) { n1 = 1; s1 = 0; }
    if (n1 == 1 && n0 > 1) { std::swap(n0, n1); std::swap(s0, s1); }     // dim 1 is the inner one
    if (n0 > 1 && n1 > 1 && s0 < s1) { std::swap(n0, n1); std::swap(s0, s1); }
    if (n1 > 1 && s1 <= run) {  // rows touch or overlap: one contiguous run
      run = (n1 - 1) * s1 + run;
      n1 = 1;
      s1 = 0;
    }
  }
}

namespace {

// Does the 1-D strided set {base + i*s + [0, run) : i < n} intersect [x, x+len)?
bool strided_hits(uint64_t base, uint64_t run, uint64_t n, uint64_t s, uint64_t x, uint64_t len) {
  if (n == 1 || s == 0) return base < x + len && x < base + run;
  // Need i with base + i*s < x + len  and  base + i*s + run > x.
  // i_max: largest i with base + i*s < x+len; i_min: smallest i with base + i*s + run > x.
  if (x + len <= base) return false;
  uint64_t i_max = (x + len - 1 - base) / s;
  uint64_t i_min = (x >= base + run) ? (x - base - run) / s + 1 : 0;
  if (i_max >= n) i_max = n - 1;
  return i_min <= i_max;
}

// Does region r intersect [x, x+len)?
bool region_hits(const Region& r, uint64_t x, uint64_t len) {
  if (r.hi() <= x || x + len <= r.lo()) return false;
  for (uint64_t i0 = 0; i0 < r.n0; ++i0) {
    uint64_t b = r.base + i0 * r.s0;
    if (strided_hits(b, r.run, r.n1, r.s1, x, len)) return true;
  }
  return false;
}

}  // namespace

bool regions_overlap(const Region& a, const Region& b) {
  if (a.empty() || b.empty() || a.space != b.space) return false;
  if (a.hi() <= b.lo() || b.hi() <= a.lo()) return false;
  bool a_dense = a.n0 == 1 && a.n1 == 1;
  bool b_dense = b.n0 == 1 && b.n1 == 1;
  if (a_dense) return region_hits(b, a.base, a.run);
  if (b_dense) return region_hits(a, b.base, b.run);
  if (a.n0 == 1 && b.n0 == 1 && a.s1 == b.s1) {
    // Same single stride s: rows i of a and j of b meet iff, with k = i - j and D = b.base - a.base,
    // D - a.run < k*s < D + b.run for some k in [-(b.n1-1), a.n1-1].
    // Both regions lie below the memory size (< 2^62), so int64 arithmetic cannot overflow.
    const int64_t s = int64_t(a.s1), D = int64_t(b.base) - int64_t(a.base);
    const int64_t lo_k = -int64_t(b.n1 - 1), hi_k = int64_t(a.n1 - 1);
    const int64_t num = D - int64_t(a.run);  // smallest k with k*s > num
    int64_t k = num >= 0 ? num / s + 1 : -((-num) / s) + ((-num) % s == 0 ? 1 : 0);
    if (k < lo_k) k = lo_k;
    return k <= hi_k && k * s < D + int64_t(b.run);
  }
  // Enumerate the runs of the region with fewer runs, test each against the other.
  const Region& x = (a.n0 * a.n1 <= b.n0 * b.n1) ? a : b;
  const Region& y = (&x == &a) ? b : a;
  if (x.n0 * x.n1 * y.n0 > (uint64_t(1) << 20)) return true;  // too expensive: conservative
  for (uint64_t i0 = 0; i0 < x.n0; ++i0)
    for (uint64_t i1 = 0; i1 < x.n1; ++i1)
      if (region_hits(y, x.base + i0 * x.s0 + i1 * x.s1, x.run)) return true;
  return false;
}

}  // namespace tpu::sim
