#include "codegen/precision.h"

#include <atomic>
#include <cstdlib>

#include "tpucore/core/error.h"

namespace tpu {
namespace {

int parse_passes(const std::string& precision, const char* where) {
  if (precision == "default" || precision == "medium") return 1;
  if (precision == "high") return 3;
  if (precision == "highest") return 6;
  fail("{}: unknown precision '{}' (use \"default\" or \"medium\" for one bf16 pass, \"high\" for three, "
       "\"highest\" for six)",
       where, precision);
}

// JAX and PyTorch/XLA on TPU: one bf16 pass by default; TPU_F32_MATMUL_PRECISION sets the start
// value (read on first use; a bad value is an error naming the variable).
std::atomic<int>& passes() {
  static std::atomic<int> p{[] {
    const char* e = std::getenv("TPU_F32_MATMUL_PRECISION");
    return e && *e ? parse_passes(e, "TPU_F32_MATMUL_PRECISION") : 1;
  }()};
  return p;
}

}  // namespace

void set_float32_matmul_precision(const std::string& precision) {
  passes() = parse_passes(precision, "set_float32_matmul_precision");
}

std::string float32_matmul_precision() {
  const int p = passes().load();
  return p == 1 ? "default" : p == 3 ? "high" : "highest";
}

int float32_matmul_passes() { return passes().load(); }

namespace codegen {
sim::MxuMode f32_matmul_mode() {
  const int p = passes().load();
  return p == 1 ? sim::MxuMode::bf16 : p == 3 ? sim::MxuMode::bf16x3 : sim::MxuMode::f32;
}
}  // namespace codegen

}  // namespace tpu
