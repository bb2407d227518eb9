#include <catch2/catch.hpp>

#include <cmath>

#include "sim/builder.h"
#include "sim/error.h"
#include "sim/programs.h"
#include "sim_test_util.h"

using namespace tpu::sim;
using namespace simtest;
using B = ProgramBuilder;

namespace {

// Naive reference: C = round?(A) * round?(B) accumulated in double.
std::vector<double> ref_gemm(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t n, int64_t k,
                             bool round) {
  std::vector<double> c(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        float x = a[size_t(i * k + p)], y = b[size_t(p * n + j)];
        if (round) x = round_to_bf16(x), y = round_to_bf16(y);
        s += double(x) * double(y);
      }
      c[size_t(i * n + j)] = s;
    }
  return c;
}

}  // namespace

TEST_CASE("bf16 conversion rounds to nearest even", "[sim][numerics]") {
  CHECK(f32_to_bf16_bits(1.0f) == 0x3f80);
  // 1 + 2^-8 is exactly half way between 1 and 1 + 2^-7: ties to even (1.0).
  CHECK(round_to_bf16(1.0f + 1.0f / 256) == 1.0f);
  CHECK(round_to_bf16(1.0f + 3.0f / 256) == 1.0f + 4.0f / 256);
  CHECK(std::isnan(round_to_bf16(NAN)));
  CHECK(round_to_bf16(INFINITY) == INFINITY);
}

TEST_CASE("strided 3-D DMA moves the right bytes", "[sim][dma]") {
  Chip chip = tiny();
  std::vector<uint8_t> src(4096);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 7 + 3);
  put(chip, Space::hbm, 0, src);
  B b;
  // 2 planes x 3 rows x 5 bytes; src rows 16 apart, planes 100 apart; dst dense.
  b.dma(B::vmem_at(B::at(8)), B::hbm_at(B::at(10)),
        {.planes = 2, .rows = 3, .row_bytes = 5, .src_plane_stride = 100, .src_row_stride = 16}, 0, 0);
  b.wait(0);
  // And back out to HBM, rows 32 apart.
  b.dma(B::hbm_at(B::at(2048)), B::vmem_at(B::at(8)), {.rows = 6, .row_bytes = 5, .dst_row_stride = 32}, 1, 1);
  b.wait(1);
  chip.run(b.finish());
  auto v = get<uint8_t>(chip, Space::vmem, 8, 30);
  auto h = get<uint8_t>(chip, Space::hbm, 2048, 6 * 32);
  for (int p = 0; p < 2; ++p)
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 5; ++c) {
        uint8_t want = src[size_t(10 + p * 100 + r * 16 + c)];
        CHECK(v[size_t(p * 15 + r * 5 + c)] == want);
        CHECK(h[size_t((p * 3 + r) * 32 + c)] == want);
      }
}

TEST_CASE("MXU matmul: bf16 rounding of f32 inputs, f32 accumulation, accumulate flag", "[sim][mxu]") {
  Chip chip = tiny();
  const int64_t m = 5, k = 8, n = 6;
  auto a = random_floats(size_t(m * k), 1);
  auto w = random_floats(size_t(k * n), 2);
  put(chip, Space::vmem, 0, a);       // lhs f32 (rounded to bf16 by the MXU)
  put(chip, Space::vmem, 1024, to_bf16(w));  // weights stored bf16
  std::vector<float> c0(size_t(m * 8), 0.5f);
  put(chip, Space::vmem, 4096, c0);
  B b;
  b.mxu_load_weights(0, B::vmem(B::at(1024), DType::bf16), k, n);
  b.mxu_matmul(0, B::vmem(B::at(4096), DType::f32, 8), B::vmem(B::at(0), DType::f32), m, k, n, true);
  chip.run(b.finish());
  auto c = get<float>(chip, Space::vmem, 4096, size_t(m * 8));
  auto ref = ref_gemm(a, w, m, n, k, true);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) CHECK(c[size_t(i * 8 + j)] == Approx(ref[size_t(i * n + j)] + 0.5).epsilon(1e-5));
    CHECK(c[size_t(i * 8 + 6)] == 0.5f);  // untouched padding
  }
}

