#include "sim/pod.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/error.h"
#include "sim/presets.h"

namespace tpu::sim {
namespace {

struct TraceRec {
  int chip;
  int track;  // 0 compute, 1 ICI
  std::string name;
  double start, end;  // cycles
  nlohmann::json args;
};

struct Write {
  int chip;
  uint64_t addr;
  std::vector<uint8_t> bytes;
};

struct Pending {
  std::vector<std::vector<int>> groups;
  std::vector<double> group_end;
  std::vector<Write> writes;
  CollectiveResult result;
  std::string name;
};

// The axes whose coordinates vary over `members`, when the members are exactly one group of a
// collective over those axes in row-major order; empty optional otherwise.
std::optional<std::vector<int>> axes_of(const Topology& t, const std::vector<int>& members) {
  const std::vector<int> c0 = t.coords(members[0]);
  std::vector<int> axes;
  for (int a = 0; a < t.axes(); ++a)
    for (int m : members)
      if (t.coords(m)[size_t(a)] != c0[size_t(a)]) {
        axes.push_back(a);
        break;
      }
  size_t g = 1;
  for (int a : axes) g *= size_t(t.shape[size_t(a)]);
  if (g != members.size()) return std::nullopt;
  for (size_t r = 0; r < members.size(); ++r) {  // rank r must be the r-th row-major member
    std::vector<int> c = c0;
    size_t rest = r;
    for (size_t k = axes.size(); k-- > 0;) {
      const int a = axes[k];
      c[size_t(a)] = int(rest % size_t(t.shape[size_t(a)]));
      rest /= size_t(t.shape[size_t(a)]);
    }
    if (t.chip_at(c) != members[r]) return std::nullopt;
  }
  return axes;
}

}  // namespace

struct Pod::Impl {
  ChipConfig cfg;
  Topology topo;
  PodOptions opt;
  std::vector<std::unique_ptr<Chip>> owned;
  std::vector<Chip*> chips;
  std::vector<double> clock, ici_free;
  std::map<uint64_t, Pending> pending;
  uint64_t next = 1;
  std::vector<TraceRec> trace;
  bool external = false;  // chips owned elsewhere; a null one is not available

  void init(const std::vector<int>& shape, const IciConfig& ici) {
    IciConfig i = ici;
    i.clock_ghz = cfg.clock_ghz;
    topo = make_topology(i, shape);
    const size_t n = size_t(topo.chips());
    owned.resize(n);
    if (chips.empty()) chips.assign(n, nullptr);
    clock.assign(n, 0.0);
    ici_free.assign(n, 0.0);
  }
  void check_chip(int c, const char* what) const {
    if (c < 0 || c >= topo.chips())
      throw SimError(fmt::format("{}: chip {} is not in the {}-chip pod {}", what, c, topo.chips(), topo.str()));
  }
  Chip& chip(int c) {
    check_chip(c, "pod.chip");
    if (!chips[size_t(c)]) {
      if (external) throw SimError(fmt::format("pod: chip {} was not given to this pod", c));
      owned[size_t(c)] = std::make_unique<Chip>(cfg);
      chips[size_t(c)] = owned[size_t(c)].get();
    }
    return *chips[size_t(c)];
  }

  // The groups of `s` (chip ids in rank order) and the cost of one group.
  std::vector<std::vector<int>> groups_of(const CollectiveSpec& s, std::vector<int>& axes_out, bool& generic) const {
    generic = false;
    if (!s.members.empty()) {
      std::set<int> seen;
      for (int m : s.members) {
        check_chip(m, "collective member");
        if (!seen.insert(m).second) throw SimError(fmt::format("collective members: chip {} appears twice", m));
      }
      if (auto ax = axes_of(topo, s.members)) axes_out = *ax;
      else generic = true;
      return {s.members};
    }
    std::vector<int> axes = s.axes;
    if (axes.empty()) {
      axes.resize(size_t(topo.axes()));
      std::iota(axes.begin(), axes.end(), 0);
    }
    (void)ici_cost(topo, CollectiveKind::all_gather, 0, axes);  // validates the axes
    axes_out = axes;
    std::map<std::vector<int>, std::vector<int>> by_rest;  // other coords -> members
    for (int c = 0; c < topo.chips(); ++c) {
      std::vector<int> co = topo.coords(c), rest;
      for (int a = 0; a < topo.axes(); ++a)
        if (std::find(axes.begin(), axes.end(), a) == axes.end()) rest.push_back(co[size_t(a)]);
      by_rest[rest];
    }
    std::vector<std::vector<int>> groups;
    for (auto& [rest, unused] : by_rest) {
      std::vector<int> g;
      size_t G = 1;
      for (int a : axes) G *= size_t(topo.shape[size_t(a)]);
      for (size_t r = 0; r < G; ++r) {  // rank r: row-major over `axes` in the order given
        std::vector<int> c(size_t(topo.axes()));
        size_t k = 0;
        for (int a = 0; a < topo.axes(); ++a)
          if (std::find(axes.begin(), axes.end(), a) == axes.end()) c[size_t(a)] = rest[k++];
        size_t q = r;
        for (size_t j = axes.size(); j-- > 0;) {
          c[size_t(axes[j])] = int(q % size_t(topo.shape[size_t(axes[j])]));
          q /= size_t(topo.shape[size_t(axes[j])]);
        }
        g.push_back(topo.chip_at(c));
      }
      groups.push_back(std::move(g));
    }
    return groups;
  }

