// kv_cache_attention (codegen/cached_attention.h): decode attention over the live keys of a KV
// cache, the length a runtime tensor. On the tiny chip and the cpu against a naive double-
// precision attention over keys [0, pos + 1); one chip program serves every position and reads
// only the live steps of the cache; a sliding window and soft-capped scores; bad input is a
// tpu::Error and the runtime stays usable; and
// compiled decode over 200 steps compiles once, builds no program after the first step, and
// gives the tokens of eager decoding on the cpu.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "codegen/cache_update.h"
#include "codegen/cached_attention.h"
#include "codegen/launch.h"
#include "core/codegen_testing.h"
#include "core/llm_reference.h"
#include "core/opinfo.h"
#include "tpucore/compile.h"
#include "tpucore/models.h"

using namespace tpu;
using tpu::testing::expect_error;

namespace {

const testing::OpInfoRegistrar cached_attention_entry("kv_cache_attention", "tests/core/test_llm_cached_attention.cpp");

// q [B, H, 1, D], caches [B, Hkv, C, D], keep [B, C] (empty: all kept): attention over keys
// [0, pos] in double precision.
std::vector<double> naive(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                          const std::vector<uint8_t>& keep, int64_t B, int64_t H, int64_t Hkv, int64_t C, int64_t D,
                          int64_t pos, double scale, int64_t window = 0, double softcap = 0) {
  std::vector<double> out(static_cast<size_t>(B * H * D), 0.0);
  const int64_t g = H / Hkv;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / g;
      std::vector<double> s;
      std::vector<int64_t> keys;
      for (int64_t j = 0; j <= pos; ++j) {
        if (!keep.empty() && !keep[static_cast<size_t>(b * C + j)]) continue;
        if (window > 0 && j <= pos - window) continue;  // outside (pos - window, pos]
        double dot = 0;
        for (int64_t e = 0; e < D; ++e)
          dot += double(q[size_t((b * H + h) * D + e)]) * double(k[size_t(((b * Hkv + kvh) * C + j) * D + e)]);
        s.push_back(softcap > 0 ? softcap * std::tanh(dot * scale / softcap) : dot * scale);
        keys.push_back(j);
      }
      double mx = -1e300, z = 0;
      for (double x : s) mx = std::max(mx, x);
      for (double& x : s) z += x = std::exp(x - mx);
      for (size_t i = 0; i < s.size(); ++i)
        for (int64_t e = 0; e < D; ++e)
          out[size_t((b * H + h) * D + e)] += s[i] / z * double(v[size_t(((b * Hkv + kvh) * C + keys[i]) * D + e)]);
    }
  return out;
}

double max_err(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::abs(double(got[i]) - want[i]));
  return e;
}

std::vector<float> rounded(const Tensor& t, DType dt) { return t.to(dt).to(DType::f32).to_vector<float>(); }

}  // namespace

TEST_CASE("kv_cache_attention: chip and cpu equal naive attention over the live keys", "[llm][codegen][cache]") {
  testing::TinySim tiny;
  const int64_t H = 4, Hkv = 2, C = 64, D = 8;
  const double scale = 1.0 / std::sqrt(double(D));
  std::mt19937 rng(3);
  for (int64_t B : {1, 2, 3})  // the next batch row's data are prefetched into alternating buffers
  for (DType dt : {DType::f32, DType::bf16})
    for (bool masked : {false, true}) {
      const Tensor q = randn({B, H, 1, D}), k = randn({B, Hkv, C, D}), v = randn({B, Hkv, C, D});
      const std::vector<float> qh = rounded(q, dt), kh = rounded(k, dt), vh = rounded(v, dt);
      uint64_t built_first = 0;
      for (int64_t pos : {int64_t{0}, int64_t{5}, int64_t{16}, int64_t{40}, C - 1}) {
        CAPTURE(B, dtype_name(dt), masked, pos);
        std::vector<uint8_t> keep;
        if (masked) {
          keep.assign(size_t(B * C), 1);
          for (auto& x : keep) x = rng() % 3 != 0;
          for (int64_t b = 0; b < B; ++b) keep[size_t(b * C + pos)] = 1;  // each row keeps its own key
        }
        const std::vector<double> want = naive(qh, kh, vh, keep, B, H, Hkv, C, D, pos, scale);
        const double tol = dt == DType::f32 ? 1e-4 : 3e-2;
        for (Device dev : {Device(), tiny.dev()}) {
          CAPTURE(dev.str());
          Tensor mask;
          if (masked)
            mask = from_vector(std::vector<bool>(keep.begin(), keep.end()), Shape{B, 1, 1, C},
                               TensorOptions(DType::boolean, dev));
          const Tensor p = codegen::position_tensor(pos, dev);
          testing::ChipRunProbe::sync_all();
          codegen::reset_stats();
          const Tensor got = codegen::kv_cache_attention(q.to(dt).to(dev), k.to(dt).to(dev), v.to(dt).to(dev), p, mask, scale);
          testing::ChipRunProbe::sync_all();
          CHECK(got.shape() == Shape({B, H, 1, D}));
          CHECK(got.dtype() == dt);
          CHECK(max_err(got.to(Device()).to(DType::f32).to_vector<float>(), want) < tol);
          if (dev.is_cpu()) continue;
          const codegen::CodegenStats s = codegen::stats();
          CHECK(s.host_fallbacks == 0);
          CHECK(s.runs_by_kernel.count("kv_cache_attention") == 1);
          // One program for every position: built at the first, reused after.
          if (pos == 0) built_first = s.programs_built;
          else CHECK(s.programs_built == 0);
          // Reads the live steps of the cache (tk = 16 keys on the tiny chip), not all of it.
          const int64_t es = int64_t(dtype_size(dt)), steps = (pos + 1 + 15) / 16;
          const int64_t live_kv = 2 * B * Hkv * steps * 16 * D * es;
          const int64_t other = 2 * B * H * D * es + (masked ? B * steps * 16 : 0) + 8 + 64 * 8;
          CHECK(s.hbm_bytes <= uint64_t(live_kv + other));
        }
      }
      CHECK(built_first >= 1);
    }
}

