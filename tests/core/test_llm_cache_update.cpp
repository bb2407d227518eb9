// The KV cache slice write (codegen/cache_update.h) on the simulated chip (tiny preset) and the
// cpu: values against a naive loop over host copies, in place (the result shares the cache's
// memory), one small program on the chip (HBM bytes of the new entries, not of the cache), bad
// input as a tpu::Error that leaves the runtime usable; and compiled decode on the chip: one
// compile over many steps, tokens equal to eager decoding on the cpu, the cache written by the
// slice write (no full-size where, each write cheaper than one where over the cache), no host
// fallback in eager or compiled decoding.
#include <catch2/catch.hpp>

#include "codegen/cache_update.h"
#include "codegen/launch.h"
#include "core/codegen_testing.h"
#include "core/llm_reference.h"
#include "core/opinfo.h"
#include "tpucore/compile.h"
#include "tpucore/models.h"

using namespace tpu;
using tpu::testing::expect_error;

namespace {

// An in-place op with a runtime position: its values, devices and errors are tested here.
const testing::OpInfoRegistrar kv_cache_write_entry("kv_cache_write_", "tests/core/test_llm_cache_update.cpp");

// cache [B, H, C, D] with src [B, H, T, D] written at pos, computed on host vectors.
std::vector<float> naive_write(std::vector<float> cache, const std::vector<float>& src, int64_t b, int64_t h, int64_t c,
                               int64_t t, int64_t d, int64_t pos) {
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < h; ++j)
      for (int64_t k = 0; k < t; ++k)
        for (int64_t e = 0; e < d; ++e)
          cache[static_cast<size_t>(((i * h + j) * c + pos + k) * d + e)] =
              src[static_cast<size_t>(((i * h + j) * t + k) * d + e)];
  return cache;
}

uint64_t kernel_runs(const char* name) {
  const codegen::CodegenStats s = codegen::stats();
  auto it = s.runs_by_kernel.find(name);
  return it == s.runs_by_kernel.end() ? 0 : it->second;
}

}  // namespace

TEST_CASE("kv_cache_write_: the chip and the cpu write the slice in place like a naive loop", "[llm][codegen][cache]") {
  testing::TinySim tiny;
  const int64_t B = 2, H = 3, C = 16, D = 8;
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t t : {1, 3})
      for (int64_t pos : {int64_t{0}, int64_t{5}, C - t}) {
        CAPTURE(dtype_name(dt), t, pos);
        const Tensor base = randn({B, H, C, D}).to(dt);
        // The new entries as the attention makes them: heads split out of [B, T, H, D] (a view).
        const Tensor src = transpose(randn({B, t, H, D}).to(dt), 1, 2);
        const std::vector<float> want =
            naive_write(base.to(DType::f32).to_vector<float>(), contiguous(src).to(DType::f32).to_vector<float>(), B, H,
                        C, t, D, pos);
        for (Device dev : {Device(), tiny.dev()}) {
          CAPTURE(dev.str());
          const Tensor cache = base.to(dev).clone();
          testing::ChipRunProbe::sync_all();
          codegen::reset_stats();
          const Tensor out = codegen::kv_cache_write_(cache, src.to(dev), from_vector(std::vector<int64_t>{pos}, Shape{1}, TensorOptions(DType::i64, dev)));
          testing::ChipRunProbe::sync_all();
          CHECK(out.storage() == cache.storage());
          CHECK(cache.to(Device()).to(DType::f32).to_vector<float>() == want);
          if (!dev.is_cpu()) {
            const codegen::CodegenStats s = codegen::stats();
            CHECK(kernel_runs("kv_cache_write") == 1);
            CHECK(s.host_fallbacks == 0);
            // Reads and writes the new entries only (the cache is C / T times larger).
            CHECK(s.hbm_bytes <= static_cast<uint64_t>(2 * B * H * t * D * static_cast<int64_t>(dtype_size(dt))));
          }
        }
      }
}

