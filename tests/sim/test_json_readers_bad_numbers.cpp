// Inputs the fuzzers found (tests/fuzz/regressions/): the simulator's JSON readers must turn
// every malformed input into a SimError, including numbers JSON can write but a double or a
// float cannot hold, and top-level fields of the wrong type.
#include <catch2/catch.hpp>

#include "sim/config.h"
#include "sim/error.h"
#include "sim/serialize.h"

using namespace tpu::sim;

namespace {
const char* kVfill =
    R"({"format":"tpusim-program","version":1,"code":[{"op":"vfill","value":VALUE,)"
    R"("dst":{"offset":0,"space":"vmem","dtype":"f32"},"shape":[1,8]}]})";
std::string vfill(const std::string& value) {
  std::string s = kVfill;
  return s.replace(s.find("VALUE"), 5, value);
}
}  // namespace

TEST_CASE("program JSON: numbers too large for a double or a float are SimErrors", "[sim][fuzz]") {
  CHECK_THROWS_AS(program_from_json_text("[1e400]"), SimError);
  CHECK_THROWS_AS(program_from_json_text(vfill("1e400")), SimError);
  // 1e300 fits a double but not an f32 immediate (the cast would be undefined behaviour).
  CHECK_THROWS_WITH(program_from_json_text(vfill("1e300")), Catch::Contains("field 'value'") && Catch::Contains("f32 range"));
  CHECK(program_from_json_text(vfill("-2.5")).code.at(0).fimm == -2.5f);  // in range: read
}

TEST_CASE("program JSON: format and version of the wrong type are SimErrors", "[sim][fuzz]") {
  CHECK_THROWS_WITH(program_from_json_text(R"({"format":1,"version":1,"code":[]})"), Catch::Contains("format"));
  CHECK_THROWS_WITH(program_from_json_text(R"({"format":"tpusim-program","version":"1","code":[]})"),
                    Catch::Contains("version"));
  CHECK_THROWS_WITH(program_from_json_text(R"({"format":"tpusim-program","version":1e300,"code":[]})"),
                    Catch::Contains("version"));
}

TEST_CASE("chip config: a number too large for a double is a SimError", "[sim][fuzz]") {
  CHECK_THROWS_AS(config_from_json_text("[1e400]"), SimError);
  CHECK_THROWS_AS(config_from_json_text(R"({"name":"x","clock_ghz":1e400,"memory":{}})"), SimError);
}