TEST_CASE("kv_cache_attention: a sliding window and soft-capped scores on the chip and the cpu", "[llm][codegen][cache]") {
  // Window 11 (spanning steps of 16 keys on the tiny chip) and a cap of 1.2 on scores of about
  // N(0, 1.4^2), with and without a mask, against the naive attention; on the chip one program
  // with no host work.
  testing::TinySim tiny;
  const int64_t B = 2, H = 4, Hkv = 2, C = 64, D = 8, window = 11;
  const double scale = 0.5, cap = 1.2;
  std::mt19937 rng(9);
  const Tensor q = randn({B, H, 1, D}), k = randn({B, Hkv, C, D}), v = randn({B, Hkv, C, D});
  const std::vector<float> qh = rounded(q, DType::f32), kh = rounded(k, DType::f32), vh = rounded(v, DType::f32);
  for (bool masked : {false, true})
    for (int64_t pos : {int64_t{3}, int64_t{20}, int64_t{47}}) {
      CAPTURE(masked, pos);
      std::vector<uint8_t> keep;
      if (masked) {
        keep.assign(size_t(B * C), 1);
        for (auto& x : keep) x = rng() % 3 != 0;
        for (int64_t b = 0; b < B; ++b) keep[size_t(b * C + pos)] = 1;
      }
      const std::vector<double> want = naive(qh, kh, vh, keep, B, H, Hkv, C, D, pos, scale, window, cap);
      // Past the window the result differs from the capped attention over every live key.
      if (pos > window) CHECK(max_err(rounded(codegen::kv_cache_attention(q, k, v, codegen::position_tensor(pos, Device()),
                                                                          {}, scale, 0, cap), DType::f32),
                                      want) > 1e-3);
      for (Device dev : {Device(), tiny.dev()}) {
        CAPTURE(dev.str());
        Tensor mask;
        if (masked)
          mask = from_vector(std::vector<bool>(keep.begin(), keep.end()), Shape{B, 1, 1, C},
                             TensorOptions(DType::boolean, dev));
        testing::ChipRunProbe::sync_all();
        codegen::reset_stats();
        const Tensor got = codegen::kv_cache_attention(q.to(dev), k.to(dev), v.to(dev),
                                                       codegen::position_tensor(pos, dev), mask, scale, window, cap);
        testing::ChipRunProbe::sync_all();
        CHECK(max_err(got.to(Device()).to_vector<float>(), want) < 1e-4);
        if (dev.is_cpu()) continue;
        const codegen::CodegenStats s = codegen::stats();
        CHECK(s.host_fallbacks == 0);
        CHECK(s.runs_by_kernel.count("kv_cache_attention") == 1);
      }
    }
}