  uint64_t book_bytes(const CollectiveSpec& s, size_t G) const {
    const uint64_t b = s.count * uint64_t(elem_size(s.dtype, s.elem));
    switch (s.kind) {
      case CollectiveKind::all_gather:
      case CollectiveKind::all_to_all: return b * G;  // the gathered output / the whole array
      default: return b;
    }
  }

  IciCost cost(const CollectiveSpec& s, const std::vector<std::vector<int>>& groups, const std::vector<int>& axes,
               bool generic) const {
    const size_t G = groups[0].size();
    const uint64_t V = book_bytes(s, G);
    if (s.kind == CollectiveKind::permute) {
      std::vector<std::pair<int, int>> pairs;
      for (auto& g : groups)
        for (auto [a, b] : s.pairs) pairs.push_back({g[size_t(a)], g[size_t(b)]});
      return ici_permute_cost(topo, pairs, s.count * uint64_t(elem_size(s.dtype, s.elem)));
    }
    if (generic) return ici_group_cost(topo, s.kind, V, groups[0]);
    return ici_cost(topo, s.kind, V, axes);
  }

  void validate(const CollectiveSpec& s, const std::vector<std::vector<int>>& groups) const {
    const std::string what = s.name.empty() ? collective_name(s.kind) : s.name;
    const size_t G = groups[0].size();
    const size_t nbuf = s.members.empty() ? size_t(topo.chips()) : s.members.size();
    if (s.src.size() != nbuf || s.dst.size() != nbuf)
      throw SimError(fmt::format("{}: {} source and {} destination addresses for {} chips; give one of each per chip",
                                 what, s.src.size(), s.dst.size(), nbuf));
    const bool divides = s.kind == CollectiveKind::reduce_scatter || s.kind == CollectiveKind::all_to_all;
    if (divides && s.count % G)
      throw SimError(fmt::format("{}: count {} is not a multiple of the group size {}", what, s.count, G));
    if (s.kind == CollectiveKind::broadcast && (s.root < 0 || size_t(s.root) >= G))
      throw SimError(fmt::format("{}: root rank {} is not in the group of {} chips", what, s.root, G));
    if (s.kind == CollectiveKind::permute) {
      std::set<int> targets;
      for (auto [a, b] : s.pairs) {
        if (a < 0 || size_t(a) >= G || b < 0 || size_t(b) >= G)
          throw SimError(fmt::format("{}: pair ({}, {}) names a rank outside 0..{}", what, a, b, G - 1));
        if (!targets.insert(b).second) throw SimError(fmt::format("{}: rank {} is the target of two pairs", what, b));
      }
    }
    if (s.count > (uint64_t(1) << 40)) throw SimError(fmt::format("{}: count {} is too large", what, s.count));
  }
};

Pod::Pod(const std::string& chip, const std::string& shape, PodOptions opt, const std::string& ici)
    : impl_(std::make_unique<Impl>()) {
  impl_->cfg = load_config(chip);
  impl_->opt = opt;
  const IciConfig ic = ici_preset(ici.empty() ? impl_->cfg.name : ici);
  impl_->init(make_topology(ic, shape).shape, ic);
}

Pod::Pod(const ChipConfig& chip, const IciConfig& ici, const std::vector<int>& shape, PodOptions opt)
    : impl_(std::make_unique<Impl>()) {
  chip.validate();
  impl_->cfg = chip;
  impl_->opt = opt;
  impl_->init(shape, ici);
}

Pod::Pod(std::vector<Chip*> chips, const IciConfig& ici, const std::vector<int>& shape, PodOptions opt)
    : impl_(std::make_unique<Impl>()) {
  const Chip* first = nullptr;
  for (Chip* c : chips)
    if (c && !first) first = c;
  if (!first) throw SimError("pod: no chips given");
  for (Chip* c : chips)
    if (c && c->config().name != first->config().name)
      throw SimError("pod: the chips of a pod must share one chip config");
  impl_->cfg = first->config();
  impl_->external = true;
  impl_->opt = opt;
  impl_->chips = std::move(chips);
  impl_->init(shape, ici);
  if (impl_->chips.size() != size_t(impl_->topo.chips()))
    throw SimError(fmt::format("pod: {} chips given for the slice {} of {} chips", impl_->chips.size(),
                               impl_->topo.str(), impl_->topo.chips()));
}

Pod::~Pod() = default;
Pod::Pod(Pod&&) noexcept = default;
Pod& Pod::operator=(Pod&&) noexcept = default;

int Pod::size() const { return impl_->topo.chips(); }
const Topology& Pod::topology() const { return impl_->topo; }
Chip& Pod::chip(int i) { return impl_->chip(i); }
double Pod::clock(int c) const {
  impl_->check_chip(c, "pod.clock");
  return impl_->clock[size_t(c)];
}
void Pod::advance(int c, double cycles) {
  impl_->check_chip(c, "pod.advance");
  if (!(cycles >= 0)) throw SimError(fmt::format("pod.advance: cycles {} must be >= 0", cycles));
  if (impl_->opt.trace && cycles > 0)
    impl_->trace.push_back({c, 0, "compute", impl_->clock[size_t(c)], impl_->clock[size_t(c)] + cycles, {}});
  impl_->clock[size_t(c)] += cycles;
}

RunResult Pod::run(int c, const Program& prog, RunOptions opt) {
  if (impl_->opt.timing_only) opt.timing_only = true;
  RunResult r = chip(c).run(prog, opt);
  const double t0 = impl_->clock[size_t(c)];
  impl_->clock[size_t(c)] += r.stats.cycles;
  if (impl_->opt.trace) impl_->trace.push_back({c, 0, prog.name.empty() ? "program" : prog.name, t0, t0 + r.stats.cycles, {}});
  return r;
}

IciCost Pod::cost(const CollectiveSpec& spec) const {
  std::vector<int> axes;
  bool generic = false;
  auto groups = impl_->groups_of(spec, axes, generic);
  return impl_->cost(spec, groups, axes, generic);
}

uint64_t Pod::start(const CollectiveSpec& s) {
  Impl& m = *impl_;
  std::vector<int> axes;
  bool generic = false;
  auto groups = m.groups_of(s, axes, generic);
  m.validate(s, groups);
  const IciCost cost = m.cost(s, groups, axes, generic);
  const size_t G = groups[0].size();
  const uint64_t es = uint64_t(elem_size(s.dtype, s.elem));
  const uint64_t in_bytes = s.count * es;
  const uint64_t out_bytes = s.kind == CollectiveKind::all_gather       ? in_bytes * G
                             : s.kind == CollectiveKind::reduce_scatter ? in_bytes / G
                                                                        : in_bytes;
  Pending p;
  p.name = s.name.empty() ? collective_name(s.kind) : s.name;
  p.groups = groups;
  // Buffer index of a chip: its id, or its rank among the members.
  auto buf = [&](size_t g, size_t r) { return s.members.empty() ? size_t(groups[g][r]) : r; };
  const bool move = !m.opt.timing_only;
  for (size_t g = 0; g < groups.size(); ++g) {
    // Bounds first: every rank's source and destination inside its chip's HBM.
    for (size_t r = 0; r < G && move; ++r) {
      Chip& c = m.chip(groups[g][r]);
      for (auto [addr, n, kind] : {std::tuple{s.src[buf(g, r)], in_bytes, "source"},
                                   std::tuple{s.dst[buf(g, r)], out_bytes, "destination"}})
        if (!c.hbm().contains(addr, n))
          throw SimError(fmt::format("{}: chip {} (rank {}): {} [{}, {}) is outside its {} bytes of HBM", p.name,
                                     groups[g][r], r, kind, addr, addr + n, c.hbm_size()));
    }
  }
  for (size_t g = 0; g < groups.size() && move; ++g) {
    std::vector<std::vector<uint8_t>> in(G);
    for (size_t r = 0; r < G; ++r) {
      in[r].resize(in_bytes);
      m.chip(groups[g][r]).read_hbm(s.src[buf(g, r)], in[r].data(), in_bytes);
    }
    auto out = [&](size_t r, std::vector<uint8_t> bytes) {
      p.writes.push_back({groups[g][r], s.dst[buf(g, r)], std::move(bytes)});
    };
    std::vector<const void*> ptrs;
    for (auto& v : in) ptrs.push_back(v.data());
    switch (s.kind) {
      case CollectiveKind::all_reduce: {
        std::vector<uint8_t> red(in_bytes);
        reduce_buffers(s.dtype, s.op, ptrs, red.data(), s.count, s.elem);
        for (size_t r = 0; r < G; ++r) out(r, red);
        break;
      }
      case CollectiveKind::reduce_scatter: {
        for (size_t r = 0; r < G; ++r) {
          std::vector<const void*> part;
          for (auto& v : in) part.push_back(v.data() + r * out_bytes);
          std::vector<uint8_t> red(out_bytes);
          reduce_buffers(s.dtype, s.op, part, red.data(), s.count / G, s.elem);
          out(r, std::move(red));
        }
        break;
      }
      case CollectiveKind::all_gather: {
        std::vector<uint8_t> all;
        for (auto& v : in) all.insert(all.end(), v.begin(), v.end());
        for (size_t r = 0; r < G; ++r) out(r, all);
        break;
      }
      case CollectiveKind::all_to_all: {
        const uint64_t blk = in_bytes / G;
        for (size_t j = 0; j < G; ++j) {
          std::vector<uint8_t> o(in_bytes);
          for (size_t r = 0; r < G; ++r)
            std::copy_n(in[r].begin() + std::ptrdiff_t(j * blk), blk, o.begin() + std::ptrdiff_t(r * blk));
          out(j, std::move(o));
        }
        break;
      }
      case CollectiveKind::permute:
        for (auto [a, b] : s.pairs) out(size_t(b), in[size_t(a)]);
        break;
      case CollectiveKind::broadcast:
        for (size_t r = 0; r < G; ++r) out(r, in[size_t(s.root)]);
        break;
    }
  }
  // Timing: a group starts when its chips reached it and their ICI is free.
  const uint64_t V = m.book_bytes(s, G);
  double first = 0, last = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    double t0 = 0;
    for (int c : groups[g]) t0 = std::max({t0, m.clock[size_t(c)], m.ici_free[size_t(c)]});
    const double t1 = t0 + cost.cycles;
    for (int c : groups[g]) m.ici_free[size_t(c)] = t1;
    p.group_end.push_back(t1);
    first = g == 0 ? t0 : std::min(first, t0);
    last = std::max(last, t1);
    if (m.opt.trace)
      for (int c : groups[g])
        m.trace.push_back({c, 1, p.name, t0, t1,
                           {{"bytes", V}, {"achieved_GBps", cost.seconds > 0 ? double(V) / cost.seconds / 1e9 : 0.0},
                            {"algorithm", cost.algorithm}, {"dtype", elem_name(s.dtype, s.elem)},
                            {"group_size", G}}});
  }
  CollectiveResult& res = p.result;
  res.start_cycle = first;
  res.end_cycle = last;
  res.cycles = cost.cycles;
  res.seconds = cost.seconds;
  res.bytes = V;
  res.achieved_gbps = cost.seconds > 0 ? double(V) / cost.seconds / 1e9 : 0;
  res.cost = cost;
  const uint64_t h = m.next++;
  m.pending.emplace(h, std::move(p));
  return h;
}

