// The inter-chip interconnect (ICI) of a simulated pod: the torus a slice of chips forms, the
// links' figures, and the cost of the collectives a TPU runs on it.
//
// A preset (ici_preset) pairs with the chip preset of the same name: v5e/v6e are 2-D tori of at
// most 16x16 chips, v4/v5p/v7 3-D tori; `tiny` is for tests. A slice is a shape of at most
// `dims` axes ("8", "4x4", "4x4x4"); an axis has wraparound links when its length is a multiple
// of `wraparound_multiple` (16 on v5e/v6e: only full-length axes; 4 on v4/v5p/v7, where the
// optical switches close every 4-chip cube). Every figure has its source in IciConfig::sources.
//
// Cost model (ici.cpp simulates the algorithm link by link, see sim/README.md "Pod and ICI"):
// a collective over several axes splits its data into one part per axis; part p runs its
// phases along the axes in rotated order (p, p+1, ...), so in each phase every axis carries
// one part. A phase along one axis is a bidirectional ring (or, without wraparound, a
// bidirectional line): every message is serialized on a link at the per-direction bandwidth and
// arrives one hop latency later; the links are simulated as busy-until timelines, so messages
// pipeline and queue as they would.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tpu::sim {

struct IciConfig {
  std::string name;
  std::string description;
  std::vector<std::string> sources;
  int dims = 2;                     // torus dimensions: 1, 2 or 3
  std::vector<int> max_shape;       // largest slice (the full pod), one length per axis
  int wraparound_multiple = 16;     // an axis of length L has wraparound when L % this == 0
  int links_per_chip = 4;           // 2 x dims on a torus (one per neighbor)
  double link_gbps = 45;            // one link, one direction, GB/s (1e9 bytes/s)
  double hop_latency_us = 1.0;      // per hop (the book: about 1 us)
  double clock_ghz = 1.0;           // the chip clock, to express times in cycles
  // The data-center network between slices (multi-slice): each chip's share of its host's NICs,
  // in Gb/s (1e9 bits/s) per direction, and the latency of one message between hosts.
  double dcn_gbps_per_chip = 25;
  double dcn_latency_us = 10;

  // One link's bidirectional bandwidth in bytes/s (the book's W_ici).
  double link_bidir_bytes_per_s() const { return 2.0 * link_gbps * 1e9; }
  // One chip's DCN bandwidth per direction in bytes/s.
  double dcn_bytes_per_s() const { return dcn_gbps_per_chip * 1e9 / 8; }
  void validate() const;            // SimError naming the field
};

std::vector<std::string> ici_preset_names();
// The ICI of a chip preset ("v5e", ...); SimError listing the names when unknown.
IciConfig ici_preset(const std::string& name);
IciConfig ici_from_json(const nlohmann::json& j);
nlohmann::json ici_to_json(const IciConfig& c);

// A slice: the lengths of its axes and whether each has wraparound links.
struct Topology {
  IciConfig ici;
  std::vector<int> shape;
  std::vector<bool> wrap;

  int chips() const;
  int axes() const { return static_cast<int>(shape.size()); }
  std::string str() const;                        // "4x4 (wraparound: no, no)"
  std::vector<int> coords(int chip) const;        // row-major: the last axis varies fastest
  int chip_at(const std::vector<int>& coords) const;
  int distance(int a, int b) const;               // hops along shortest torus paths
};

// "16", "4x4", "4x4x4": each axis 1..max_shape; SimError naming the shape and the limits when it
// does not fit the ICI (too many axes, an axis too long, not a number).
Topology make_topology(const IciConfig& ici, const std::string& shape);
Topology make_topology(const IciConfig& ici, const std::vector<int>& shape);

enum class CollectiveKind : uint8_t { all_reduce, all_gather, reduce_scatter, all_to_all, permute, broadcast };
std::string collective_name(CollectiveKind k);

// The ICI cost of one collective. `bytes` is the size the book calls V for the kind:
//   all_reduce: the buffer on each chip; all_gather: the gathered output on each chip;
//   reduce_scatter: the input on each chip; all_to_all: one chip's buffer times the group size
//   (the whole array); broadcast: the buffer; permute: what each sender sends.
// `axes`: the axes the collective spans (empty: all); the chips sharing the other coordinates
// form independent groups that run at once on disjoint links.
struct IciCost {
  double seconds = 0;
  double cycles = 0;
  uint64_t link_bytes = 0;   // bytes the busiest link direction carried
  int hops = 0;              // hops on the critical path (latency-bound end)
  std::string algorithm;     // e.g. "bidirectional ring x2 axes"
};
IciCost ici_cost(const Topology& t, CollectiveKind kind, uint64_t bytes, const std::vector<int>& axes = {});
// Permute: each (source, target) pair sends `bytes` along a dimension-ordered shortest path;
// links shared by several pairs are shared in time.
IciCost ici_permute_cost(const Topology& t, const std::vector<std::pair<int, int>>& pairs, uint64_t bytes);
// A group that is not an axis-aligned sub-slice: a bidirectional ring through `chips` in that
// order, each step as slow as the longest hop distance between neighbours in the ring.
IciCost ici_group_cost(const Topology& t, CollectiveKind kind, uint64_t bytes, const std::vector<int>& chips);

}  // namespace tpu::sim
