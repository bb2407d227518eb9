// ICI collective costs against the closed forms of "How to Scale Your Model" (jax-ml scaling
// book, sharding chapter): an all-gather or reduce-scatter of V bytes along an axis with
// wraparound takes V / W (W = one link's bidirectional bandwidth), an all-reduce twice that, an
// all-to-all a quarter, an axis without wraparound twice as long, D axes at once 1/D; small
// messages about 1 us per hop. The book's V/W counts all of V, while a chip already holds 1/N
// of it, so the bandwidth terms carry the exact (N-1)/N of a ring; the latency term is the hops
// of the bidirectional ring (n/2 per axis with wraparound, n-1 without) times 1 us.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "sim/error.h"
#include "sim/ici.h"

using namespace tpu::sim;

namespace {

struct Case {
  std::string ici, shape;
};

// The book's time in seconds for `kind` over all axes of `t` (equal axis lengths when several).
double closed_form(const Topology& t, CollectiveKind kind, double V) {
  const double W = t.ici.link_bidir_bytes_per_s();
  const double hop = t.ici.hop_latency_us * 1e-6;
  int D = 0, N = 1;
  double hops = 0;
  bool wrap = true;
  for (int a = 0; a < t.axes(); ++a) {
    const int n = t.shape[size_t(a)];
    if (n == 1) continue;
    ++D;
    N *= n;
    wrap = wrap && t.wrap[size_t(a)];
    hops += t.wrap[size_t(a)] ? n / 2 : n - 1;
  }
  const double line = wrap ? 1.0 : 2.0;
  const double finite = 1.0 - 1.0 / N;
  switch (kind) {
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter: return line * V / (W * D) * finite + hops * hop;
    case CollectiveKind::all_reduce: return 2 * (line * V / (W * D) * finite + hops * hop);
    case CollectiveKind::all_to_all: return line * V / (4 * W) + hops * hop;
    default: return 0;
  }
}

}  // namespace

TEST_CASE("ici: presets carry their figures and sources") {
  for (const std::string& n : ici_preset_names()) {
    IciConfig c = ici_preset(n);
    CHECK(!c.sources.empty());
    CHECK(c.links_per_chip == 2 * c.dims);
    CHECK(c.hop_latency_us == 1.0);
  }
  CHECK(ici_preset("v5e").link_gbps == 45);   // book: 4.5e10 B/s one way per link
  CHECK(ici_preset("v5p").link_gbps == 90);   // 9e10
  CHECK(ici_preset("v5e").dims == 2);
  CHECK(ici_preset("v5p").dims == 3);
  CHECK_THROWS_WITH(ici_preset("v9"), Catch::Contains("unknown ICI preset 'v9'") && Catch::Contains("v5e"));
}

TEST_CASE("ici: slices, wraparound only on full axes, bad shapes") {
  const IciConfig v5e = ici_preset("v5e"), v5p = ici_preset("v5p");
  Topology t = make_topology(v5e, "16x16");
  CHECK(t.chips() == 256);
  CHECK(t.wrap == std::vector<bool>{true, true});
  CHECK(make_topology(v5e, "4x4").wrap == std::vector<bool>{false, false});
  CHECK(make_topology(v5e, "16x8").wrap == std::vector<bool>{true, false});
  CHECK(make_topology(v5p, "4x4x4").wrap == std::vector<bool>{true, true, true});
  CHECK(make_topology(v5p, "2x4x8").wrap == std::vector<bool>{false, true, true});
  CHECK(t.coords(17) == std::vector<int>{1, 1});
  CHECK(t.chip_at({15, 3}) == 243);
  CHECK(t.distance(0, 15) == 1);  // wraparound
  CHECK(make_topology(v5e, "4x4").distance(0, 3) == 3);
  CHECK_THROWS_WITH(make_topology(v5e, "4x4x4"), Catch::Contains("2-D torus"));
  CHECK_THROWS_WITH(make_topology(v5e, "32x2"), Catch::Contains("axis 0 has length 32"));
  CHECK_THROWS_WITH(make_topology(v5e, "4xa"), Catch::Contains("'a' is not an axis length"));
  CHECK_THROWS_WITH(make_topology(v5e, ""), Catch::Contains("not an axis length"));
  CHECK_THROWS_WITH(make_topology(v5e, "0x4"), Catch::Contains("length 0"));
  CHECK_THROWS_AS(ici_cost(t, CollectiveKind::all_gather, 1024, {2}), SimError);
}

