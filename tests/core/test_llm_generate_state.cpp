// generate()'s compiled decode steps live outside the model, keyed by it, and go with it: a
// model created after another one was destroyed (often at the same address) gets its own
// compiled step, whose tokens equal eager decoding of that model; release_generation_state()
// drops a live model's steps, so the next call compiles again. Greedy choice: first_argmax against
// std::max_element on rows with ties, NaNs, infinities and signed zeros.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include <catch2/catch.hpp>

#include "tpucore/compile.h"
#include "tpucore/models.h"

using namespace tpu;

namespace {
models::ModelConfig tiny_config() {
  models::ModelConfig c;
  c.vocab_size = 29, c.hidden_size = 16, c.intermediate_size = 24, c.num_hidden_layers = 2;
  c.num_attention_heads = 2, c.num_key_value_heads = 1;
  return c;
}
int64_t compiles(const char* name) {
  const jit::Stats st = jit::stats();
  int64_t n = 0;
  for (const jit::FunctionStats& f : st.functions)
    if (f.name == name) n += f.compiles;
  return n;
}
}  // namespace

TEST_CASE("generate: compiled decode state follows the model's lifetime", "[llm][generate][jit]") {
  const char* name = "test_llm_generate_state";
  models::GenerationConfig g;
  g.max_new_tokens = 6;
  g.compile = true;
  g.compile_name = name;
  const std::vector<std::vector<int64_t>> prompts{{1, 2, 3}};
  const int64_t before = compiles(name);
  for (uint64_t seed : {5, 6, 7}) {
    Generator gen(seed);
    auto m = std::make_unique<models::CausalLM>(tiny_config(), &gen);
    const auto compiled = models::generate(*m, prompts, g);
    models::GenerationConfig eager = g;
    eager.compile = false;
    CHECK(compiled == models::generate(*m, prompts, eager));
  }  // each model's compiled step goes with it
  CHECK(compiles(name) == before + 3);
  Generator gen(8);
  models::CausalLM m(tiny_config(), &gen);
  models::generate(m, prompts, g);
  models::generate(m, prompts, g);  // reused
  CHECK(compiles(name) == before + 4);
  models::release_generation_state(m);
  models::generate(m, prompts, g);  // compiled again
  CHECK(compiles(name) == before + 5);
}

TEST_CASE("greedy choice: first_argmax is std::max_element's index", "[generate]") {
  std::mt19937_64 rng(3);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int trial = 0; trial < 2000; ++trial) {
    // Up to 70 values (the scalar chains), or up to 400 (the AVX-512 lanes from 64 on).
    const int64_t n = 1 + static_cast<int64_t>(rng() % (trial % 2 ? 400 : 70));
    std::vector<float> row(static_cast<size_t>(n));
    // Few distinct values, so ties are common; some NaNs, infinities and signed zeros.
    for (float& v : row) {
      const uint64_t r = rng() % 20;
      v = r == 0 ? nan : r == 1 ? -inf : r == 2 ? inf * static_cast<float>(rng() % 2) : r == 3 ? -0.0f
                                                                                          : static_cast<float>(r % 5);
    }
    if (trial % 7 == 0) row[0] = nan;
    INFO("trial " << trial << " n " << n);
    REQUIRE(models::first_argmax(row.data(), n) == std::max_element(row.begin(), row.end()) - row.begin());
  }
}
