// tpu-sim: run simulator programs from the command line.
//   tpu-sim run prog.tasm [--chip v5e|chip.json] [--timing-only] [--race-check] [--trace out.json] [--json]
//   tpu-sim presets [--json]          list the chip presets
//   tpu-sim preset NAME               print a preset's JSON config
//   tpu-sim gen gemm M N K [--chip C] [--mode bf16|f32|i8] [--json]   print a generated program
//   tpu-sim gen copy BYTES [--chip C] [--chunk BYTES] [--buffers N] [--json]
//   tpu-sim convert prog.tasm|prog.json [--json]   print as assembly (or JSON)
// Programs ending in .json are read as JSON, anything else as assembly; "-" is stdin.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/assembly.h"
#include "sim/chip.h"
#include "sim/error.h"
#include "sim/presets.h"
#include "sim/programs.h"
#include "sim/serialize.h"
#include "tools/cli_args.h"

using namespace tpu::sim;

namespace {

const char* const kCommands =
    "commands:\n"
    "  tpu-sim run PROGRAM [--chip NAME|FILE] [--timing-only] [--race-check] [--trace OUT.json] [--json]\n"
    "  tpu-sim presets [--json]\n"
    "  tpu-sim preset NAME\n"
    "  tpu-sim gen gemm M N K [--chip NAME] [--mode bf16|f32|i8] [--block-m N] [--json]\n"
    "  tpu-sim gen copy BYTES [--chip NAME] [--chunk BYTES] [--buffers N] [--json]\n"
    "  tpu-sim convert PROGRAM [--json]\n"
    "PROGRAM is an assembly file (.tasm), a JSON program (.json) or - for stdin.";

int usage() {
  std::fprintf(stderr, "usage: tpu-sim COMMAND [ARGS] [OPTIONS] (tpu-sim --help for the options)\n%s\n", kCommands);
  return 2;
}

struct Args {
  std::vector<std::string> pos;
  std::string chip = "v5e", trace, mode = "bf16";
  bool json = false, timing_only = false, race = false;
  int64_t chunk = 1 << 20, buffers = 4, block_m = 0;
};

// nullopt: run the command; else the exit code (0 after --help, 2 after a bad option).
std::optional<int> parse_args(int argc, char** argv, int from, Args& a) {
  tpu::cli::Parser p("tpu-sim", "Runs, generates and converts programs of the simulated chip.");
  p.value("--chip", "NAME|FILE", "chip preset or config JSON (default v5e)", [&](const std::string& v) { a.chip = v; });
  p.value("--trace", "OUT.json", "run: write a Chrome/Perfetto trace", [&](const std::string& v) { a.trace = v; });
  p.value("--mode", "bf16|f32|i8", "gen gemm: MXU mode (default bf16)", [&](const std::string& v) { a.mode = v; });
  p.value("--chunk", "BYTES", "gen copy: bytes per DMA (default 1 MiB)", [&](const std::string& v) { a.chunk = p.to_int(v); });
  p.value("--buffers", "N", "gen copy: buffers in flight (default 4)", [&](const std::string& v) { a.buffers = p.to_int(v); });
  p.value("--block-m", "N", "gen gemm: rows per block (default: chosen)", [&](const std::string& v) { a.block_m = p.to_int(v); });
  p.flag("--json", "print JSON", [&] { a.json = true; });
  p.flag("--timing-only", "run: cost the program without computing values", [&] { a.timing_only = true; });
  p.flag("--race-check", "run: report unordered accesses to the same memory", [&] { a.race = true; });
  p.positional("COMMAND ARGS...", "see the commands below");
  p.epilog(kCommands);
  if (auto rc = p.parse(argc, argv, from)) return rc;
  a.pos = p.positionals();
  return std::nullopt;
}

std::string read_all(const std::string& path) {
  std::stringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
  } else {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw SimError(fmt::format("cannot read '{}'", path));
    ss << f.rdbuf();
  }
  return ss.str();
}

Program load_program(const std::string& path) {
  std::string text = read_all(path);
  size_t first = text.find_first_not_of(" \t\r\n");
  bool is_json = (path.size() > 5 && path.substr(path.size() - 5) == ".json") || (first != std::string::npos && text[first] == '{');
  try {
    return is_json ? program_from_json_text(text) : parse_program(text);
  } catch (const SimError& e) {
    throw SimError(fmt::format("{}: {}", path, e.what()));
  }
}

