// The presets' published figures against sim/README.md's "Published chip figures" table: every
// cell of the table is parsed and compared with the chip preset (sim/presets.cpp) and the ICI
// preset (sim/ici.cpp), so the documentation and the code cannot drift apart; and every peak is
// checked against what the preset's MXUs compute at its clock.
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "sim/ici.h"
#include "sim/presets.h"

using namespace tpu::sim;

namespace {

std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string c;
  std::getline(ss, c, '|');  // before the first bar
  while (std::getline(ss, c, '|')) {
    const auto b = c.find_first_not_of(' '), e = c.find_last_not_of(' ');
    out.push_back(b == std::string::npos ? "" : c.substr(b, e - b + 1));
  }
  if (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

// The table's rows by preset name, each a map from column title to cell text.
std::map<std::string, std::map<std::string, std::string>> readme_table() {
  std::ifstream in(std::string(TPU_SOURCE_DIR) + "/sim/README.md");
  REQUIRE(in.good());
  std::string line;
  while (std::getline(in, line) && line != "### Published chip figures") {
  }
  std::vector<std::string> head;
  std::map<std::string, std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    if (line.rfind("###", 0) == 0 || line.rfind("## ", 0) == 0) break;
    if (line.rfind("|", 0) != 0) continue;
    auto c = cells(line);
    if (head.empty()) {
      head = c;
      continue;
    }
    if (c.empty() || c[0].rfind("---", 0) == 0) continue;
    REQUIRE(c.size() == head.size());
    for (size_t i = 0; i < c.size(); ++i) rows[c[0]][head[i]] = c[i];
  }
  return rows;
}

double num(const std::string& s) { return s == "-" ? 0.0 : std::stod(s); }

}  // namespace

TEST_CASE("preset figures equal the README table", "[sim][config][presets]") {
  const auto table = readme_table();
  // Every TPU preset is in the table, and nothing else.
  std::vector<std::string> expect;
  for (const auto& n : preset_names())
    if (n != "tiny") expect.push_back(n);
  REQUIRE(table.size() == expect.size());
  const double gib = 1024.0 * 1024 * 1024, mib = 1024.0 * 1024;
  for (const auto& name : expect) {
    INFO(name);
    REQUIRE(table.count(name) == 1);
    const auto& row = table.at(name);
    const ChipConfig c = preset_config(name);
    const IciConfig ici = ici_preset(name);
    CHECK(c.published_peak_tflops == num(row.at("bf16 TFLOP/s")));
    CHECK(c.published_fp8_tflops == num(row.at("fp8 TFLOP/s")));
    CHECK(double(c.memory.hbm_bytes) * c.cores_per_chip / gib == num(row.at("HBM GiB")));
    CHECK(c.memory.hbm_bandwidth_gbps * c.cores_per_chip == Approx(num(row.at("HBM GB/s"))).epsilon(1e-9));
    CHECK(double(c.memory.vmem_bytes) / mib == num(row.at("VMEM MiB per core")));
    CHECK(c.clock_ghz == num(row.at("clock GHz")));
    CHECK(ici.links_per_chip == int(num(row.at("ICI links"))));
    CHECK(ici.link_gbps == num(row.at("ICI GB/s per link and direction")));
    CHECK(row.at("topology") == std::to_string(ici.dims) + "-D torus");
    CHECK(ici.dcn_gbps_per_chip == num(row.at("DCN Gb/s per chip")));
    CHECK(!row.at("sources").empty());
    // The peaks the MXUs compute at the clock equal the published ones (within 0.5%).
    CHECK(c.chip_peak_flops() / 1e12 == Approx(c.published_peak_tflops).epsilon(0.005));
    if (c.published_fp8_tflops > 0) {
      REQUIRE(c.mxu.fp8_cycles_per_row > 0);
      CHECK(c.peak_flops_at(c.mxu.fp8_cycles_per_row) * c.cores_per_chip / 1e12 ==
            Approx(c.published_fp8_tflops).epsilon(0.005));
    } else {
      CHECK(c.mxu.fp8_cycles_per_row == 0);
    }
  }
  // v7: fp8 at twice the bf16 rate.
  CHECK(preset_config("v7").published_fp8_tflops == 2 * preset_config("v7").published_peak_tflops);
}

