// Shared by tpu-plan's test files: the text of a file under tools/tpu-plan/testdata.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace tpu::plan_testing {
inline std::string read_testdata(const std::string& name) {
  std::ifstream f(std::string(TPU_PLAN_TESTDATA) + "/" + name);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace tpu::plan_testing
