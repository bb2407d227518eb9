// tpu::detail::json_int (sim/json_int.h), the integer reader behind every reader of outside
// JSON: the expected values are written out by hand from the JSON text.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>

#include "sim/json_int.h"

using tpu::detail::json_int;
using nlohmann::json;

TEST_CASE("json_int: integers in range are read, everything else gives nothing", "[sim][json]") {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  CHECK(json_int(json::parse("0")) == 0);
  CHECK(json_int(json::parse("-17")) == -17);
  CHECK(json_int(json::parse("9223372036854775807")) == kMax);
  CHECK(json_int(json::parse("-9223372036854775808")) == kMin);
  // Past INT64_MAX: an unsigned JSON integer that get<int64_t>() would wrap to a negative number.
  CHECK_FALSE(json_int(json::parse("9223372036854775808")).has_value());
  CHECK_FALSE(json_int(json::parse("18446744073709551615")).has_value());
  // Floats, even integral ones, and floats past int64 (get<int64_t>() on them is undefined).
  CHECK_FALSE(json_int(json::parse("2.0")).has_value());
  CHECK_FALSE(json_int(json::parse("4.66667e+23")).has_value());
  CHECK_FALSE(json_int(json::parse("-1e300")).has_value());
  CHECK_FALSE(json_int(json::parse("\"7\"")).has_value());
  CHECK_FALSE(json_int(json::parse("null")).has_value());
  CHECK_FALSE(json_int(json::parse("true")).has_value());
  CHECK_FALSE(json_int(json::parse("[1]")).has_value());
  // The bounds are inclusive.
  CHECK(json_int(json::parse("5"), 5, 9) == 5);
  CHECK(json_int(json::parse("9"), 5, 9) == 9);
  CHECK_FALSE(json_int(json::parse("4"), 5, 9).has_value());
  CHECK_FALSE(json_int(json::parse("10"), 5, 9).has_value());
  CHECK(json_int(json::parse("2147483647"), std::numeric_limits<int>::min(), std::numeric_limits<int>::max()) ==
        std::numeric_limits<int>::max());
  CHECK_FALSE(json_int(json::parse("2147483648"), std::numeric_limits<int>::min(), std::numeric_limits<int>::max()).has_value());
  CHECK_FALSE(json_int(json::parse("18446744073709551615"), 0).has_value());
}
