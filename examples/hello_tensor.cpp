#include <fmt/core.h>
#include "tpucore/ops.h"
int main() {
  auto a = tpu::arange(6).reshape({2, 3});
  fmt::print("{}\n{}\n", a, a.t());
  fmt::print("{}\n", tpu::full({2, 2}, 1.5, tpu::DType::bf16));
}