TEST_CASE("MXU f32 and int8 modes", "[sim][mxu]") {
  Chip chip = tiny();
  const int64_t m = 4, k = 8, n = 8;
  auto a = random_floats(size_t(m * k), 3);
  auto w = random_floats(size_t(k * n), 4);
  put(chip, Space::vmem, 0, a);
  put(chip, Space::vmem, 1024, w);
  std::vector<int8_t> ai(size_t(m * k)), wi(size_t(k * n));
  for (size_t i = 0; i < ai.size(); ++i) ai[i] = int8_t(int(i * 37) % 256 - 128);
  for (size_t i = 0; i < wi.size(); ++i) wi[i] = int8_t(int(i * 91 + 5) % 256 - 128);
  put(chip, Space::vmem, 2048, ai);
  put(chip, Space::vmem, 3072, wi);
  B b;
  b.mxu_load_weights(0, B::vmem(B::at(1024), DType::f32), k, n, MxuMode::f32);
  b.mxu_matmul(0, B::vmem(B::at(4096), DType::f32), B::vmem(B::at(0), DType::f32), m, k, n, false, MxuMode::f32);
  b.mxu_load_weights(1, B::vmem(B::at(3072), DType::i8), k, n, MxuMode::i8);
  b.mxu_matmul(1, B::vmem(B::at(8192), DType::i32), B::vmem(B::at(2048), DType::i8), m, k, n, false, MxuMode::i8);
  b.mxu_matmul(1, B::vmem(B::at(8192), DType::i32), B::vmem(B::at(2048), DType::i8), m, k, n, true, MxuMode::i8);
  chip.run(b.finish());
  auto c = get<float>(chip, Space::vmem, 4096, size_t(m * n));
  auto ref = ref_gemm(a, w, m, n, k, false);
  for (size_t i = 0; i < c.size(); ++i) CHECK(c[i] == Approx(ref[i]).epsilon(1e-5).margin(1e-6));
  auto ci = get<int32_t>(chip, Space::vmem, 8192, size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      int32_t s = 0;
      for (int64_t p = 0; p < k; ++p) s += int32_t(ai[size_t(i * k + p)]) * int32_t(wi[size_t(p * n + j)]);
      CHECK(ci[size_t(i * n + j)] == 2 * s);
    }
}

// The e4m3 value nearest v by search over every finite e4m3 value (bits 0..0x7e and their
// negatives); on a tie the one with an even bit pattern; beyond 448 saturated.
static float e4m3_nearest_by_search(float v) {
  if (std::fabs(v) >= 448.0f) return std::copysign(448.0f, v);
  float best = 0;
  int best_bits = 0;
  double best_d = 1e30;
  for (int bits = 0; bits < 0x7f; ++bits) {
    const int e = bits >> 3, mt = bits & 7;
    const double mag = e == 0 ? mt / 8.0 * std::ldexp(1.0, -6) : (1 + mt / 8.0) * std::ldexp(1.0, e - 7);
    const double d = std::fabs(std::fabs(double(v)) - mag);
    if (d < best_d || (d == best_d && (bits & 1) == 0)) best_d = d, best = float(mag), best_bits = bits;
  }
  (void)best_bits;
  return std::copysign(best, v);
}

