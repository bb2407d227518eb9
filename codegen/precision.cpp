#include "codegen/precision.h"

#include <atomic>

#include "tpucore/error.h"

namespace tpu {
namespace {
std::atomic<int> g_passes{1};  // JAX and PyTorch/XLA on TPU: one bf16 pass by default
}  // namespace

void set_float32_matmul_precision(const std::string& precision) {
  if (precision == "default" || precision == "medium") g_passes = 1;
  else if (precision == "high") g_passes = 3;
  else if (precision == "highest") g_passes = 6;
  else
    fail("set_float32_matmul_precision: unknown precision '{}' (use \"default\" or \"medium\" for one bf16 pass, "
         "\"high\" for three, \"highest\" for six)",
         precision);
}

std::string float32_matmul_precision() {
  const int p = g_passes.load();
  return p == 1 ? "default" : p == 3 ? "high" : "highest";
}

int float32_matmul_passes() { return g_passes.load(); }

namespace codegen {
sim::MxuMode f32_matmul_mode() {
  const int p = g_passes.load();
  return p == 1 ? sim::MxuMode::bf16 : p == 3 ? sim::MxuMode::bf16x3 : sim::MxuMode::f32;
}
}  // namespace codegen

}  // namespace tpu
