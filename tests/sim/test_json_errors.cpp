// Malformed JSON for the chip config and the program readers: every bad input, including
// numbers the JSON library refuses while parsing (1e400 overflows a double), becomes a SimError
// that names the field, never a nlohmann exception escaping the reader.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sim/config.h"
#include "sim/error.h"
#include "sim/presets.h"
#include "sim/serialize.h"

using namespace tpu::sim;

namespace {

// Runs `f` and expects a SimError whose message contains every needle (any other exception
// type fails the test).
template <class F>
void expect_sim_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    FAIL("no error");
  } catch (const SimError& e) {
    INFO(e.what());
    for (const auto& n : needles) CHECK(std::string(e.what()).find(n) != std::string::npos);
  } catch (const std::exception& e) {
    FAIL("escaped exception that is not a SimError: " << e.what());
  }
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  auto p = s.find(from);
  REQUIRE(p != std::string::npos);
  return s.replace(p, from.size(), to);
}

}  // namespace

TEST_CASE("chip config JSON: an out-of-range number is a SimError naming the field", "[sim][config][json]") {
  expect_sim_error([] { config_from_json_text("1e400"); }, {"chip config", "1e400"});
  std::string text = config_to_json(preset_config("tiny")).dump();
  // clock_ghz overflows while parsing: the error names the field being read.
  const std::string bad = replace(text, "\"clock_ghz\":", "\"clock_ghz\":1e400,\"x\":");
  expect_sim_error([&] { config_from_json_text(bad); }, {"clock_ghz"});
  // A nested field.
  nlohmann::json j = nlohmann::json::parse(text);
  std::string nested = j.dump();
  nested = replace(nested, "\"rows\":", "\"rows\":-1e999,\"y\":");
  expect_sim_error([&] { config_from_json_text(nested); }, {"mxu.rows"});
}

TEST_CASE("program JSON: malformed values are SimErrors naming the field", "[sim][json]") {
  expect_sim_error([] { program_from_json_text("1e400"); }, {"program JSON", "1e400"});
  const std::string ok =
      R"({"format":"tpusim-program","version":1,"name":"p","code":[{"op":"halt"}]})";
  REQUIRE_NOTHROW(program_from_json_text(ok));
  expect_sim_error([&] { program_from_json_text(replace(ok, "\"version\":1", "\"version\":1e400")); }, {"version"});
  expect_sim_error([&] { program_from_json_text(replace(ok, "\"version\":1", "\"version\":\"one\"")); },
                   {"version"});
  expect_sim_error([&] { program_from_json_text(replace(ok, "\"name\":\"p\"", "\"name\":\"p\",\"format\":7")); },
                   {"format"});
  expect_sim_error([&] { program_from_json_text(replace(ok, "\"version\":1", "\"version\":18446744073709551615")); },
                   {"version"});
}