TEST_CASE("kv_cache_write_: bad input is a tpu::Error and the runtime stays usable", "[llm][codegen][cache]") {
  testing::TinySim tiny;
  for (Device dev : {Device(), tiny.dev()}) {
    CAPTURE(dev.str());
    const TensorOptions f(DType::f32, dev), i(DType::i64, dev);
    const Tensor cache = zeros({1, 2, 8, 4}, f);
    const Tensor src = ones({1, 2, 2, 4}, f);
    auto pos = [&](std::vector<int64_t> v) { return from_vector(v, Shape{static_cast<int64_t>(v.size())}, i); };
    expect_error([&] { codegen::kv_cache_write_(cache, src, pos({7})); }, {"position 7 is outside [0, 6]"});
    expect_error([&] { codegen::kv_cache_write_(cache, src, pos({-1})); }, {"position -1 is outside"});
    expect_error([&] { codegen::kv_cache_write_(cache, src, pos({1, 2})); }, {"the position must be one i32 or i64 value"});
    expect_error([&] { codegen::kv_cache_write_(cache, ones({1, 2, 2, 4}, TensorOptions(DType::bf16, dev)), pos({0})); },
                 {"the new entries are bf16, the cache f32"});
    expect_error([&] { codegen::kv_cache_write_(cache, ones({1, 3, 1, 4}, f), pos({0})); },
                 {"the new entries must be [1, 2, T, 4]"});
    expect_error([&] { codegen::kv_cache_write_(transpose(cache, 2, 3), src, pos({0})); },
                 {"the cache must be a contiguous"});
    codegen::kv_cache_write_(cache, src, pos({6}));
    const std::vector<float> got = cache.to(Device()).to_vector<float>();
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t p = 0; p < 8; ++p)
        for (int64_t e = 0; e < 4; ++e) CHECK(got[static_cast<size_t>((h * 8 + p) * 4 + e)] == (p >= 6 ? 1.0f : 0.0f));
  }
}

TEST_CASE("generate on the chip: compiled decode writes the cache in place and compiles once",
          "[llm][generate][jit][codegen][cache]") {
  testing::TinySim tiny;
  using namespace tpu::testing::llm;
  TinyCfg cfg;
  auto dir = temp_dir("cache_update");
  write_tiny_model(dir, cfg, DType::f32, 1, 21);
  auto cpu_model = models::load_causal_lm(dir.string());
  auto chip_model = models::load_causal_lm(dir.string(), tiny.dev());
  std::filesystem::remove_all(dir);
  models::GenerationConfig g;
  g.max_new_tokens = 41;  // 40 decode steps
  const std::vector<std::vector<int64_t>> prompts{{1, 2, 3}, {4, 5}};
  const auto want = models::generate(*cpu_model, prompts, g);

  testing::ChipRunProbe::sync_all();
  codegen::reset_stats();
  const auto eager = models::generate(*chip_model, prompts, g);
  testing::ChipRunProbe::sync_all();
  const uint64_t eager_fallbacks = codegen::stats().host_fallbacks;
  CHECK(eager == want);

  g.compile = true;
  g.compile_name = "test_llm_cache_update_sim";
  models::generate(*chip_model, prompts, g);  // compiles
  testing::ChipRunProbe::sync_all();
  codegen::reset_stats();
  const auto compiled = models::generate(*chip_model, prompts, g);
  testing::ChipRunProbe::sync_all();
  const codegen::CodegenStats s = codegen::stats();
  CHECK(compiled == want);
  const jit::Stats js = jit::stats();
  const jit::FunctionStats* f = js.find("test_llm_cache_update_sim");
  REQUIRE(f != nullptr);
  CHECK(f->compiles == 1);
  CHECK(f->hits == 79);
  // Two writes (keys, values) per layer and step; no full-size where over the cache.
  CHECK(kernel_runs("kv_cache_write") == static_cast<uint64_t>(2 * cfg.layers * 40));
  CHECK(s.runs_by_kernel.count("where") == 0);
  CHECK(s.host_fallbacks == 0);  // the embedding lookup included
  // A slice write costs less than one where over the whole cache, which the step did before.
  const double write_cycles = s.cycles_by_kernel.at("kv_cache_write") / static_cast<double>(2 * cfg.layers * 40);
  const int64_t cap = 64;  // the smallest capacity bucket
  const Tensor cache = zeros({2, cfg.kv_heads, cap, cfg.head_dim}, TensorOptions(DType::f32, tiny.dev()));
  const Tensor k = ones({2, cfg.kv_heads, 1, cfg.head_dim}, TensorOptions(DType::f32, tiny.dev()));
  std::vector<bool> at(static_cast<size_t>(cap), false);
  at[10] = true;
  const Tensor mask = from_vector(at, Shape{1, 1, cap, 1}, TensorOptions(DType::boolean, tiny.dev()));
  testing::ChipRunProbe::sync_all();
  codegen::reset_stats();
  const Tensor rewritten = where(mask, k, cache);
  testing::ChipRunProbe::sync_all();
  INFO("cycles of one cache write " << write_cycles << ", of a where over the cache " << codegen::stats().cycles);
  CHECK(write_cycles < codegen::stats().cycles);
  // Eager decoding also reads the ids on the chip now: no host fallback per token.
  CHECK(eager_fallbacks == 0);
}

