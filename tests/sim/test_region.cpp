#include <catch2/catch.hpp>

#include <random>
#include <set>

#include "sim/region.h"

using namespace tpu::sim;

namespace {

std::set<uint64_t> bytes_of(const Region& r) {
  std::set<uint64_t> s;
  for (uint64_t i0 = 0; i0 < r.n0; ++i0)
    for (uint64_t i1 = 0; i1 < r.n1; ++i1)
      for (uint64_t b = 0; b < r.run; ++b) s.insert(r.base + i0 * r.s0 + i1 * r.s1 + b);
  return s;
}

Region random_region(std::mt19937& rng) {
  std::uniform_int_distribution<int> small(0, 6), base(0, 200), stride(0, 40), run(1, 12);
  Region r;
  r.base = uint64_t(base(rng));
  r.run = uint64_t(run(rng));
  r.n0 = uint64_t(small(rng) + 1);
  r.s0 = uint64_t(stride(rng));
  r.n1 = uint64_t(small(rng) + 1);
  r.s1 = uint64_t(stride(rng) % 3 == 0 ? r.s0 : stride(rng));
  return r;
}

}  // namespace

TEST_CASE("region normalization keeps the byte set and overlap is exact", "[sim][region]") {
  std::mt19937 rng(42);
  for (int it = 0; it < 3000; ++it) {
    Region a = random_region(rng), b = random_region(rng);
    if (it % 4 == 0) b.s1 = a.s1, b.n0 = 1, a.n0 = 1;  // exercise the equal-stride path
    auto sa = bytes_of(a), sb = bytes_of(b);
    Region na = a, nb = b;
    na.normalize();
    nb.normalize();
    REQUIRE(bytes_of(na) == sa);
    REQUIRE(bytes_of(nb) == sb);
    CHECK(na.lo() == *sa.begin());
    CHECK(na.hi() == *sa.rbegin() + 1);
    bool truth = false;
    for (auto x : sa)
      if (sb.count(x)) {
        truth = true;
        break;
      }
    INFO("a base " << na.base << " run " << na.run << " n0 " << na.n0 << " s0 " << na.s0 << " n1 " << na.n1 << " s1 "
                   << na.s1);
    INFO("b base " << nb.base << " run " << nb.run << " n0 " << nb.n0 << " s0 " << nb.s0 << " n1 " << nb.n1 << " s1 "
                   << nb.s1);
    REQUIRE(regions_overlap(na, nb) == truth);
  }
}
