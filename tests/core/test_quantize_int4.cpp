// Packed int4 weights (tpucore/quantize.h): the quantizer by the properties that define it and
// hand-made packed bytes; the product on every kernel path of the CPU (few rows and the many-row
// path) against a naive double-precision loop over the weight dequantized here, independently
// of the library's unpacking (on the vnni path with the rows of x quantized in blocks of 32 as
// that path does, quant_act_ref.h).
#include <array>
#include <cmath>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/gemv_int4.h"
#include "ops/int4_repack.h"
#include "opinfo.h"
#include "quant_act_ref.h"
#include "tpucore/core/batch_invariant.h"
#include "tpucore/core/parallel.h"
#include "testing.h"
#include "tpucore/compile.h"
#include "tpucore/nn/quantized.h"
#include "tpucore/quantize.h"

namespace tpu::testing {
namespace {

const OpInfoRegistrar reg_q4("quantize_int4", "tests/core/test_quantize_int4.cpp");
const OpInfoRegistrar reg_dq4("dequantize_int4", "tests/core/test_quantize_int4.cpp");
const OpInfoRegistrar reg_lin4("linear_int4", "tests/core/test_quantize_int4.cpp");

std::vector<float> q4_random(Generator& g, size_t n, double lo, double hi) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(lo + (hi - lo) * g.next_double());
  return v;
}

// The signed value of weight k of a packed row, read from the documented layout.
int q4_value(const std::vector<uint8_t>& q, int64_t row_bytes, int64_t j, int64_t k) {
  const int64_t block = k / 32, in = k % 32;
  const uint8_t b = q[static_cast<size_t>(j * row_bytes + block * 16 + in % 16)];
  return (in < 16 ? b & 0xF : b >> 4) - 8;
}

TEST_CASE("quantize_int4: the documented packing of hand-made rows, zero groups, errors", "[quant]") {
  // One row of 64: group 0 has max 7 (scale 1), group 1 is zeros (scale 1, nibbles 8).
  std::vector<float> w(64, 0.0f);
  w[0] = 7;
  w[1] = -7;
  w[16] = 2.5f;   // 2 (ties to even), in the high nibble of byte 0
  w[17] = -3.4f;  // -3
  w[31] = 0.5f;   // 0 (ties to even)
  const Int4Weight q = quantize_int4(from_vector(w, {1, 64}), 32);
  REQUIRE(q.q.shape() == Shape{1, 32});
  CHECK(q.q.dtype() == DType::u8);
  CHECK(q.group == 32);
  CHECK(q.scale.to_vector<float>() == std::vector<float>{1, 1});
  const std::vector<uint8_t> b = q.q.to_vector<uint8_t>();
  CHECK(b[0] == ((2 + 8) << 4 | (7 + 8)));
  CHECK(b[1] == ((-3 + 8) << 4 | (-7 + 8)));
  CHECK(b[15] == (8 << 4 | 8));
  CHECK(b[16] == 0x88);
  const std::vector<float> d = dequantize_int4(q.q, q.scale).to_vector<float>();
  CHECK(d[0] == 7);
  CHECK(d[16] == 2);
  CHECK(d[17] == -3);
  CHECK(d[31] == 0);

  CHECK_THROWS_WITH(quantize_int4(from_vector(std::vector<float>(48, 1.0f), {1, 48}), 32), Catch::Contains("multiple"));
  CHECK_THROWS_WITH(quantize_int4(from_vector(std::vector<float>(64, 1.0f), {1, 64}), 64), Catch::Contains("group size"));
  std::vector<float> bad(64, 1.0f);
  bad[40] = NAN;
  CHECK_THROWS_WITH(quantize_int4(from_vector(bad, {1, 64})).scale.to_vector<float>(), Catch::Contains("non-finite"));
}

TEST_CASE("quantize_int4: every element within half a step of its group's scale", "[quant]") {
  Generator g(21);
  for (int64_t group : {32, 128}) {
    const int64_t N = 9, K = 256, G = K / group;
    const std::vector<float> wv = q4_random(g, static_cast<size_t>(N * K), -2, 2);
    const Int4Weight q = quantize_int4(from_vector(wv, {N, K}), group);
    const std::vector<uint8_t> qv = q.q.to_vector<uint8_t>();
    const std::vector<float> sv = q.scale.to_vector<float>();
    int bad = 0;
    for (int64_t j = 0; j < N; ++j)
      for (int64_t gi = 0; gi < G; ++gi) {
        double amax = 0;
        for (int64_t k = gi * group; k < (gi + 1) * group; ++k)
          amax = std::max(amax, std::fabs(static_cast<double>(wv[static_cast<size_t>(j * K + k)])));
        const double s = sv[static_cast<size_t>(j * G + gi)];
        bad += std::fabs(s - amax / 7) > 1e-6 * s;
        bool has_max = false;
        for (int64_t k = gi * group; k < (gi + 1) * group; ++k) {
          const int v = q4_value(qv, K / 2, j, k);
          bad += v < -7 || v > 7;
          bad += std::fabs(wv[static_cast<size_t>(j * K + k)] - v * s) > 0.5 * s * (1 + 1e-5);
          has_max |= std::abs(v) == 7;
        }
        bad += !has_max;
      }
    INFO("group " << group);
    CHECK(bad == 0);
  }
}

TEST_CASE("linear_int4: every kernel path against the dequantized naive product", "[quant][gemv]") {
  using kernels::Int8GemvPath;
  Generator g(7);
  int checked = 0;
  for (Int8GemvPath path :
       {Int8GemvPath::best, Int8GemvPath::vnni, Int8GemvPath::avx2q8, Int8GemvPath::avx512, Int8GemvPath::avx2,
        Int8GemvPath::scalar}) {
    if (!kernels::int8_gemv_path_available(path)) continue;
    for (int64_t M : {1, 3, 4, 5, 17})
      for (int64_t N : {1, 4, 7})
        // K past whole chunks of 128 by 1-3 blocks of 32 (the vnni kernel's tail), groups of
        // one block, two, four or more (its three ways of reading the scales).
        for (auto [K, group] : {std::pair<int64_t, int64_t>{32, 32}, {96, 32}, {128, 128}, {256, 128}, {288, 96},
                                {160, 32}, {224, 32}, {192, 64}, {512, 256}}) {
          const std::vector<float> x = q4_random(g, static_cast<size_t>(M * K), -2, 2);
          std::vector<uint8_t> q(static_cast<size_t>(N * K / 2));
          for (uint8_t& v : q) v = static_cast<uint8_t>(g.next_u64() & 0xFF);  // nibble 0 (-8) included
          const std::vector<float> s = q4_random(g, static_cast<size_t>(N * K / group), 0.001, 0.05);
          std::vector<float> out(static_cast<size_t>(M * N), -1);
          kernels::gemv_int4(M, N, K, group, x.data(), K, q.data(), s.data(), out.data(), N, path);
          const std::vector<float> xs = int4_rows_as_seen(x, M, K, path);
          int bad = 0;
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double acc = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double w = q4_value(q, K / 2, j, k) * static_cast<double>(s[static_cast<size_t>(j * (K / group) + k / group)]);
                acc += xs[static_cast<size_t>(i * K + k)] * w;
                mag += std::fabs(xs[static_cast<size_t>(i * K + k)] * w);
              }
              bad += std::fabs(out[static_cast<size_t>(i * N + j)] - acc) > 2e-6 * mag + 1e-30;
            }
          INFO("path " << static_cast<int>(path) << " M " << M << " N " << N << " K " << K << " group " << group);
          CHECK(bad == 0);
          ++checked;
        }
  }
  CHECK(checked >= 2 * 5 * 3 * 4);  // best and scalar always run

  // Batch-invariant mode: 20 rows (past the many-row threshold) give each row's one-row result.
  BatchInvariantScope inv;
  const int64_t M = 20, N = 6, K = 64, group = 32;
  const std::vector<float> x = q4_random(g, static_cast<size_t>(M * K), -1, 1);
  std::vector<uint8_t> q(static_cast<size_t>(N * K / 2));
  for (uint8_t& v : q) v = static_cast<uint8_t>(g.next_u64() & 0xFF);
  const std::vector<float> s = q4_random(g, static_cast<size_t>(N * K / group), 0.01, 0.02);
  std::vector<float> all(static_cast<size_t>(M * N)), one(static_cast<size_t>(N));
  kernels::gemv_int4(M, N, K, group, x.data(), K, q.data(), s.data(), all.data(), N);
  int differ = 0;
  for (int64_t i = 0; i < M; ++i) {
    kernels::gemv_int4(1, N, K, group, x.data() + i * K, K, q.data(), s.data(), one.data(), N);
    for (int64_t j = 0; j < N; ++j) differ += all[static_cast<size_t>(i * N + j)] != one[static_cast<size_t>(j)];
  }
  CHECK(differ == 0);
}

