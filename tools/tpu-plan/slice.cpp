// Slices, the mapping of parallel degrees to torus axes, collective costs and the plan's output.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sim/error.h"
#include "sim/presets.h"
#include "tools/tpu-plan/plan.h"

namespace tpu::plan {

std::string Layout::str() const {
  std::string o = fmt::format("tp={} fsdp={} dp={}", tp, fsdp, dp);
  if (ep > 1) o += fmt::format(" ep={}", ep);
  if (slices > 1) o += fmt::format(" slices={} (DCN)", slices);
  return o;
}

double dcn_all_reduce_s(const Slice& s, int64_t slices, uint64_t bytes) {
  if (slices <= 1 || bytes == 0) return 0;
  const double n = double(slices);
  return 2 * (n - 1) / n * double(bytes) / s.topo.ici.dcn_bytes_per_s() + 2 * (n - 1) * s.topo.ici.dcn_latency_us * 1e-6;
}

namespace {
// Every way to write n as a product of `dims` axis lengths within max_shape.
void factorizations(int64_t n, size_t dim, const std::vector<int>& max, std::vector<int>& cur,
                    std::vector<std::vector<int>>& out) {
  if (dim + 1 == max.size()) {
    if (n <= max[dim]) {
      cur.push_back(int(n));
      out.push_back(cur);
      cur.pop_back();
    }
    return;
  }
  for (int a = 1; a <= max[dim] && a <= n; ++a)
    if (n % a == 0) {
      cur.push_back(a);
      factorizations(n / a, dim + 1, max, cur, out);
      cur.pop_back();
    }
}
}  // namespace

Slice make_slice(const std::string& chip_name, bool calibrated, const std::string& topology, int64_t chips) {
  Slice s;
  std::string chip = chip_name;
  if (chip.size() > 6 && chip.ends_with("-ideal")) chip.resize(chip.size() - 6), calibrated = false;
  try {
    s.chip = sim::preset_config(calibrated ? chip : chip + "-ideal");
    sim::IciConfig ici = sim::ici_preset(chip);
    // The optical-switch generations (3-D tori closing every 4-chip cube) build a slice of any
    // A x B x C cubes up to the pod's chip count (e.g. 16x16x32 = 8,192 of v7's 9,216).
    int64_t pod_chips = 1;
    for (int a : ici.max_shape) pod_chips *= a;
    const bool ocs = ici.dims == 3 && ici.wraparound_multiple == 4 && chip != "tiny";
    if (ocs) ici.max_shape.assign(3, int(std::min<int64_t>(4096, pod_chips / 16)));
    auto too_big = [&](int64_t n) {
      if (ocs && n > pod_chips)
        throw PlanError(fmt::format("{} chips exceed the {} pod's {} chips", n, chip, pod_chips));
    };
    if (!topology.empty()) {
      s.topo = sim::make_topology(ici, topology);
      too_big(s.topo.chips());
      if (chips > 0 && s.topo.chips() != chips)
        throw PlanError(fmt::format("--chips {} disagrees with --topology {} ({} chips)", chips, topology, s.topo.chips()));
    } else {
      if (chips < 1) throw PlanError("give --chips N or --topology AxBxC");
      too_big(chips);
      std::vector<std::vector<int>> all;
      std::vector<int> cur;
      factorizations(chips, 0, ici.max_shape, cur, all);
      if (ocs && chips >= 64)  // whole cubes: every axis a multiple of 4
        std::erase_if(all, [](const std::vector<int>& v) { return std::any_of(v.begin(), v.end(), [](int a) { return a % 4; }); });
      if (all.empty())
        throw PlanError(fmt::format("{} chips do not form a {} slice (largest {})", chips, chip,
                                    fmt::join(ici.max_shape, "x")));
      // The most cubic shape; among equals the one with the most wraparound axes.
      auto score = [&](const std::vector<int>& v) {
        int wrap = 0;
        for (int a : v) wrap += (a > 1 && a % ici.wraparound_multiple == 0);
        return std::make_tuple(double(*std::max_element(v.begin(), v.end())) / *std::min_element(v.begin(), v.end()), -wrap, v);
      };
      std::sort(all.begin(), all.end(), [&](const auto& a, const auto& b) { return score(a) < score(b); });
      s.topo = sim::make_topology(ici, all.front());
    }
  } catch (const sim::SimError& e) {
    throw PlanError(e.what());
  }
  s.ideal = s.chip.timing.model != "calibrated";
  if (s.ideal) {
    // The ideal model: the same counted work at the units' peaks, memory fully overlapped, no
    // fixed per-kernel costs (the event timeline's view of a well-pipelined kernel).
    sim::TimingConfig& t = s.chip.timing;
    t.mxu_efficiency = t.hbm_efficiency = t.wide_hbm_efficiency = t.memory_overlap = 1;
    t.launch_cycles = t.reduce_cycles = t.dma_cycles = t.weight_load_exposed = 0;
  }
  return s;
}

std::vector<std::vector<AxisPart>> assign_axes(const sim::Topology& t, const Layout& l) {
  const int64_t n = t.chips();
  if (l.tp < 1 || l.fsdp < 1 || l.dp < 1 || l.tp * l.fsdp * l.dp != n)
    throw PlanError(fmt::format("layout {} does not divide the mesh: tp x fsdp x dp = {} but the slice {} has {} chips",
                                l.str(), l.tp * l.fsdp * l.dp, fmt::join(t.shape, "x"), n));
  std::vector<std::vector<AxisPart>> parts(3);
  const int64_t need0[3] = {l.tp, l.fsdp, l.dp};
  int64_t need[3] = {l.tp, l.fsdp, l.dp};
  int d = 0;
  for (int a = t.axes() - 1; a >= 0; --a) {
    int64_t left = t.shape[size_t(a)];
    while (left > 1) {
      while (d < 3 && need[d] == 1) ++d;
      if (d == 3) break;
      const int64_t g = std::gcd(left, need[d]);
      if (g == 1 || (left % need[d] != 0 && need[d] % left != 0))
        throw PlanError(fmt::format("layout {} does not divide the mesh {}: {} = {} cannot be laid on whole or "
                                    "split axes (axis {} has {} chips left)",
                                    l.str(), fmt::join(t.shape, "x"), d == 0 ? "tp" : d == 1 ? "fsdp" : "dp", need0[d],
                                    a, left));
      const int64_t take = std::min(left, need[d]);
      parts[size_t(d)].push_back({a, int(take), take == t.shape[size_t(a)]});
      need[d] /= take;
      left /= take;
    }
  }
  return parts;
}

double collective_s(const Slice& s, const Layout& l, int which, sim::CollectiveKind kind, uint64_t bytes) {
  // EP: the first ep chips of the FSDP axes, i.e. the FSDP degree of the layout tp x ep x rest.
  const Layout on = which == 3 ? Layout{l.tp, l.ep, s.topo.chips() / (l.tp * l.ep), 1} : l;
  const auto parts = assign_axes(s.topo, on)[size_t(which == 3 ? 1 : which)];
  if (parts.empty() || bytes == 0) return 0;
  sim::Topology sub;
  sub.ici = s.topo.ici;
  for (const AxisPart& p : parts) {
    sub.shape.push_back(p.length);
    // A part of an axis has no wraparound links of its own: a line.
    sub.wrap.push_back(p.whole && s.topo.wrap[size_t(p.axis)]);
  }
  return sim::ici_cost(sub, kind, bytes).seconds;
}

nlohmann::json Plan::to_json() const {
  nlohmann::json j = {{"model", model},
                      {"chip", chip},
                      {"topology", topology},
                      {"chips", chips},
                      {"layout", layout},
                      {"mode", serve ? "serve" : "train"},
                      {"step_s", step_s},
                      {"breakdown_s",
                       {{"mxu", breakdown.mxu},
                        {"other_compute", breakdown.other_compute},
                        {"hbm", breakdown.hbm},
                        {"exposed_ici", breakdown.exposed_ici},
                        {"host", breakdown.host},
                        {"ici_total", breakdown.ici_total},
                        {"exposed_all_to_all", breakdown.all_to_all},
                        {"dcn_total", breakdown.dcn_total},
                        {"exposed_dcn", breakdown.exposed_dcn}}},
                      {"params", params},
                      {"active_params", active_params},
                      {"mfu", mfu},
                      {"tokens_per_s_per_chip", tokens_per_s_per_chip},
                      {"hbm_per_chip_bytes",
                       {{"weights", hbm.weights},
                        {"optimizer", hbm.optimizer},
                        {"gradients", hbm.gradients},
                        {"gathered", hbm.gathered},
                        {"activations", hbm.activations},
                        {"kv_cache", hbm.kv_cache},
                        {"total", hbm.total()},
                        {"capacity", hbm_capacity}}},
                      {"fits", fits},
                      {"usd_per_million_tokens", usd_per_mtok}};
  if (!fits) j["advice"] = advice;
  if (serve) {
    j["ttft_s"] = ttft_s;
    j["tpot_s"] = tpot_s;
    j["requests_per_s"] = requests_per_s;
    if (step_tokens > 0) {
      j["decodes_per_step"] = decode_batch;
      j["tokens_per_step"] = step_tokens;
    }
    if (decode_hbm_use > 0) {
      j["decode_tokens_per_s_per_chip"] = decode_batch / tpot_s;
      j["decode_hbm_bandwidth_use"] = decode_hbm_use;
      j["decode_all_to_all_share"] = decode_a2a_share;
    }
  }
  return j;
}

std::string Plan::text() const {
  const double GB = 1e9;
  std::string o = fmt::format("{} on {} x {} ({}), {}, {}\n", model, chips, chip, topology, layout,
                              serve ? "serving" : "training");
  if (serve) {
    o += fmt::format("  TTFT {:.3f} ms   TPOT {:.3f} ms   {:.3f} requests/s\n", ttft_s * 1e3, tpot_s * 1e3, requests_per_s);
    if (step_tokens > 0)
      o += fmt::format("  one step {:.3f} ms: {:.1f} decodes and {:.1f} prompt tokens (continuous batching, chunked prefill)\n",
                       step_s * 1e3, decode_batch, step_tokens - decode_batch);
    else
      o += fmt::format("  batch run {:.3f} s\n", step_s);
    if (decode_hbm_use > 0)
      o += fmt::format("  decode step: {:.1f} tokens/s per chip, HBM bandwidth use {:.1f}% of peak, all-to-all {:.1f}% of "
                       "the step\n", decode_batch / tpot_s, 100 * decode_hbm_use, 100 * decode_a2a_share);
  } else {
    o += fmt::format("  step {:.3f} s   MFU {:.1f}%{}\n", step_s, 100 * mfu,
                     active_params < params ? fmt::format(" (on {:.2f}B active of {:.2f}B parameters)", active_params / 1e9, params / 1e9) : "");
  }
  o += fmt::format("  breakdown (s per chip): MXU {:.4f}  other compute {:.4f}  HBM {:.4f}  exposed ICI {:.4f}  host {:.4f}"
                   "  (ICI total {:.4f})\n",
                   breakdown.mxu, breakdown.other_compute, breakdown.hbm, breakdown.exposed_ici, breakdown.host,
                   breakdown.ici_total);
  if (breakdown.all_to_all > 0)
    o += fmt::format("  exposed all-to-all (MoE dispatch + combine) {:.4f} s, {:.1f}% of the step\n", breakdown.all_to_all,
                     100 * breakdown.all_to_all / step_s);
  if (breakdown.dcn_total > 0)
    o += fmt::format("  DCN (gradient all-reduce across slices) {:.4f} s, exposed {:.4f} s ({:.1f}% of the step)\n",
                     breakdown.dcn_total, breakdown.exposed_dcn, 100 * breakdown.exposed_dcn / step_s);
  o += fmt::format("  tokens/s per chip {:.1f}\n", tokens_per_s_per_chip);
  o += fmt::format("  HBM per chip {:.2f} GB of {:.2f} GB (weights {:.2f}, optimizer {:.2f}, gradients {:.2f}, "
                   "gathered {:.2f}, activations {:.2f}, KV cache {:.2f})\n",
                   hbm.total() / GB, hbm_capacity / GB, hbm.weights / GB, hbm.optimizer / GB, hbm.gradients / GB,
                   hbm.gathered / GB, hbm.activations / GB, hbm.kv_cache / GB);
  if (usd_per_mtok > 0) o += fmt::format("  cost ${:.4f} per million tokens\n", usd_per_mtok);
  if (!fits) o += "  does not fit: " + advice + "\n";
  return o;
}

}  // namespace tpu::plan
