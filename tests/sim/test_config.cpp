#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sim/chip.h"
#include "sim/error.h"
#include "sim/presets.h"

using namespace tpu::sim;

TEST_CASE("every preset loads, names its sources and matches its published peak", "[sim][config]") {
  auto names = preset_names();
  REQUIRE(names.size() >= 6);
  for (const auto& n : names) {
    INFO(n);
    ChipConfig c = preset_config(n);
    CHECK(c.name == n);
    CHECK(!c.sources.empty());
    REQUIRE(c.published_peak_tflops > 0);
    // MXUs x R x C x 2 x clock (x cores per chip) must equal the published per-chip peak.
    double peak = c.chip_peak_flops() / 1e12;
    CHECK(std::abs(peak - c.published_peak_tflops) / c.published_peak_tflops < 0.005);
    // JSON round trip.
    ChipConfig back = config_from_json(config_to_json(c));
    CHECK(config_to_json(back) == config_to_json(c));
  }
  CHECK(preset_config("tiny").mxu.rows == 8);
  CHECK(preset_config("v5e").vpu.sublanes == 8);
  CHECK(preset_config("v5e").vpu.lanes == 128);
  CHECK(preset_config("v6e").mxu.rows == 256);
  CHECK(preset_config("v7").cores_per_chip == 2);
}

TEST_CASE("invalid configs give errors naming the field", "[sim][config]") {
  auto j = config_to_json(preset_config("tiny"));
  auto expect_err = [](const nlohmann::json& bad, const std::string& needle) {
    try {
      config_from_json(bad);
      FAIL("no error for " << needle);
    } catch (const SimError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  auto bad = j;
  bad["mxu"]["rows"] = 0;
  expect_err(bad, "mxu.rows");
  bad = j;
  bad["memory"]["hbm_bandwidth_gbps"] = -1;
  expect_err(bad, "memory.hbm_bandwidth_gbps");
  bad = j;
  bad["dma"]["engnes"] = 2;
  expect_err(bad, "dma.engnes");
  bad = j;
  bad["clock_ghz"] = "fast";
  expect_err(bad, "clock_ghz");
  bad = j;
  bad["vpu"]["lanes"] = 1.5;
  expect_err(bad, "vpu.lanes");
  bad = j;
  bad.erase("memory");
  expect_err(bad, "memory");
  CHECK_THROWS_AS(config_from_json_text("{not json"), SimError);
  CHECK_THROWS_WITH(preset_config("v99"), Catch::Contains("v99") && Catch::Contains("v5e"));
  CHECK_THROWS_WITH(load_config("/nonexistent/chip.json"), Catch::Contains("neither a preset"));
}

TEST_CASE("load_config accepts preset names and JSON text", "[sim][config]") {
  CHECK(load_config("v5e").name == "v5e");
  CHECK(load_config(preset_json("v4")).name == "v4");
  Chip chip = Chip::create("tiny");
  CHECK(chip.hbm_size() == 4194304);
  CHECK(chip.vmem_size() == 262144);
}