TEST_CASE("linear_int4: many weight rows split over the threads with a short last block", "[quant][gemv]") {
  // Enough weight rows that the blocks of four go to the pool threads in runs, each block
  // prefetching one further on in its run; N not a multiple of 4, K with and without a tail of
  // blocks past whole chunks of 128.
  Generator g(11);
  for (auto [M, N, K, group] : {std::array<int64_t, 4>{1, 2051, 64, 32}, {2, 1031, 256, 128}, {1, 1027, 800, 32},
                                {1, 998, 768, 32}}) {
    const std::vector<float> x = q4_random(g, static_cast<size_t>(M * K), -2, 2);
    std::vector<uint8_t> q(static_cast<size_t>(N * K / 2));
    for (uint8_t& v : q) v = static_cast<uint8_t>(g.next_u64() & 0xFF);
    const std::vector<float> s = q4_random(g, static_cast<size_t>(N * K / group), 0.001, 0.05);
    std::vector<float> out(static_cast<size_t>(M * N), -1);
    kernels::gemv_int4(M, N, K, group, x.data(), K, q.data(), s.data(), out.data(), N);
    const std::vector<float> xs = int4_rows_as_seen(x, M, K, kernels::Int8GemvPath::best);
    int bad = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double w = q4_value(q, K / 2, j, k) * static_cast<double>(s[static_cast<size_t>(j * (K / group) + k / group)]);
          acc += xs[static_cast<size_t>(i * K + k)] * w;
          mag += std::fabs(xs[static_cast<size_t>(i * K + k)] * w);
        }
        bad += std::fabs(out[static_cast<size_t>(i * N + j)] - acc) > 2e-6 * mag + 1e-30;
      }
    INFO("M " << M << " N " << N << " K " << K << " group " << group << " path " << kernels::int8_gemv_best_path());
    CHECK(bad == 0);
  }
}

