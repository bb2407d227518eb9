// The cost of collectives on the ICI torus (declared in sim/ici.h).
//
// All-gather / reduce-scatter / all-reduce: the ring schedule is simulated message by message
// on busy-until link timelines (store and forward: a message occupies its link for bytes / W1
// and arrives one hop latency after leaving it). A bidirectional ring sends each chip's block
// both ways, to the chips at distance 1 .. n/2 on each side (for even n, half a block each way to
// the opposite chip); without wraparound a block runs to both ends of the line. Several axes:
// one part of the data per axis, phases in rotated axis order, one shared timeline per axis.
// By symmetry every ring along an axis has the same schedule, so one ring per axis is simulated.
//
// All-to-all and permute: messages follow dimension-ordered shortest paths; the time is the
// busiest link direction's bytes / W1 plus the longest path's hops x the hop latency.
// Broadcast: pipelined along each spanned axis in turn in 64 KiB chunks.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "sim/error.h"
#include "sim/ici.h"

namespace tpu::sim {
namespace {

struct Ring {            // link timelines of one representative ring: [direction][position]
  std::vector<double> free[2];
  explicit Ring(int n) : free{std::vector<double>(size_t(n), 0.0), std::vector<double>(size_t(n), 0.0)} {}
};

struct Link {
  double bytes_per_s;    // one direction
  double lat;            // seconds per hop
};

// All-gather of `block` bytes per chip on a ring of n chips starting at t0; returns the end
// time, adds the hops of the critical path to `hops` and the busiest link's bytes to `busiest`.
double ring_gather(int n, bool wrap, double block, double t0, Ring& r, const Link& l, int& hops, double& busiest) {
  if (n <= 1 || block <= 0) return t0;
  double end = t0;
  int max_steps = 0;
  std::vector<double> load(size_t(2 * n), 0.0);
  for (int dir = 0; dir < 2; ++dir) {
    const int step = dir == 0 ? 1 : -1;
    std::vector<double> ready(size_t(n), t0);
    const int steps = wrap ? n / 2 : n - 1;
    for (int k = 1; k <= steps; ++k) {
      for (int s = 0; s < n; ++s) {
        // Without wraparound a block travels only while it stays on the line.
        const int from = ((s + (k - 1) * step) % n + n) % n;
        if (!wrap && (from + step < 0 || from + step >= n || (dir == 0 ? from < s : from > s))) continue;
        const double bytes = (wrap && n % 2 == 0 && k == n / 2) ? block / 2 : block;
        double& f = r.free[dir][size_t(from)];
        const double start = std::max(ready[size_t(s)], f);
        f = start + bytes / l.bytes_per_s;
        ready[size_t(s)] = f + l.lat;
        load[size_t(dir * n + from)] += bytes;
        end = std::max(end, ready[size_t(s)]);
        max_steps = std::max(max_steps, k);
      }
    }
  }
  hops += max_steps;
  busiest = std::max(busiest, *std::max_element(load.begin(), load.end()));
  return end;
}

struct Axis {
  int n;
  bool wrap;
};

// The spanned axes (length > 1) of t, in order; `axes` empty = all. SimError for a bad index.
std::vector<Axis> spanned(const Topology& t, const std::vector<int>& axes) {
  std::vector<int> use = axes;
  if (use.empty()) {
    use.resize(size_t(t.axes()));
    std::iota(use.begin(), use.end(), 0);
  }
  std::vector<Axis> out;
  std::vector<bool> seen(size_t(t.axes()), false);
  for (int a : use) {
    if (a < 0 || a >= t.axes())
      throw SimError(fmt::format("collective over axis {}: the slice {} has axes 0..{}", a, t.str(), t.axes() - 1));
    if (seen[size_t(a)]) throw SimError(fmt::format("collective over axis {} twice", a));
    seen[size_t(a)] = true;
    if (t.shape[size_t(a)] > 1) out.push_back({t.shape[size_t(a)], bool(t.wrap[size_t(a)])});
  }
  return out;
}

Link link_of(const IciConfig& c) { return {c.link_gbps * 1e9, c.hop_latency_us * 1e-6}; }

IciCost finish(const IciConfig& c, double seconds, double busiest, int hops, std::string algo) {
  IciCost r;
  r.seconds = seconds;
  r.cycles = seconds * c.clock_ghz * 1e9;
  r.link_bytes = static_cast<uint64_t>(std::llround(busiest));
  r.hops = hops;
  r.algorithm = std::move(algo);
  return r;
}

// Reduce-scatter (rs), all-gather (ag) or both (all-reduce) of V bytes over the axes.
IciCost ring_collective(const IciConfig& c, const std::vector<Axis>& ax, double V, bool rs, bool ag,
                        double lat_scale = 1.0) {
  Link l = link_of(c);
  l.lat *= lat_scale;
  const int D = static_cast<int>(ax.size());
  if (D == 0 || V <= 0) return finish(c, 0, 0, 0, "none (one chip or no bytes)");
  double G = 1;
  for (const Axis& a : ax) G *= a.n;
  std::vector<Ring> rings;
  for (const Axis& a : ax) rings.emplace_back(a.n);
  std::vector<double> t(size_t(D), 0.0);
  std::vector<int> hops(size_t(D), 0);
  double busiest = 0;
  // Part p's all-gather phases: axes p, p+1, ...; the block grows by each axis' length.
  auto phases = [&](int p) {
    std::vector<std::pair<int, double>> ph;
    double block = V / D / G;
    for (int j = 0; j < D; ++j) {
      const int a = (p + j) % D;
      ph.push_back({a, block});
      block *= ax[size_t(a)].n;
    }
    return ph;
  };
  auto run = [&](bool reverse) {
    for (int j = 0; j < D; ++j)
      for (int p = 0; p < D; ++p) {
        auto ph = phases(p);
        auto [a, block] = ph[size_t(reverse ? D - 1 - j : j)];
        t[size_t(p)] = ring_gather(ax[size_t(a)].n, ax[size_t(a)].wrap, block, t[size_t(p)], rings[size_t(a)], l,
                                   hops[size_t(p)], busiest);
      }
  };
  if (rs) run(true);
  if (ag) run(false);
  const double end = *std::max_element(t.begin(), t.end());
  const int h = *std::max_element(hops.begin(), hops.end());
  bool any_line = false;
  for (const Axis& a : ax) any_line |= !a.wrap;
  return finish(c, end, busiest, h,
                fmt::format("{} over {} axis(es){}", any_line ? "bidirectional rings/lines" : "bidirectional rings", D,
                            rs && ag ? " (reduce-scatter + all-gather)" : ""));
}

// Pairs (x_s, x_d) of one axis whose dimension-ordered route crosses the link c -> c+dir, each
// weighted (a half for the two equal ways round at distance n/2).
double crossings(const Axis& a, int c, int dir) {
  double w = 0;
  for (int s = 0; s < a.n; ++s)
    for (int d = 0; d < a.n; ++d) {
      if (s == d) continue;
      int fwd = ((d - s) % a.n + a.n) % a.n;  // hops going +
      auto passes = [&](int step, int len) {   // from s, `len` hops in `step`, through c -> c+step?
        for (int k = 0; k < len; ++k)
          if (((s + k * step) % a.n + a.n) % a.n == c) return true;
        return false;
      };
      if (!a.wrap) {
        if (dir > 0 && d > s && passes(1, d - s)) w += 1;
        if (dir < 0 && d < s && passes(-1, s - d)) w += 1;
        continue;
      }
      const int bwd = a.n - fwd;
      if (fwd < bwd && dir > 0 && passes(1, fwd)) w += 1;
      if (bwd < fwd && dir < 0 && passes(-1, bwd)) w += 1;
      if (fwd == bwd && passes(dir, fwd)) w += 0.5;
    }
  return w;
}

IciCost all_to_all(const IciConfig& c, const std::vector<Axis>& ax, double V, double lat_scale = 1.0) {
  const Link l = link_of(c);
  if (ax.empty() || V <= 0) return finish(c, 0, 0, 0, "none (one chip or no bytes)");
  double G = 1;
  for (const Axis& a : ax) G *= a.n;
  const double per_pair = V / G / G;  // V is the whole array: each chip holds V/G, sends V/G^2 to each
  double busiest = 0;
  int hops = 0;
  for (const Axis& a : ax) {
    for (int cpos = 0; cpos < a.n; ++cpos)
      for (int dir : {1, -1}) busiest = std::max(busiest, per_pair * (G / a.n) * crossings(a, cpos, dir));
    hops += a.wrap ? a.n / 2 : a.n - 1;
  }
  return finish(c, busiest / l.bytes_per_s + hops * l.lat * lat_scale, busiest, hops,
                "dimension-ordered shortest paths (link load)");
}

IciCost broadcast(const IciConfig& c, const std::vector<Axis>& ax, double V, double lat_scale = 1.0) {
  const Link l = link_of(c);
  if (ax.empty() || V <= 0) return finish(c, 0, 0, 0, "none (one chip or no bytes)");
  double total = 0, busiest = 0;
  int hops = 0;
  for (const Axis& a : ax) {
    const double per_link = a.wrap ? V / 2 : V;  // with wraparound each half goes one way round
    const double chunk = std::min(per_link, 65536.0);
    const int h = a.n - 1;                       // worst case: root at one end / half round the ring
    total += per_link / l.bytes_per_s + h * (l.lat * lat_scale + chunk / l.bytes_per_s);
    busiest = std::max(busiest, per_link);
    hops += h;
  }
  return finish(c, total, busiest, hops, "pipelined 64 KiB chunks along each axis");
}

}  // namespace

IciCost ici_cost(const Topology& t, CollectiveKind kind, uint64_t bytes, const std::vector<int>& axes) {
  const std::vector<Axis> ax = spanned(t, axes);
  const double V = double(bytes);
  switch (kind) {
    case CollectiveKind::all_reduce: return ring_collective(t.ici, ax, V, true, true);
    case CollectiveKind::all_gather: return ring_collective(t.ici, ax, V, false, true);
    case CollectiveKind::reduce_scatter: return ring_collective(t.ici, ax, V, true, false);
    case CollectiveKind::all_to_all: return all_to_all(t.ici, ax, V);
    case CollectiveKind::broadcast: return broadcast(t.ici, ax, V);
    case CollectiveKind::permute:
      throw SimError("ici_cost: a permute's cost depends on its pairs; use ici_permute_cost");
  }
  return {};
}

IciCost ici_permute_cost(const Topology& t, const std::vector<std::pair<int, int>>& pairs, uint64_t bytes) {
  const Link l = link_of(t.ici);
  std::map<std::tuple<int, int, int>, double> load;  // (chip, axis, dir) -> bytes
  int hops = 0;
  for (auto [s, d] : pairs) {
    if (s < 0 || s >= t.chips() || d < 0 || d >= t.chips())
      throw SimError(fmt::format("permute pair ({}, {}): chips are 0..{}", s, d, t.chips() - 1));
    if (s == d || bytes == 0) continue;
    std::vector<int> cur = t.coords(s);
    const std::vector<int> to = t.coords(d);
    int h = 0;
    for (int a = 0; a < t.axes(); ++a) {
      const int n = t.shape[size_t(a)];
      int fwd = ((to[size_t(a)] - cur[size_t(a)]) % n + n) % n;
      int dir = 1, len = fwd;
      if (!t.wrap[size_t(a)]) {
        dir = to[size_t(a)] >= cur[size_t(a)] ? 1 : -1;
        len = std::abs(to[size_t(a)] - cur[size_t(a)]);
      } else if (n - fwd < fwd) {
        dir = -1;
        len = n - fwd;
      }
      for (int k = 0; k < len; ++k) {
        load[{t.chip_at(cur), a, dir}] += double(bytes);
        cur[size_t(a)] = ((cur[size_t(a)] + dir) % n + n) % n;
        ++h;
      }
    }
    hops = std::max(hops, h);
  }
  double busiest = 0;
  for (auto& [k, v] : load) busiest = std::max(busiest, v);
  return finish(t.ici, busiest / l.bytes_per_s + hops * l.lat, busiest, hops,
                "dimension-ordered shortest paths (link load)");
}

IciCost ici_group_cost(const Topology& t, CollectiveKind kind, uint64_t bytes, const std::vector<int>& chips) {
  const int G = static_cast<int>(chips.size());
  int dmax = 1;
  for (int i = 0; i < G; ++i) {
    const int a = chips[size_t(i)], b = chips[size_t((i + 1) % G)];
    if (a < 0 || a >= t.chips() || b < 0 || b >= t.chips())
      throw SimError(fmt::format("group chip out of range: chips are 0..{}", t.chips() - 1));
    if (G > 1) dmax = std::max(dmax, t.distance(a, b));
  }
  const std::vector<Axis> ring{{G, G > 2}};
  const double V = double(bytes);
  IciCost r;
  switch (kind) {
    case CollectiveKind::all_reduce: r = ring_collective(t.ici, ring, V, true, true, dmax); break;
    case CollectiveKind::all_gather: r = ring_collective(t.ici, ring, V, false, true, dmax); break;
    case CollectiveKind::reduce_scatter: r = ring_collective(t.ici, ring, V, true, false, dmax); break;
    case CollectiveKind::all_to_all: r = all_to_all(t.ici, ring, V, dmax); break;
    case CollectiveKind::broadcast: r = broadcast(t.ici, ring, V, dmax); break;
    case CollectiveKind::permute: throw SimError("ici_group_cost: use ici_permute_cost for a permute");
  }
  r.algorithm += fmt::format(" (ring through the group's {} chips, up to {} hop(s) apart)", G, dmax);
  return r;
}

}  // namespace tpu::sim