TEST_CASE("MXU fp8 mode: e4m3 weights, float lhs rounded to e4m3, i8 mode with float lhs into f32", "[sim][mxu]") {
  ChipConfig cfg = preset_config("tiny");
  cfg.mxu.fp8_cycles_per_row = 0.5;
  Chip chip(cfg);
  const int64_t m = 4, k = 8, n = 8;
  auto a = random_floats(size_t(m * k), 7);
  for (float& x : a) x *= 40;  // values past the int8 range saturate
  a[3] = 1000;                  // past e4m3's 448
  std::vector<uint8_t> wbits(size_t(k * n));
  for (size_t i = 0; i < wbits.size(); ++i) wbits[i] = uint8_t((i * 53 + 11) % 256);
  for (uint8_t& b : wbits)
    if ((b & 0x7f) == 0x7f) b = 0x30;  // no NaN weights
  std::vector<float> wv(wbits.size());
  for (size_t i = 0; i < wv.size(); ++i) {  // decoded by the format's definition
    const int e = (wbits[i] >> 3) & 15, mt = wbits[i] & 7;
    const double mag = e == 0 ? mt / 8.0 * std::ldexp(1.0, -6) : (1 + mt / 8.0) * std::ldexp(1.0, e - 7);
    wv[i] = float((wbits[i] & 0x80) ? -mag : mag);
  }
  put(chip, Space::vmem, 0, a);
  put(chip, Space::vmem, 1024, wbits);
  std::vector<int8_t> wi(size_t(k * n));
  for (size_t i = 0; i < wi.size(); ++i) wi[i] = int8_t(int(i * 91 + 5) % 256 - 128);
  put(chip, Space::vmem, 2048, wi);
  B b;
  b.mxu_load_weights(0, B::vmem(B::at(1024), DType::f8e4m3), k, n, MxuMode::fp8);
  b.mxu_matmul(0, B::vmem(B::at(4096), DType::f32), B::vmem(B::at(0), DType::f32), m, k, n, false, MxuMode::fp8);
  b.mxu_load_weights(1, B::vmem(B::at(2048), DType::i8), k, n, MxuMode::i8);
  b.mxu_matmul(1, B::vmem(B::at(8192), DType::f32), B::vmem(B::at(0), DType::f32), m, k, n, false, MxuMode::i8);
  const RunResult r = chip.run(b.finish());
  auto c8 = get<float>(chip, Space::vmem, 4096, size_t(m * n));
  auto ci = get<float>(chip, Space::vmem, 8192, size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s8 = 0, si = 0;
      for (int64_t p = 0; p < k; ++p) {
        const float x = a[size_t(i * k + p)];
        s8 += double(e4m3_nearest_by_search(x)) * wv[size_t(p * n + j)];
        si += std::fmin(127.0, std::fmax(-128.0, std::nearbyint(double(x)))) * wi[size_t(p * n + j)];
      }
      CHECK(c8[size_t(i * n + j)] == Approx(s8).epsilon(1e-6).margin(1e-6));
      CHECK(ci[size_t(i * n + j)] == float(si));  // small integer sums: exact in f32
    }
  // Both modes' FLOPs counted against their own peaks (2 MXUs x 8 x 8 x 2 FLOP per 0.5 cycles).
  CHECK(r.stats.mxu_flops == Approx(2.0 * 2 * m * k * n));
  CHECK(r.stats.mxu_peak_cycles == Approx(2.0 * 2 * m * k * n / (2 * 8 * 8 * 2 / 0.5)));

  ChipConfig no_fp8 = preset_config("tiny");
  Chip plain(no_fp8);
  B b2;
  b2.mxu_load_weights(0, B::vmem(B::at(1024), DType::f8e4m3), k, n, MxuMode::fp8);
  b2.mxu_matmul(0, B::vmem(B::at(4096), DType::f32), B::vmem(B::at(0), DType::f32), m, k, n, false, MxuMode::fp8);
  CHECK_THROWS_WITH(plain.run(b2.finish()), Catch::Contains("no MXU rate for mode fp8"));
  // the conversion helpers against the search, on values around every binade and past the range
  for (float v : {0.0f, 1e-4f, 0.0009765625f, 0.00146484375f, 0.013f, 0.1f, 1.0625f, 1.1875f, 3.3f, 240.0f, 250.0f,
                  447.0f, 464.0f, -0.37f, -17.5f})
    CHECK(e4m3_bits_to_f32(f32_to_e4m3_bits(v)) == e4m3_nearest_by_search(v));
}

TEST_CASE("generated GEMM computes C = A*B (bf16 in, f32 out)", "[sim][mxu][gemm]") {
  ChipConfig cfg = preset_config("tiny");
  for (int64_t bm : {0, 8}) {
    INFO("block_m " << bm);
    const int64_t m = 24, n = 32, k = 24;
    auto g = make_gemm(cfg, {.m = m, .n = n, .k = k, .block_m = bm});
    Chip chip(cfg);
    auto a = random_floats(size_t(m * k), 5);
    auto w = random_floats(size_t(k * n), 6);
    put(chip, Space::hbm, g.a_addr, to_bf16(a));
    put(chip, Space::hbm, g.b_addr, to_bf16(w));
    auto res = chip.run(g.program, {.race_check = true});
    CHECK(res.races.empty());
    for (const auto& r : res.races) UNSCOPED_INFO(r.message);
    auto c = get<float>(chip, Space::hbm, g.c_addr, size_t(m * n));
    auto ref = ref_gemm(a, w, m, n, k, true);
    for (size_t i = 0; i < c.size(); ++i) REQUIRE(c[i] == Approx(ref[i]).epsilon(1e-4).margin(1e-5));
    CHECK(res.stats.mxu_flops == 2.0 * m * n * k);
    CHECK(res.stats.hbm_bytes_written == uint64_t(m * n * 4));
  }
}