TEST_CASE("kv_cache_attention: several queries with a window and soft-capping run as one flash program",
          "[llm][codegen][cache]") {
  // T = 5 queries at positions pos .. pos + 4 (a prefill chunk after pos cached keys), causal
  // through the mask: on the tiny chip the window and the cap are constants of the fused flash
  // program (no score matrix, no host mask), against the naive attention of each query.
  testing::TinySim tiny;
  const int64_t B = 2, H = 4, Hkv = 2, C = 64, D = 8, T = 5;
  const double scale = 0.5;
  std::mt19937 rng(13);
  const Tensor q = randn({B, H, T, D}), k = randn({B, Hkv, C, D}), v = randn({B, Hkv, C, D});
  const std::vector<float> qh = rounded(q, DType::f32), kh = rounded(k, DType::f32), vh = rounded(v, DType::f32);
  for (auto [window, cap] : {std::pair<int64_t, double>{11, 1.2}, {0, 1.2}, {11, 0.0}, {40, 0.0}})
    for (int64_t pos : {int64_t{3}, int64_t{20}, int64_t{50}}) {
      CAPTURE(window, cap, pos);
      std::vector<uint8_t> keep(size_t(B * C));
      for (auto& x : keep) x = rng() % 4 != 0;
      std::vector<bool> mask(size_t(B * T * C));
      std::vector<double> want(size_t(B * H * T * D));
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t b = 0; b < B; ++b) {
          keep[size_t(b * C + pos + i)] = 1;
          for (int64_t j = 0; j < C; ++j) mask[size_t((b * T + i) * C + j)] = keep[size_t(b * C + j)] && j <= pos + i;
        }
        std::vector<float> qi(size_t(B * H * D));
        for (int64_t bh = 0; bh < B * H; ++bh)
          for (int64_t e = 0; e < D; ++e) qi[size_t(bh * D + e)] = qh[size_t((bh * T + i) * D + e)];
        const std::vector<double> wi = naive(qi, kh, vh, keep, B, H, Hkv, C, D, pos + i, scale, window, cap);
        for (int64_t bh = 0; bh < B * H; ++bh)
          for (int64_t e = 0; e < D; ++e) want[size_t((bh * T + i) * D + e)] = wi[size_t(bh * D + e)];
      }
      testing::ChipRunProbe::sync_all();
      codegen::reset_stats();
      const Tensor got = codegen::kv_cache_attention(
          q.to(tiny.dev()), k.to(tiny.dev()), v.to(tiny.dev()), codegen::position_tensor(pos, tiny.dev()),
          from_vector(mask, Shape{B, 1, T, C}, TensorOptions(DType::boolean, tiny.dev())), scale, window, cap);
      testing::ChipRunProbe::sync_all();
      CHECK(max_err(got.to(Device()).to_vector<float>(), want) < 1e-4);
      const codegen::CodegenStats s = codegen::stats();
      CHECK(s.host_fallbacks == 0);
      CHECK(s.runs_by_kernel.count("scaled_dot_product_attention") == 1);
      CHECK(s.runs_by_kernel.count("tanh") == 0);
      CHECK(s.runs_by_kernel.count("softmax") == 0);
    }
}

TEST_CASE("kv_cache_attention: chip cycles grow with the live length, not the capacity", "[llm][codegen][cache]") {
  testing::TinySim tiny;
  const int64_t C = 256;
  const Tensor q = randn({1, 4, 1, 8}).to(tiny.dev()), k = randn({1, 2, C, 8}).to(tiny.dev()),
               v = randn({1, 2, C, 8}).to(tiny.dev());
  auto cycles = [&](int64_t pos) {
    testing::ChipRunProbe::sync_all();
    codegen::reset_stats();
    (void)codegen::kv_cache_attention(q, k, v, codegen::position_tensor(pos, tiny.dev()), {}, 0.35);
    testing::ChipRunProbe::sync_all();
    return codegen::stats().cycles;
  };
  const double short_len = cycles(10), full = cycles(C - 1);
  INFO("cycles at 11 live keys " << short_len << ", at " << C << " " << full);
  CHECK(short_len * 4 < full);
}

