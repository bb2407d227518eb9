// Environment settings with invalid values: the parser behind every
// integer setting and the TPU_LOG check report the variable, the value and what is accepted.
#include "testing.h"
#include "tpucore/core/env.h"
#include "tpucore/core/log.h"

namespace tpu::testing {

TEST_CASE("hardening: integer settings with invalid values name the variable and the range (item 12)",
          "[hardening]") {
  // The parser used for TPU_NUM_THREADS, TPU_HOST_CACHE_MB and TPU_SIM_PROGRAM_CACHE.
  auto bad = [](const char* name, const char* value, int64_t lo, int64_t hi, std::vector<std::string> parts) {
    const EnvInt r = parse_env_int(name, value, lo, hi);
    INFO(name << "=" << value << ": " << r.problem);
    CHECK(!r.value);
    for (const auto& p : parts) CHECK(r.problem.find(p) != std::string::npos);
  };
  bad("TPU_NUM_THREADS", "-3", 1, 4096, {"TPU_NUM_THREADS", "'-3'", "1", "4096"});
  bad("TPU_NUM_THREADS", "four", 1, 4096, {"TPU_NUM_THREADS", "'four'"});
  bad("TPU_NUM_THREADS", "8x", 1, 4096, {"'8x'"});
  bad("TPU_HOST_CACHE_MB", "-5", 0, int64_t{1} << 40, {"TPU_HOST_CACHE_MB", "'-5'", "0"});
  bad("TPU_HOST_CACHE_MB", "99999999999999999999", 0, int64_t{1} << 40, {"TPU_HOST_CACHE_MB"});
  CHECK(parse_env_int("TPU_NUM_THREADS", "3", 1, 4096).value == 3);
  CHECK(parse_env_int("TPU_HOST_CACHE_MB", "0", 0, 100).value == 0);
  CHECK(parse_env_int("TPU_HOST_CACHE_MB", " 7 ", 0, 100).value == 7);
  // TPU_LOG: an unknown level is reported with the accepted names.
  const std::string p = log_level_problem("loud");
  CHECK(p.find("TPU_LOG") != std::string::npos);
  CHECK(p.find("'loud'") != std::string::npos);
  CHECK(p.find("warn") != std::string::npos);
  CHECK(log_level_problem("debug").empty());
  CHECK(log_level_problem("warning").empty());
}

}  // namespace tpu::testing