TEST_CASE("vector unit, transcendental path and casts", "[sim][vpu]") {
  Chip chip = tiny();
  const int64_t R = 3, C = 10;
  auto x = random_floats(size_t(R * C), 7, 0.1f, 2.f);
  auto y = random_floats(size_t(R * C), 8, -2.f, 2.f);
  put(chip, Space::vmem, 0, x);
  put(chip, Space::vmem, 1024, y);
  auto X = B::vmem(B::at(0), DType::f32);
  auto Y = B::vmem(B::at(1024), DType::f32);
  auto Yrow = B::vmem(B::at(1024), DType::f32, 0, 1);  // row 0 broadcast down
  auto Ycol = B::vmem(B::at(1024), DType::f32, 1, 0);  // element r broadcast along row r
  auto out = [](int i, DType t = DType::f32) { return B::vmem(B::at(4096 + i * 512), t); };
  B b;
  b.binary(Op::vadd, out(0), X, Yrow, R, C);
  b.binary(Op::vmul, out(1), X, B::imm(-3.f), R, C);
  b.binary(Op::vmax, out(2), X, Ycol, R, C);
  b.ternary(Op::vfma, out(3), X, Y, B::imm(1.f), R, C);
  b.binary(Op::vcmplt, out(4), Y, B::imm(0.f), R, C);
  b.ternary(Op::vsel, out(5), out(4), X, Y, R, C);
  b.unary(Op::vexp, out(6), Y, R, C);
  b.unary(Op::vlog, out(7), X, R, C);
  b.unary(Op::vtanh, out(8), Y, R, C);
  b.unary(Op::vrsqrt, out(9), X, R, C);
  b.unary(Op::verf, out(10), Y, R, C);
  b.unary(Op::vcast, out(11, DType::bf16), X, R, C);
  b.binary(Op::vmul, out(12), Y, B::imm(100.f), R, C);
  b.unary(Op::vcast, out(13, DType::i8), out(12), R, C);
  b.unary(Op::vrecip, out(14), X, R, C);
  b.fill(out(15), 2.5f, R, C);
  chip.run(b.finish());
  auto o = [&](int i) { return get<float>(chip, Space::vmem, uint64_t(4096 + i * 512), size_t(R * C)); };
  auto ob = get<uint16_t>(chip, Space::vmem, 4096 + 11 * 512, size_t(R * C));
  auto oi = get<int8_t>(chip, Space::vmem, 4096 + 13 * 512, size_t(R * C));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      size_t i = size_t(r * C + c);
      CHECK(o(0)[i] == x[i] + y[size_t(c)]);
      CHECK(o(1)[i] == x[i] * -3.f);
      CHECK(o(2)[i] == std::max(x[i], y[size_t(r)]));
      CHECK(o(3)[i] == std::fma(x[i], y[i], 1.f));
      CHECK(o(4)[i] == (y[i] < 0 ? 1.f : 0.f));
      CHECK(o(5)[i] == (y[i] < 0 ? x[i] : y[i]));
      CHECK(o(6)[i] == Approx(std::exp(y[i])).epsilon(1e-6));
      CHECK(o(7)[i] == Approx(std::log(x[i])).epsilon(1e-6).margin(1e-7));
      CHECK(o(8)[i] == Approx(std::tanh(y[i])).epsilon(1e-6).margin(1e-7));
      CHECK(o(9)[i] == Approx(1 / std::sqrt(x[i])).epsilon(1e-6));
      CHECK(o(10)[i] == Approx(std::erf(y[i])).epsilon(1e-6).margin(1e-7));
      CHECK(ob[i] == f32_to_bf16_bits(x[i]));
      float s = y[i] * 100.f;
      CHECK(int(oi[i]) == int(std::max(-128.f, std::min(127.f, std::nearbyint(s)))));
      CHECK(o(14)[i] == Approx(1 / x[i]).epsilon(1e-6));
      CHECK(o(15)[i] == 2.5f);
    }
}

