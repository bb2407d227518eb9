// Uses the installed headers and library: a small computation checked against closed form.
#include <cstdio>

#include "tpucore/ops.h"

int main() {
  // sum_{i<n} i = n(n-1)/2
  const int64_t n = 100;
  tpu::Tensor a = tpu::arange(n).to(tpu::DType::f32);
  tpu::Tensor s = tpu::sum(a);
  const double got = s.item<double>();
  const double want = n * (n - 1) / 2.0;
  bool bad_caught = false;
  try {
    tpu::Device d("gpu:0");
  } catch (const tpu::Error&) {
    bad_caught = true;
  }
  if (got != want || !bad_caught) {
    std::fprintf(stderr, "consumer: FAILED (sum %g, expected %g; bad device caught: %d)\n", got, want, bad_caught);
    return 1;
  }
  std::printf("consumer: installed tpucore works (sum of arange(%lld) = %g)\n", static_cast<long long>(n), got);
  return 0;
}
