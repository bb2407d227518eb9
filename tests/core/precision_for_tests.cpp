// The codegen and model tests check lowerings against f32 references, so this test binary runs
// f32 matmuls on sim devices at "highest" precision (f32-accurate products). The library's own
// default (one bf16 pass) is recorded first for the precision tests, which set each mode
// themselves (test_codegen_precision.cpp).
#include <string>

#include "codegen/precision.h"

namespace tpu::testing {
extern const std::string kInitialF32MatmulPrecision;
const std::string kInitialF32MatmulPrecision = [] {
  std::string p = float32_matmul_precision();
  set_float32_matmul_precision("highest");
  return p;
}();
}  // namespace tpu::testing