TEST_CASE("linear_int4: the op on batched f32 and bf16 inputs, and its errors", "[quant]") {
  Generator g(13);
  const int64_t N = 5, K = 64;
  const Tensor w = from_vector(q4_random(g, static_cast<size_t>(N * K), -1, 1), {N, K});
  const Int4Weight qw = quantize_int4(w, 32);
  const std::vector<float> xv = q4_random(g, static_cast<size_t>(2 * 3 * K), -1, 1);
  const Tensor x = from_vector(xv, {2, 3, K});
  const std::vector<float> wd = dequantize_int4(qw.q, qw.scale).to_vector<float>();
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor xd = x.to(dt);
    const Tensor y = linear_int4(xd, qw);
    REQUIRE(y.shape() == Shape{2, 3, N});
    CHECK(y.dtype() == dt);
    const std::vector<float> xs = int4_rows_as_seen(xd.to_vector<float>(), 6, K), got = y.to_vector<float>();
    int bad = 0;
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = static_cast<double>(xs[static_cast<size_t>(i * K + k)]) * wd[static_cast<size_t>(j * K + k)];
          acc += p;
          mag += std::fabs(p);
        }
        const double tol = (dt == DType::f32 ? 0 : std::fabs(acc) * 0x1p-8) + 2e-6 * mag;
        bad += std::fabs(got[static_cast<size_t>(i * N + j)] - acc) > tol;
      }
    INFO(dtype_name(dt));
    CHECK(bad == 0);
  }
  CHECK_THROWS_WITH(linear_int4(from_vector(std::vector<float>(5, 1.0f), {1, 5}), qw), Catch::Contains("in_features"));
  CHECK_THROWS_WITH(linear_int4(x, w, qw.scale), Catch::Contains("packed int4"));
  CHECK_THROWS_WITH(linear_int4(x, qw.q, qw.scale.slice(0, 0, 3)), Catch::Contains("scales"));
}