CollectiveResult Pod::done(uint64_t handle) {
  auto it = impl_->pending.find(handle);
  if (it == impl_->pending.end())
    throw SimError(fmt::format("pod.done: unknown collective handle {} (already done, or never started)", handle));
  Pending p = std::move(it->second);
  impl_->pending.erase(it);
  for (Write& w : p.writes) impl_->chip(w.chip).write_hbm(w.addr, w.bytes.data(), w.bytes.size());
  for (size_t g = 0; g < p.groups.size(); ++g)
    for (int c : p.groups[g]) impl_->clock[size_t(c)] = std::max(impl_->clock[size_t(c)], p.group_end[g]);
  return p.result;
}

std::string Pod::chrome_trace() const {
  nlohmann::json ev = nlohmann::json::array();
  const double us = 1.0 / (impl_->cfg.clock_ghz * 1e3);  // cycles -> microseconds
  std::set<int> seen;
  for (const TraceRec& t : impl_->trace) {
    if (seen.insert(t.chip).second) {
      ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", t.chip}, {"args", {{"name", fmt::format("chip {}", t.chip)}}}});
      ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", t.chip}, {"tid", 0}, {"args", {{"name", "compute"}}}});
      ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", t.chip}, {"tid", 1}, {"args", {{"name", "ICI"}}}});
    }
    nlohmann::json e = {{"ph", "X"}, {"name", t.name}, {"pid", t.chip}, {"tid", t.track},
                        {"ts", t.start * us}, {"dur", (t.end - t.start) * us}};
    if (!t.args.is_null()) e["args"] = t.args;
    ev.push_back(std::move(e));
  }
  return nlohmann::json{{"traceEvents", ev}, {"displayTimeUnit", "ns"}}.dump();
}

void Pod::write_chrome_trace(const std::string& path) const {
  std::ofstream f(path);
  if (!f) throw SimError(fmt::format("pod: cannot write the trace to '{}'", path));
  f << chrome_trace();
}

}  // namespace tpu::sim
