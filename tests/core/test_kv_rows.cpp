// The row kernels of the quantized KV caches (ops/cpu/kernels/kv_rows.h) against naive loops in
// double over the bytes' values: every int8 and every e4m3 byte (NaN included), head sizes with
// and without a vector tail, one to nine query rows per kv head. The path is the machine's best;
// CTest runs the same cases again with TPU_CPU_FEATURES=avx2 and =generic.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ops/cpu/kernels/kv_rows.h"
#include "tpucore/core/float8.h"

namespace {

double byte_value(uint8_t b, bool fp8) {
  if (!fp8) return static_cast<int8_t>(b);
  // e4m3fn from its fields (the OCP spec): S.EEEE.MMM, bias 7, no infinities, S.1111.111 NaN.
  const int e = (b >> 3) & 0xF, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}

// Within f32 accumulation error of a sum whose terms add up to `mag` in absolute value.
bool close(double got, double want, double mag) {
  if (std::isnan(want)) return std::isnan(got);
  return std::fabs(got - want) <= 1e-5 * (1.0 + mag);
}

}  // namespace

TEST_CASE("kv rows: key dots and weighted values over every int8 and e4m3 byte", "[kvrows]") {
  const bool fp8 = GENERATE(false, true);
  const int64_t d = GENERATE(16, 20, 128, 7);
  const int64_t group = GENERATE(1, 3, 4, 5, 9);
  const int64_t rows = 256 / d + 2;  // every byte value appears in some row
  std::mt19937 rng(static_cast<uint32_t>(d * 31 + group));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * d));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 1);
  if (fp8) {  // NaN bytes only in the last row, so the other rows check finite sums
    for (size_t i = 0; i < static_cast<size_t>((rows - 1) * d); ++i)
      if ((bytes[i] & 0x7F) == 0x7F) bytes[i] = static_cast<uint8_t>(bytes[i] ^ 1);
    bytes[static_cast<size_t>((rows - 1) * d)] = 0x7F;
  }
  const int64_t q_stride = d + 3, out_stride = d + 5;
  std::vector<float> q(static_cast<size_t>(group * q_stride));
  for (float& x : q) x = uni(rng);

  // Each byte widened exactly: a one-hot query row picks one element of every finite row.
  for (int64_t e = 0; e < d; ++e) {
    std::vector<float> one(static_cast<size_t>(d), 0.0f), dot1(1);
    one[static_cast<size_t>(e)] = 1.0f;
    for (int64_t r = 0; r < (fp8 ? rows - 1 : rows); ++r) {
      tpu::kernels::kv_key_dots(bytes.data() + r * d, fp8, d, one.data(), d, 1, dot1.data());
      INFO("row " << r << " element " << e << " byte " << int{bytes[static_cast<size_t>(r * d + e)]});
      CHECK(dot1[0] == byte_value(bytes[static_cast<size_t>(r * d + e)], fp8));
    }
  }

  // Key dots, row by row.
  std::vector<float> dots(static_cast<size_t>(group));
  for (int64_t r = 0; r < rows; ++r) {
    tpu::kernels::kv_key_dots(bytes.data() + r * d, fp8, d, q.data(), q_stride, group, dots.data());
    for (int64_t g = 0; g < group; ++g) {
      double want = 0, mag = 0;
      for (int64_t e = 0; e < d; ++e) {
        const double term = q[static_cast<size_t>(g * q_stride + e)] * byte_value(bytes[static_cast<size_t>(r * d + e)], fp8);
        want += term;
        mag += std::fabs(term);
      }
      INFO("row " << r << " head " << g);
      CHECK(close(dots[static_cast<size_t>(g)], want, mag));
    }
  }

  // Weighted values over a subset of the rows, in a given order (the last, NaN row only for e4m3
  // and only in the second pass).
  for (const bool with_last : {false, true}) {
    std::vector<int64_t> pos;
    for (int64_t r = rows - 2; r >= 0; r -= 2) pos.push_back(r);
    if (with_last) pos.push_back(rows - 1);
    const auto count = static_cast<int64_t>(pos.size());
    std::vector<float> w(static_cast<size_t>(count * group));
    for (float& x : w) x = uni(rng);
    std::vector<float> out(static_cast<size_t>(group * out_stride), 7.0f);
    tpu::kernels::kv_weighted_values(bytes.data(), fp8, d, pos.data(), count, w.data(), group, out.data(), out_stride);
    for (int64_t g = 0; g < group; ++g)
      for (int64_t e = 0; e < d; ++e) {
        double want = 0, mag = 0;
        for (int64_t c = 0; c < count; ++c) {
          const double term = w[static_cast<size_t>(c * group + g)] *
                              byte_value(bytes[static_cast<size_t>(pos[static_cast<size_t>(c)] * d + e)], fp8);
          want += term;
          mag += std::fabs(term);
        }
        INFO("head " << g << " element " << e << " with the last row " << with_last);
        CHECK(close(out[static_cast<size_t>(g * out_stride + e)], want, mag));
      }
    for (int64_t g = 0; g < group; ++g)  // nothing written between the rows
      for (int64_t e = d; e < out_stride && g + 1 < group; ++e) CHECK(out[static_cast<size_t>(g * out_stride + e)] == 7.0f);
  }
}

TEST_CASE("kv rows: quantizing a row", "[kvrows]") {
  const bool fp8 = GENERATE(false, true);
  const float qmax = fp8 ? 448.0f : 127.0f;
  std::vector<float> x = {0.5f, -2.0f, 1.25f, 0.0f, 1e-3f, -0.75f, 2.0f / 3.0f};
  std::vector<uint8_t> q(x.size());
  const float s = tpu::kernels::kv_quantize_row(x.data(), static_cast<int64_t>(x.size()), fp8, q.data());
  CHECK(s == 2.0f / qmax);
  for (size_t i = 0; i < x.size(); ++i) {
    // Round trip within half a step of the byte's grid (int8: 1/2 of the scale; e4m3: 1/16 relative).
    const double back = byte_value(q[i], fp8) * s;
    CHECK(std::fabs(back - x[i]) <= (fp8 ? std::fabs(x[i]) / 16 + std::ldexp(s, -10) : s / 2 + 1e-7));
  }
  CHECK(byte_value(q[1], fp8) == -qmax);
  std::vector<float> zero(5, 0.0f);
  CHECK(tpu::kernels::kv_quantize_row(zero.data(), 5, fp8, q.data()) == 1.0f);
  for (int i = 0; i < 5; ++i) CHECK(q[static_cast<size_t>(i)] == 0);
  std::vector<float> bad = {1.0f, NAN, 2.0f};
  CHECK(std::isnan(tpu::kernels::kv_quantize_row(bad.data(), 3, fp8, q.data())));
  bad[1] = INFINITY;
  CHECK(std::isnan(tpu::kernels::kv_quantize_row(bad.data(), 3, fp8, q.data())));
  for (int i = 0; i < 3; ++i) CHECK(q[static_cast<size_t>(i)] == 0);
}