TEST_CASE("kv_cache_attention: bad input is a tpu::Error and the runtime stays usable", "[llm][codegen][cache]") {
  testing::TinySim tiny;
  for (Device dev : {Device(), tiny.dev()}) {
    CAPTURE(dev.str());
    const TensorOptions f(DType::f32, dev);
    const Tensor q = ones({1, 4, 1, 8}, f), k = ones({1, 2, 16, 8}, f), v = ones({1, 2, 16, 8}, f);
    auto pos = [&](int64_t p) { return from_vector(std::vector<int64_t>{p}, Shape{1}, TensorOptions(DType::i64, dev)); };
    expect_error([&] { codegen::kv_cache_attention(q, k, v, pos(16), {}, 1.0); },
                 {"kv_cache_attention", "position 16 is outside [0, 15]"});
    expect_error([&] { codegen::kv_cache_attention(q, k, v, pos(-2), {}, 1.0); }, {"position -2 is outside"});
    expect_error([&] { codegen::kv_cache_attention(q, ones({1, 3, 16, 8}, f), ones({1, 3, 16, 8}, f), pos(0), {}, 1.0); },
                 {"kv_cache_attention", "H a multiple of Hkv"});
    expect_error([&] { codegen::kv_cache_attention(q, k.to(DType::bf16), v, pos(0), {}, 1.0); },
                 {"kv_cache_attention", "one floating dtype"});
    expect_error([&] { codegen::kv_cache_attention(q, k, v, ones({2}, TensorOptions(DType::i64, dev)), {}, 1.0); },
                 {"the position must be one i32 or i64 value"});
    expect_error([&] { codegen::kv_cache_attention(q, k, v, pos(0), ones({1, 1, 1, 15}, TensorOptions(DType::boolean, dev)), 1.0); },
                 {"the mask must be bool", "[1, 4, 1, 16]"});
    expect_error([&] { codegen::kv_cache_attention(q, k, v, pos(0), {}, 0.0); }, {"scale must be positive"});
    // Usable after: uniform values give the value row.
    const Tensor got = codegen::kv_cache_attention(q, k, v, pos(3), {}, 1.0);
    for (float x : got.to(Device()).to_vector<float>()) CHECK(x == 1.0f);
  }
}

TEST_CASE("generate on the chip: compiled decode over 200 steps compiles once and reads the live cache",
          "[llm][generate][jit][codegen][cache]") {
  testing::TinySim tiny;
  using namespace tpu::testing::llm;
  TinyCfg cfg;
  auto dir = temp_dir("cached_attention");
  write_tiny_model(dir, cfg, DType::f32, 1, 33);
  auto cpu_model = models::load_causal_lm(dir.string());
  auto chip_model = models::load_causal_lm(dir.string(), tiny.dev());
  std::filesystem::remove_all(dir);
  models::GenerationConfig g;
  g.max_new_tokens = 201;  // 200 decode steps
  const std::vector<std::vector<int64_t>> prompts{{1, 2, 3}, {4, 5}};
  const auto want = models::generate(*cpu_model, prompts, g);

  g.compile = true;
  g.compile_name = "test_llm_cached_attention_sim";
  testing::ChipRunProbe::sync_all();
  codegen::reset_stats();
  const auto compiled = models::generate(*chip_model, prompts, g);
  testing::ChipRunProbe::sync_all();
  const codegen::CodegenStats s = codegen::stats();
  CHECK(compiled == want);
  const jit::Stats js = jit::stats();
  const jit::FunctionStats* f = js.find("test_llm_cached_attention_sim");
  REQUIRE(f != nullptr);
  CHECK(f->compiles == 1);
  CHECK(f->hits == 199);
  CHECK(s.runs_by_kernel.at("kv_cache_attention") == uint64_t(cfg.layers * 200));
  CHECK(s.host_fallbacks == 0);
  // A second call builds no program at all: one program per kernel serves every position.
  testing::ChipRunProbe::sync_all();
  codegen::reset_stats();
  CHECK(models::generate(*chip_model, prompts, g) == want);
  testing::ChipRunProbe::sync_all();
  CHECK(codegen::stats().programs_built == 0);
  const jit::Stats js2 = jit::stats();
  CHECK(js2.find("test_llm_cached_attention_sim")->compiles == 1);
}

TEST_CASE("kv_cache_attention: several queries or a per-head mask run as attention over the narrowed cache",
          "[llm][codegen][cache]") {
  testing::TinySim tiny;
  const int64_t C = 32, pos = 9;
  const Tensor q = randn({1, 4, 2, 8}), k = randn({1, 2, C, 8}), v = randn({1, 2, C, 8});
  std::vector<bool> keep(size_t(4 * 2 * C), false);
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j <= pos + i; ++j) keep[size_t((h * 2 + i) * C + j)] = (j + h) % 3 != 0 || j == pos + i;
  const Tensor mask = from_vector(keep, Shape{1, 4, 2, C}, DType::boolean);
  // The reference: scaled_dot_product_attention over keys [0, pos + 2) on the cpu.
  const Tensor want = scaled_dot_product_attention(q, narrow(k, 2, 0, pos + 2), narrow(v, 2, 0, pos + 2),
                                                   narrow(mask, 3, 0, pos + 2), false, 0.3);
  const Tensor got = codegen::kv_cache_attention(q.to(tiny.dev()), k.to(tiny.dev()), v.to(tiny.dev()),
                                                 codegen::position_tensor(pos, tiny.dev()), mask.to(tiny.dev()), 0.3);
  const std::vector<float> g = got.to(Device()).to_vector<float>(), w = want.to_vector<float>();
  REQUIRE(g.size() == w.size());
  for (size_t i = 0; i < g.size(); ++i) CHECK(std::abs(g[i] - w[i]) < 1e-4);
}
