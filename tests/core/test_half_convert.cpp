// f16 <-> f32 runs (ops/cpu/kernels/half_convert.h) against tpu::f16's scalar conversions, on
// every f16 bit pattern and on f32 values at the rounding boundaries, every path this CPU has.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ops/cpu/kernels/half_convert.h"
#include "tpucore/core/cpu_features.h"

namespace {

bool have_f16c() { return tpu::cpu_features().avx2; }  // every AVX2 CPU has F16C

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

TEST_CASE("half runs: f16 to f32 and back, bit for bit the scalar conversions", "[gemm][half]") {
  // Every f16 pattern, in a run whose length leaves a ragged tail.
  std::vector<uint16_t> h(65536 + 5);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i);
  // f32 inputs: the exact f16 values, the midpoints between neighbours (ties to even), one ulp
  // either side of them, overflow, tiny values, NaNs with payloads.
  std::vector<float> f;
  for (uint32_t b = 0; b < 0x7c00; ++b) {
    const float lo = tpu::f16::from_bits(static_cast<uint16_t>(b)).to_f32();
    const float hi = tpu::f16::from_bits(static_cast<uint16_t>(b + 1)).to_f32();
    const float mid = lo + (hi - lo) / 2;
    uint32_t m = bits_of(mid);
    float below, above;
    uint32_t mb = m - 1, ma = m + 1;
    std::memcpy(&below, &mb, 4);
    std::memcpy(&above, &ma, 4);
    for (float v : {lo, mid, below, above}) {
      f.push_back(v);
      f.push_back(-v);
    }
  }
  for (uint32_t u : {0x7f800000u, 0xff800000u, 0x7fc00001u, 0xff812345u, 0x7f800001u, 0x477ff000u, 0x477fefffu,
                     0x00000001u, 0x80000001u, 0x33000000u, 0x33000001u})
    f.push_back([&] {
      float v;
      std::memcpy(&v, &u, 4);
      return v;
    }());
  for (int path = 0; path < 2; ++path) {
    if (path == 1 && !have_f16c()) continue;
    std::vector<float> w(h.size());
    if (path == 0) tpu::kernels::f16_to_f32(h.data(), w.data(), static_cast<int64_t>(h.size()));
    else tpu::kernels::f16_to_f32_f16c(h.data(), w.data(), static_cast<int64_t>(h.size()));
    for (size_t i = 0; i < h.size(); ++i) {
      INFO("path " << path << " f16 bits " << h[i]);
      REQUIRE(bits_of(w[i]) == bits_of(tpu::f16::from_bits(h[i]).to_f32()));
    }
    std::vector<uint16_t> n(f.size());
    if (path == 0) tpu::kernels::f32_to_f16(f.data(), n.data(), static_cast<int64_t>(f.size()));
    else tpu::kernels::f32_to_f16_f16c(f.data(), n.data(), static_cast<int64_t>(f.size()));
    for (size_t i = 0; i < f.size(); ++i) {
      INFO("path " << path << " f32 bits " << bits_of(f[i]));
      REQUIRE(n[i] == tpu::f16::from_f32(f[i]));
    }
  }
}