namespace {

// sim/README.md's "Where each preset's timing constants come from" table: rows by constant (the
// first cell up to its closing backtick), each a map from preset column to cell text.
std::map<std::string, std::map<std::string, std::string>> readme_timing_table() {
  std::ifstream in(std::string(TPU_SOURCE_DIR) + "/sim/README.md");
  REQUIRE(in.good());
  std::string line;
  while (std::getline(in, line) && line.rfind("Where each preset's timing constants come from", 0) != 0) {
  }
  std::vector<std::string> head;
  std::map<std::string, std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    if (line.rfind("|", 0) != 0) {
      if (!head.empty()) break;  // the table ended
      continue;
    }
    auto c = cells(line);
    if (head.empty()) {
      head = c;
      continue;
    }
    if (c.empty() || c[0].rfind("---", 0) == 0) continue;
    REQUIRE(c.size() == head.size());
    const auto e = c[0].find('`', 1);
    const std::string key = c[0].rfind("`", 0) == 0 && e != std::string::npos ? c[0].substr(1, e - 1) : c[0];
    for (size_t i = 1; i < c.size(); ++i) rows[key][head[i]] = c[i];
  }
  return rows;
}

// "F: 0.307", "C7: 0.86 ...", "M: 1 (dies ...)" -> the label and the number after it.
std::pair<std::string, double> labeled(const std::string& cell) {
  const auto colon = cell.find(':');
  REQUIRE(colon != std::string::npos);
  return {cell.substr(0, colon), std::stod(cell.substr(colon + 1))};
}

}  // namespace

TEST_CASE("preset timing constants equal the README's sources table", "[sim][config][presets]") {
  const auto table = readme_timing_table();
  using Get = double (*)(const TimingConfig&);
  const std::vector<std::pair<std::string, Get>> rows = {
      {"launch_cycles", [](const TimingConfig& t) { return t.launch_cycles; }},
      {"reduce_cycles", [](const TimingConfig& t) { return t.reduce_cycles; }},
      {"megacore", [](const TimingConfig& t) { return double(t.megacore); }},
      {"mxu_efficiency", [](const TimingConfig& t) { return t.mxu_efficiency; }},
      {"hbm_efficiency", [](const TimingConfig& t) { return t.hbm_efficiency; }},
      {"wide_hbm_efficiency", [](const TimingConfig& t) { return t.wide_hbm_efficiency; }},
      {"memory_overlap", [](const TimingConfig& t) { return t.memory_overlap; }},
  };
  for (const auto& [key, get] : rows) {
    INFO(key);
    REQUIRE(table.count(key) == 1);
    const auto& row = table.at(key);
    CHECK(!row.at("rule / source").empty());
    for (const char* name : {"v4", "v5e", "v5p", "v6e", "v7"}) {
      INFO(name);
      const auto [label, value] = labeled(row.at(name));
      CHECK((label == "M" || label == "F" || label == "C" || label == "C7"));
      CHECK(preset_config(name).timing.calibrated());
      CHECK(get(preset_config(name).timing) == Approx(value).epsilon(1e-9));
    }
  }
  // A constant carried over from v7 (C7) is v7's published value.
  for (const auto& [key, get] : rows)
    for (const char* name : {"v5e", "v5p", "v6e"})
      if (labeled(table.at(key).at(name)).first == "C7") {
        INFO(key << " " << name);
        CHECK(labeled(table.at(key).at("v7")).first == "M");
        CHECK(get(preset_config(name).timing) == get(preset_config("v7").timing));
      }
}
