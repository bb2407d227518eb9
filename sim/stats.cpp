#include "sim/stats.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tpu::sim {
namespace {

std::string si(double v, const char* unit) {
  const char* p[] = {"", "K", "M", "G", "T", "P", "E"};
  int i = 0;
  while (std::abs(v) >= 1000 && i < 6) v /= 1000, ++i;
  return fmt::format("{:.3g} {}{}", v, p[i], unit);
}

std::string bytes(double v) {
  const char* p[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (v >= 1024 && i < 4) v /= 1024, ++i;
  return fmt::format("{:.4g} {}", v, p[i]);
}

}  // namespace

std::string format_report(const Stats& s) {
  std::string o;
  o += fmt::format("chip {}{}\n", s.chip, s.timing_only ? " (timing-only)" : "");
  o += fmt::format("  cycles            {:.0f}  ({} at {} GHz, {} timing model)\n", s.cycles, si(s.seconds, "s"),
                   s.clock_ghz, s.timing_model);
  if (s.timing_model != "ideal") o += fmt::format("  ideal cycles      {:.0f}  (event timeline)\n", s.ideal_cycles);
  o += fmt::format("  instructions      {} executed, {} in the program\n", s.instructions, s.static_instructions);
  o += fmt::format("  MXU FLOPs         {}  -> {}  (peak {}{}{})\n", si(s.mxu_flops, "FLOP"),
                   si(s.flops_per_second, "FLOP/s"), si(s.peak_flops, "FLOP/s"), s.mxu_modes.empty() ? "" : " ",
                   s.mxu_modes);
  o += fmt::format("  MFU               {:.2f}%   MXU busy {:.2f}%\n", 100 * s.mfu, 100 * s.mxu_busy_fraction);
  o += fmt::format("  HBM               read {}, written {}  ({:.2f}% of {} B/cycle)\n", bytes(double(s.hbm_bytes_read)),
                   bytes(double(s.hbm_bytes_written)), 100 * s.hbm_bandwidth_fraction, s.hbm_bytes_per_cycle);
  o += fmt::format("  arith. intensity  {:.2f} FLOP/byte\n", s.arithmetic_intensity);
  o += fmt::format("  vector elements   {}\n", si(s.vector_elements, ""));
  o += "  unit busy cycles:\n";
  for (const auto& u : s.units) {
    if (u.instructions == 0) continue;
    o += fmt::format("    {:<14} {:>14.0f}  {:6.2f}%  ({} instructions)\n", u.name, u.busy_cycles,
                     s.cycles > 0 ? 100 * u.busy_cycles / s.cycles : 0.0, u.instructions);
  }
  if (s.race_check) o += fmt::format("  races             {}\n", s.races);
  return o;
}

nlohmann::json stats_to_json(const Stats& s) {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& u : s.units)
    units.push_back({{"name", u.name}, {"busy_cycles", u.busy_cycles}, {"instructions", u.instructions}});
  return {{"chip", s.chip},
          {"timing_only", s.timing_only},
          {"clock_ghz", s.clock_ghz},
          {"cycles", s.cycles},
          {"ideal_cycles", s.ideal_cycles},
          {"timing_model", s.timing_model},
          {"seconds", s.seconds},
          {"instructions", s.instructions},
          {"static_instructions", s.static_instructions},
          {"units", units},
          {"mxu_flops", s.mxu_flops},
          {"vector_elements", s.vector_elements},
          {"hbm_bytes_read", s.hbm_bytes_read},
          {"hbm_bytes_written", s.hbm_bytes_written},
          {"dma_bytes", s.dma_bytes},
          {"peak_flops", s.peak_flops},
          {"mxu_modes", s.mxu_modes},
          {"mxu_peak_cycles", s.mxu_peak_cycles},
          {"hbm_bytes_per_cycle", s.hbm_bytes_per_cycle},
          {"mxu_busy_fraction", s.mxu_busy_fraction},
          {"mfu", s.mfu},
          {"flops_per_second", s.flops_per_second},
          {"arithmetic_intensity", s.arithmetic_intensity},
          {"hbm_bandwidth_fraction", s.hbm_bandwidth_fraction},
          {"race_check", s.race_check},
          {"races", s.races}};
}

}  // namespace tpu::sim