// ---- f16 group scales (the Q4_0 byte budget) ----

TEST_CASE("quantize_int4 with f16 scales: the rounded scale, and the weights rounded against it", "[quant]") {
  Generator g(31);
  for (int64_t group : {32, 128}) {
    const int64_t N = 5, K = 256, G = K / group;
    const std::vector<float> wv = q4_random(g, static_cast<size_t>(N * K), -3, 3);
    const Int4Weight q = quantize_int4(from_vector(wv, {N, K}), group, DType::f16);
    REQUIRE(q.scale.dtype() == DType::f16);
    REQUIRE(q.scale.shape() == Shape{N, G});
    const std::vector<uint8_t> qv = q.q.to_vector<uint8_t>();
    const std::vector<float> sv = q.scale.to_vector<float>();  // f16 widened exactly
    int bad = 0;
    for (int64_t j = 0; j < N; ++j)
      for (int64_t gi = 0; gi < G; ++gi) {
        float amax = 0;
        for (int64_t k = gi * group; k < (gi + 1) * group; ++k) amax = std::max(amax, std::fabs(wv[static_cast<size_t>(j * K + k)]));
        // The nearest f16 of max |w| / 7, by brute force over the f16 bit patterns near it.
        const double want = static_cast<double>(amax / 7.0f);
        double best = 0;
        for (uint32_t bits = 0; bits < 0x7c00; ++bits) {
          const double v = static_cast<double>(f16::from_bits(static_cast<uint16_t>(bits)).to_f32());
          if (std::fabs(v - want) < std::fabs(best - want)) best = v;
        }
        const double s = sv[static_cast<size_t>(j * G + gi)];
        bad += s != best;
        for (int64_t k = gi * group; k < (gi + 1) * group; ++k) {
          const double r = std::clamp(std::nearbyint(wv[static_cast<size_t>(j * K + k)] / s), -7.0, 7.0);
          bad += q4_value(qv, K / 2, j, k) != static_cast<int>(r);
        }
      }
    INFO("group " << group);
    CHECK(bad == 0);
  }
  // A scale beyond f16's range is an error naming it; f32 scales still take it.
  const Tensor big = from_vector(std::vector<float>(32, 1e6f), {1, 32});
  CHECK_THROWS_WITH(quantize_int4(big, 32, DType::f16), Catch::Contains("f16"));
  CHECK(quantize_int4(big, 32).scale.dtype() == DType::f32);
  CHECK_THROWS_WITH(quantize_int4(big, 32, DType::bf16), Catch::Contains("scale dtype"));
}