TEST_CASE("ici: collective cycles within 10% of the closed form from 4 KB to 256 MB") {
  const std::vector<Case> cases = {
      {"v5e", "16"},     {"v5e", "8"},      {"v5e", "16x16"}, {"v5e", "4x4"},
      {"v5p", "4x4x4"},  {"v5p", "8x8x8"},  {"v4", "16"},     {"v6e", "16x16"},
  };
  const CollectiveKind kinds[] = {CollectiveKind::all_gather, CollectiveKind::reduce_scatter,
                                  CollectiveKind::all_reduce, CollectiveKind::all_to_all};
  for (const Case& c : cases) {
    const Topology t = make_topology(ici_preset(c.ici), c.shape);
    for (CollectiveKind k : kinds) {
      if (k == CollectiveKind::all_to_all && t.axes() > 1) continue;  // the book's all-to-all is one axis
      for (double V = 4096; V <= 256.0 * (1 << 20); V *= 4) {
        const IciCost got = ici_cost(t, k, uint64_t(V));
        const double want = closed_form(t, k, V);
        INFO(c.ici << " " << t.str() << " " << collective_name(k) << " V=" << V << " got " << got.seconds
                   << " s, closed form " << want << " s (" << got.algorithm << ")");
        CHECK(got.seconds == Approx(want).epsilon(0.10));
        CHECK(got.cycles == Approx(got.seconds * t.ici.clock_ghz * 1e9));
      }
    }
  }
}

TEST_CASE("ici: the book's ratios hold at 256 MB") {
  const double V = 256.0 * (1 << 20);
  const Topology ring = make_topology(ici_preset("v5e"), "16");
  const Topology grid = make_topology(ici_preset("v5e"), "16x16");
  const Topology line = make_topology(ici_preset("v5e"), "8");
  const double ag = ici_cost(ring, CollectiveKind::all_gather, uint64_t(V)).seconds;
  const double W = ring.ici.link_bidir_bytes_per_s();
  CHECK(ag == Approx(V / W).epsilon(0.07));
  CHECK(ici_cost(ring, CollectiveKind::all_reduce, uint64_t(V)).seconds / ag == Approx(2).epsilon(0.01));
  CHECK(ici_cost(ring, CollectiveKind::all_to_all, uint64_t(V)).seconds / ag == Approx(0.25 * 16 / 15).epsilon(0.02));
  CHECK(ici_cost(grid, CollectiveKind::all_gather, uint64_t(V)).seconds / ag == Approx(0.5 * 255.0 / 256 * 16 / 15).epsilon(0.02));
  const double line_ag = ici_cost(line, CollectiveKind::all_gather, uint64_t(V)).seconds;
  CHECK(line_ag / (V / W) == Approx(2.0 * 7 / 8).epsilon(0.02));
  // One axis of a 2-D slice costs like a 1-D ring of that axis.
  CHECK(ici_cost(grid, CollectiveKind::all_gather, uint64_t(V), {1}).seconds == Approx(ag).epsilon(1e-9));
}

TEST_CASE("ici: small messages cost about 1 us per hop") {
  const Topology ring = make_topology(ici_preset("v5e"), "16");
  const IciCost c = ici_cost(ring, CollectiveKind::all_gather, 4096);
  CHECK(c.hops == 8);
  CHECK(c.seconds == Approx(8e-6).epsilon(0.02));
  const Topology line = make_topology(ici_preset("v5e"), "8");
  CHECK(ici_cost(line, CollectiveKind::all_gather, 4096).hops == 7);
  CHECK(ici_cost(ring, CollectiveKind::all_gather, 0).seconds == 0);
}

TEST_CASE("ici: permute and broadcast costs") {
  const Topology ring = make_topology(ici_preset("v5e"), "16");
  const double W1 = ring.ici.link_gbps * 1e9, hop = 1e-6, V = 64.0 * (1 << 20);
  // A shift by one: every link carries V once, one hop.
  std::vector<std::pair<int, int>> shift;
  for (int i = 0; i < 16; ++i) shift.push_back({i, (i + 1) % 16});
  CHECK(ici_permute_cost(ring, shift, uint64_t(V)).seconds == Approx(V / W1 + hop).epsilon(1e-6));
  // Two messages over the same link share it.
  const Topology line = make_topology(ici_preset("v5e"), "4");
  CHECK(ici_permute_cost(line, {{0, 2}, {1, 3}}, uint64_t(V)).seconds == Approx(2 * V / W1 + 2 * hop).epsilon(1e-6));
  // Broadcast on a ring: half the buffer each way round.
  const double b = ici_cost(ring, CollectiveKind::broadcast, uint64_t(V)).seconds;
  CHECK(b == Approx(V / 2 / W1 + 15 * (hop + 65536 / W1)).epsilon(1e-6));
}
