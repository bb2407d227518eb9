// The codegen and model tests check lowerings against f32 references, so this test binary runs
// f32 matmuls on sim devices at "highest" precision (f32-accurate products) unless
// TPU_F32_MATMUL_PRECISION says otherwise (for measuring at another setting). The library's own
// default (one bf16 pass) is recorded first for the precision tests, which set each mode
// themselves (test_codegen_precision.cpp).
#include <cstdlib>
#include <string>

#include "codegen/precision.h"

namespace tpu::testing {
extern const std::string kInitialF32MatmulPrecision;
const std::string kInitialF32MatmulPrecision = [] {
  std::string p = float32_matmul_precision();
  if (!std::getenv("TPU_F32_MATMUL_PRECISION")) set_float32_matmul_precision("highest");
  return p;
}();
}  // namespace tpu::testing