// The naive product of x (as the path sees it) and the weight dequantized here from its bytes
// and its f16 scales (widened exactly).
int q4_f16_mismatches(const std::vector<float>& xs, const std::vector<uint8_t>& q, const std::vector<f16>& s,
                      int64_t M, int64_t N, int64_t K, int64_t group, const std::vector<float>& out) {
  int bad = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double w = q4_value(q, K / 2, j, k) * static_cast<double>(s[static_cast<size_t>(j * (K / group) + k / group)].to_f32());
        acc += xs[static_cast<size_t>(i * K + k)] * w;
        mag += std::fabs(xs[static_cast<size_t>(i * K + k)] * w);
      }
      bad += !(std::fabs(out[static_cast<size_t>(i * N + j)] - acc) <= 2e-6 * mag + 1e-30);
    }
  return bad;
}

TEST_CASE("linear_int4 with f16 scales: every cpu kernel against the dequantized naive product", "[quant][gemv]") {
  using kernels::Int8GemvPath;
  Generator g(37);
  const int saved = num_threads();
  int checked = 0;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    // N not a multiple of 4 or 16 (short last blocks and panels), K past whole chunks of 128.
    for (auto [N, K, group] : {std::array<int64_t, 3>{7, 160, 32}, {18, 256, 128}, {5, 96, 32}, {21, 192, 64}})
      for (int64_t M : {1, 3, 16, 64}) {
        const std::vector<float> x = q4_random(g, static_cast<size_t>(M * K), -2, 2);
        std::vector<uint8_t> q(static_cast<size_t>(N * K / 2));
        for (uint8_t& v : q) v = static_cast<uint8_t>(g.next_u64() & 0xFF);
        std::vector<f16> s(static_cast<size_t>(N * K / group));
        for (f16& v : s) v = f16(static_cast<float>(0.001 + 0.05 * g.next_double()));
        std::vector<float> out(static_cast<size_t>(M * N));
        INFO("threads " << threads << " M " << M << " N " << N << " K " << K << " group " << group);
        for (Int8GemvPath path :
             {Int8GemvPath::best, Int8GemvPath::vnni, Int8GemvPath::avx2q8, Int8GemvPath::avx512, Int8GemvPath::avx2,
        Int8GemvPath::scalar}) {
          if (!kernels::int8_gemv_path_available(path)) continue;
          std::fill(out.begin(), out.end(), -1.0f);
          kernels::gemv_int4(M, N, K, group, x.data(), K, q.data(), s.data(), out.data(), N, path);
          INFO("path " << static_cast<int>(path));
          CHECK(q4_f16_mismatches(int4_rows_as_seen(x, M, K, path), q, s, M, N, K, group, out) == 0);
          ++checked;
        }
        // The many-row kernels (the quantized rows as the vnni path sees them).
        const std::vector<float> xq = blockwise_q8_rows(x, M, K);
        std::fill(out.begin(), out.end(), -1.0f);
        if (kernels::gemm_int4_vnni(M, N, K, group, x.data(), K, q.data(), s.data(), out.data(), N)) {
          INFO("gemm_int4_vnni");
          CHECK(q4_f16_mismatches(xq, q, s, M, N, K, group, out) == 0);
          ++checked;
        }
        std::fill(out.begin(), out.end(), -1.0f);
        if (kernels::gemm_int4_amx(M, N, K, group, x.data(), K, q.data(), s.data(), out.data(), N)) {
          INFO("gemm_int4_amx");
          CHECK(q4_f16_mismatches(xq, q, s, M, N, K, group, out) == 0);
          ++checked;
        }
      }
  }
  set_num_threads(saved);
  CHECK(checked >= 2 * 4 * 4 * 2);
}