void print_program(const Program& p, bool json) {
  std::fputs((json ? program_to_json_text(p, 1) + "\n" : to_text(p)).c_str(), stdout);
}

int cmd_run(const Args& a) {
  if (a.pos.size() != 1) return usage();
  Program p = load_program(a.pos[0]);
  Chip chip = Chip::create(a.chip);
  RunOptions opt;
  opt.timing_only = a.timing_only;
  opt.race_check = a.race;
  opt.trace = !a.trace.empty();
  auto t0 = std::chrono::steady_clock::now();
  RunResult r = chip.run(p, opt);
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.trace.empty()) write_chrome_trace(a.trace, r.trace, &p);
  if (a.json) {
    auto j = stats_to_json(r.stats);
    j["wall_seconds"] = wall;
    j["race_reports"] = nlohmann::json::array();
    for (const auto& x : r.races) j["race_reports"].push_back({{"first", x.first}, {"second", x.second}, {"kind", x.kind}, {"message", x.message}});
    std::puts(j.dump(1).c_str());
  } else {
    std::fputs(format_report(r.stats).c_str(), stdout);
    std::printf("  simulated in      %.3f s wall (%.3g instructions/s)\n", wall, double(r.stats.instructions) / wall);
    for (const auto& x : r.races) std::printf("  %s\n", x.message.c_str());
    if (r.trace.truncated) std::puts("  trace truncated (too many events)");
  }
  return r.races.empty() ? 0 : 3;
}

int cmd_presets(const Args& a) {
  if (a.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& n : preset_names()) j.push_back(config_to_json(preset_config(n)));
    std::puts(j.dump(1).c_str());
    return 0;
  }
  std::printf("%-6s %9s %5s %9s %7s %10s %10s %9s  %-8s %s\n", "name", "clock", "MXUs", "MXU", "cores", "peak/core", "HBM/core",
              "HBM BW", "VMEM", "timing (<name>-ideal: ideal)");
  for (const auto& n : preset_names()) {
    ChipConfig c = preset_config(n);
    std::printf("%-6s %6.2f GHz %5d %4dx%-4d %7d %6.1f TF/s %6.1f GiB %5.0f GB/s  %-8s %s\n", n.c_str(), c.clock_ghz,
                c.mxu.count, c.mxu.rows, c.mxu.cols, c.cores_per_chip, c.peak_flops() / 1e12,
                double(c.memory.hbm_bytes) / double(1ull << 30), c.memory.hbm_bandwidth_gbps,
                (std::to_string(c.memory.vmem_bytes >> 20) + " MiB").c_str(), c.timing.model.c_str());
  }
  return 0;
}

int cmd_gen(const Args& a) {
  if (a.pos.empty()) return usage();
  ChipConfig cfg = load_config(a.chip);
  if (a.pos[0] == "gemm" && a.pos.size() == 4) {
    GemmSpec s;
    s.m = std::stoll(a.pos[1]);
    s.n = std::stoll(a.pos[2]);
    s.k = std::stoll(a.pos[3]);
    auto mode = parse_mxu_mode(a.mode);
    if (!mode) throw SimError("--mode must be bf16, f32 or i8");
    s.mode = *mode;
    s.block_m = a.block_m;
    print_program(make_gemm(cfg, s).program, a.json);
    return 0;
  }
  if (a.pos[0] == "copy" && a.pos.size() == 2) {
    print_program(make_stream_copy(cfg, uint64_t(std::stoll(a.pos[1])), uint64_t(a.chunk), int(a.buffers)).program, a.json);
    return 0;
  }
  return usage();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a;
    if (auto rc = parse_args(argc, argv, 1, a)) return *rc;
    if (a.pos.empty()) return usage();
    const std::string cmd = a.pos[0];
    a.pos.erase(a.pos.begin());
    if (cmd == "run") return cmd_run(a);
    if (cmd == "presets") return cmd_presets(a);
    if (cmd == "preset" && a.pos.size() == 1) {
      std::puts(config_to_json(preset_config(a.pos[0])).dump(1).c_str());
      return 0;
    }
    if (cmd == "gen") return cmd_gen(a);
    if (cmd == "convert" && a.pos.size() == 1) {
      print_program(load_program(a.pos[0]), a.json);
      return 0;
    }
    return usage();
  } catch (const SimError& e) {
    std::fprintf(stderr, "tpu-sim: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpu-sim: error: %s\n", e.what());
    return 1;
  }
}