TEST_CASE("cross-lane reductions and transpose", "[sim][xlu]") {
  Chip chip = tiny();
  const int64_t R = 5, C = 12;
  auto x = random_floats(size_t(R * C), 9);
  put(chip, Space::vmem, 0, x);
  auto X = B::vmem(B::at(0), DType::f32);
  B b;
  b.reduce(Op::xsum, B::vmem(B::at(1024), DType::f32), X, R, C, 1);
  b.reduce(Op::xmax, B::vmem(B::at(2048), DType::f32), X, R, C, 1);
  b.reduce(Op::xsum, B::vmem(B::at(3072), DType::f32), X, R, C, 0);
  b.reduce(Op::xmax, B::vmem(B::at(4096), DType::f32), X, R, C, 0);
  b.transpose(B::vmem(B::at(8192), DType::f32), X, R, C);
  chip.run(b.finish());
  auto rs = get<float>(chip, Space::vmem, 1024, size_t(R));
  auto rm = get<float>(chip, Space::vmem, 2048, size_t(R));
  auto cs = get<float>(chip, Space::vmem, 3072, size_t(C));
  auto cm = get<float>(chip, Space::vmem, 4096, size_t(C));
  auto t = get<float>(chip, Space::vmem, 8192, size_t(R * C));
  for (int64_t r = 0; r < R; ++r) {
    double s = 0;
    float mx = -INFINITY;
    for (int64_t c = 0; c < C; ++c) s += x[size_t(r * C + c)], mx = std::max(mx, x[size_t(r * C + c)]);
    CHECK(rs[size_t(r)] == Approx(s).margin(1e-5));
    CHECK(rm[size_t(r)] == mx);
  }
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    float mx = -INFINITY;
    for (int64_t r = 0; r < R; ++r) s += x[size_t(r * C + c)], mx = std::max(mx, x[size_t(r * C + c)]);
    CHECK(cs[size_t(c)] == Approx(s).margin(1e-5));
    CHECK(cm[size_t(c)] == mx);
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) CHECK(t[size_t(c * R + r)] == x[size_t(r * C + c)]);
}

TEST_CASE("bad addresses and programs are clear errors, never crashes", "[sim][errors]") {
  auto run_err = [](B& b, const char* preset = "tiny") {
    Chip chip(preset_config(preset));
    try {
      chip.run(b.finish());
    } catch (const SimError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  {
    B b;
    b.loop(0, 4);
    b.dma(B::vmem_at(B::at(262144 - 128, {{0, 64}})), B::hbm_at(B::at(0)), {.row_bytes = 64}, 0, 0);
    b.wait(0);
    b.end_loop();
    auto e = run_err(b);
    CHECK_THAT(e, Catch::Contains("instruction #1 (dma") && Catch::Contains("outside vmem"));
  }
  {
    B b;
    b.fill(B::vmem(B::at(2), DType::f32), 1.f, 1, 4);
    CHECK_THAT(run_err(b), Catch::Contains("instruction #0") && Catch::Contains("not aligned"));
  }
  {
    B b;
    b.dma(B::vmem_at(B::at(0)), B::hbm_at(B::at(-8)), {.row_bytes = 8}, 0, 0);
    CHECK_THAT(run_err(b), Catch::Contains("outside hbm"));
  }
  {
    B b;
    b.dma(B::vmem_at(B::at(0)), B::hbm_at(B::at(int64_t(1) << 62)), {.rows = 1 << 30, .row_bytes = 1 << 30}, 0, 0);
    CHECK_THAT(run_err(b), Catch::Contains("outside hbm"));
  }
  {
    B b;
    b.wait(3);
    CHECK_THAT(run_err(b), Catch::Contains("would hang"));
  }
  {
    B b;
    b.mxu_matmul(0, B::vmem(B::at(0), DType::f32), B::vmem(B::at(512), DType::bf16), 4, 8, 8, false);
    CHECK_THAT(run_err(b), Catch::Contains("no weights loaded"));
  }
  {
    B b;
    b.mxu_load_weights(0, B::vmem(B::at(0), DType::bf16), 16, 8);
    CHECK_THAT(run_err(b), Catch::Contains("exceeds the MXU's 8 rows"));
  }
  {
    B b;
    b.dma(B::vmem_at(B::at(0)), B::hbm_at(B::at(0)), {.row_bytes = 8}, 7, 0);
    CHECK_THAT(run_err(b), Catch::Contains("dma queue 7"));
  }
  {
    B b;
    b.loop(0, 1000000);
    b.loop(1, 1000000);
    b.nop();
    b.end_loop();
    b.end_loop();
    Chip chip = tiny();
    CHECK_THROWS_WITH(chip.run(b.finish(), {.max_instructions = 10000}), Catch::Contains("max_instructions"));
  }
  Chip chip = tiny();
  std::vector<uint8_t> buf(16);
  CHECK_THROWS_WITH(chip.write_hbm(chip.hbm_size() - 8, buf.data(), 16), Catch::Contains("outside hbm"));
  CHECK_THROWS_AS(chip.read_vmem(~uint64_t(0) - 4, buf.data(), 16), SimError);
}