TEST_CASE("linear_int4 with f16 scales: the op, dequantize_int4 and the model quantizer", "[quant]") {
  Generator g(41);
  const int64_t N = 19, K = 128;
  const Tensor w = from_vector(q4_random(g, static_cast<size_t>(N * K), -1, 1), {N, K});
  const Int4Weight qw = quantize_int4(w, 32, DType::f16);
  const std::vector<uint8_t> qv = qw.q.to_vector<uint8_t>();
  std::vector<f16> sv;
  for (float v : qw.scale.to_vector<float>()) sv.push_back(f16(v));  // exact: the values are f16
  // dequantize_int4 reads the f16 scales.
  const std::vector<float> wd = dequantize_int4(qw.q, qw.scale).to_vector<float>();
  int bad = 0;
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k)
      bad += wd[static_cast<size_t>(j * K + k)] != q4_value(qv, K / 2, j, k) * sv[static_cast<size_t>(j * 4 + k / 32)].to_f32();
  CHECK(bad == 0);
  for (int64_t M : {1, 3, 16, 64}) {
    const std::vector<float> x = q4_random(g, static_cast<size_t>(M * K), -1, 1);
    const std::vector<float> y = linear_int4(from_vector(x, {M, K}), qw).to_vector<float>();
    INFO("M " << M);
    CHECK(q4_f16_mismatches(int4_rows_as_seen(x, M, K), qv, sv, M, N, K, 32, y) == 0);
  }
  // bf16 scales are widened to f32 first (exactly), so they give the same product. (Bit for bit
  // on one kernel: the cache of repacked weights is off here, as it may hold one of the two
  // calls' weight and not the other's, whose scales are copies of the call's own.)
  const Tensor x1 = from_vector(q4_random(g, static_cast<size_t>(K), -1, 1), {1, K});
  const Tensor sb = qw.scale.to(DType::bf16);
  ops::set_int4_repack_cap_mb(0);
  const std::vector<float> yb = linear_int4(x1, qw.q, sb).to_vector<float>();
  const std::vector<float> yf = linear_int4(x1, qw.q, sb.to(DType::f32)).to_vector<float>();
  ops::set_int4_repack_cap_mb(-1);
  CHECK(yb == yf);
  // A compiled function gives the eager values.
  const Tensor x4 = from_vector(q4_random(g, static_cast<size_t>(4 * K), -1, 1), {4, K});
  auto f = tpu::compile([&](const Tensor& x) { return linear_int4(x, qw.q, qw.scale); });
  (void)f(x4);
  CHECK(f(x4).to_vector<float>() == linear_int4(x4, qw).to_vector<float>());
  // The model quantizer keeps f16 scales, and its state round-trips them.
  nn::Linear lin(K, N, false);
  nn::QuantizedLinear ql(lin, nn::WeightQuant::int4, 32);
  CHECK(ql.weight_scale.dtype() == DType::f16);
  nn::Linear lin2(K, N, false);
  nn::QuantizedLinear ql2(lin2, nn::WeightQuant::int4, 32);
  ql2.load_state_dict(ql.state_dict());
  CHECK(ql2.weight_scale.dtype() == DType::f16);
  CHECK(ql2.forward(x4).to_vector<float>() == ql.forward(x4).to_vector<float>());
  // A state saved with f32 scales (not f16-representable) loads as f32: its weights are kept, not
  // rounded to the module's f16 format.
  const Int4Weight w32 = quantize_int4(from_vector(q4_random(g, static_cast<size_t>(N * K), -1, 1), {N, K}), 32);
  const std::vector<float> s32 = w32.scale.to_vector<float>();
  bool f16_exact = true;
  for (const float v : s32) f16_exact = f16_exact && static_cast<float>(f16(v)) == v;
  REQUIRE_FALSE(f16_exact);
  nn::StateDict sd = ql.state_dict();
  sd["weight"] = w32.q;
  sd["weight_scale"] = w32.scale;
  ql2.load_state_dict(sd);
  CHECK(ql2.weight_scale.dtype() == DType::f32);
  CHECK(ql2.weight_scale.to_vector<float>() == s32);
  CHECK(ql2.forward(x4).to_vector<float>() == linear_int4(x4, w32).to_vector<float>());
}

}  // namespace
}  // namespace tpu::testing
