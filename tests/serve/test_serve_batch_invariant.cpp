// Batch invariance of the serving engine (EngineConfig::batch_invariant, on by default): 32 mixed
// requests (prompt lengths 1..40, greedy and seeded sampling) served together give, token for
// token and with bitwise equal log-probabilities, what each gives served alone by an engine of its own, with f32 and bf16 parameters,
// eager and compiled. Served together, prompts are prefilled in chunks next to other
// requests' decodes, so every matmul of a request runs with a different number of rows than
// alone.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/codegen_testing.h"
#include "core/llm_reference.h"
#include "serve/serve_testing.h"
#include "tpucore/models.h"
#include "tpucore/runtime/pjrt_client.h"
#include "tpucore/serve/engine.h"

namespace {

using V = std::vector<int64_t>;
using namespace tpu;

std::shared_ptr<models::CausalLM> model_of(DType dt, Device device = Device(), int64_t window = 0) {
  if (window == 0) return testing::serve::small_engine_model(31, dt, device);
  // Every layer sliding (Mistral): the chip plans its steps with the window.
  return testing::serve::small_engine_model(31, dt, device, [window](testing::llm::TinyCfg& c) {
    c.model_type = "mistral";
    c.window = window;
    c.sliding = {true, true};
    c.extra_json = ", \"sliding_window\": " + std::to_string(window);
  });
}

struct Req {
  V prompt;
  serve::SamplingParams params;
};

std::vector<Req> mixed_requests(int n) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int64_t> tok(0, 255), len(1, 40);
  std::vector<Req> rs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Req& r = rs[static_cast<size_t>(i)];
    r.prompt.resize(static_cast<size_t>(len(rng)));
    for (auto& t : r.prompt) t = tok(rng);
    r.params.max_tokens = 6 + i % 5;
    r.params.logprobs = 0;  // the chosen token's log-probability: any change of a logit shows
    if (i % 2) {  // seeded sampling
      r.params.temperature = 0.8;
      r.params.top_k = 20;
      r.params.seed = 1000 + i;
    }
  }
  return rs;
}

// How the engine cuts its steps: the token budget (prompts in chunks next to decodes; a small
// one leaves chunks of a single prompt token) and prefix caching (a request reusing another's
// blocks computes only the rest of its prompt).
struct Cut {
  bool compile = false;
  int64_t block_size = 8;
  int64_t window = 0;  // > 0: a model whose every layer slides over this many positions
  int64_t budget = 96;
  bool prefix_caching = false;
};

serve::EngineConfig config(const Cut& cut) {
  serve::EngineConfig ec;
  ec.block_size = cut.block_size;
  ec.max_num_seqs = 32;
  ec.max_num_batched_tokens = cut.budget;
  ec.max_model_len = 64;
  ec.compile = cut.compile;
  ec.enable_prefix_caching = cut.prefix_caching;
  return ec;
}

struct Out {
  V tokens;
  std::vector<double> logprobs;  // of each chosen token
};

// Serves the requests [first, last) on one engine, all submitted up front; their outputs by index.
std::map<size_t, Out> serve_range(const std::shared_ptr<models::CausalLM>& m, const std::vector<Req>& rs, size_t first,
                                size_t last, const Cut& cut, bool invariant) {
  serve::EngineConfig ec = config(cut);
  ec.batch_invariant = invariant;
  ec.compile_name = "serve_invariant_step";
  serve::Engine e(m, ec);
  std::map<size_t, Out> out;
  for (size_t i = first; i < last; ++i) {
    serve::RequestCallbacks cb;
    cb.on_output = [&out, i](const serve::TokenOutput& t) {
      out[i].tokens.push_back(t.token);
      out[i].logprobs.push_back(t.logprob);
      return true;
    };
    e.add_request(rs[i].prompt, rs[i].params, cb);
  }
  for (int s = 0; s < 4000 && e.has_work(); ++s) e.step();
  REQUIRE_FALSE(e.has_work());
  return out;
}

void check_invariant(DType dt, const Cut& cut, Device device = Device(), int n = 32) {
  auto m = model_of(dt, device, cut.window);
  auto rs = mixed_requests(n);
  if (cut.prefix_caching)  // every third prompt starts with the same 17 tokens (two full blocks and one)
    for (size_t i = 0; i < rs.size(); i += 3) {
      V common(17);
      for (size_t j = 0; j < common.size(); ++j) common[j] = static_cast<int64_t>((j * 37 + 11) % 256);
      rs[i].prompt.insert(rs[i].prompt.begin(), common.begin(), common.end());
      rs[i].prompt.resize(std::min<size_t>(rs[i].prompt.size(), 40));
    }
  const auto together = serve_range(m, rs, 0, rs.size(), cut, true);
  int differ = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    const auto alone = serve_range(m, rs, i, i + 1, cut, true);
    INFO("request " << i << " dtype " << dtype_name(dt) << " compile " << cut.compile << " budget " << cut.budget
                    << " prefix caching " << cut.prefix_caching << " device " << device.str() << " prompt length "
                    << rs[i].prompt.size());
    REQUIRE(alone.count(i) == 1);
    CHECK(alone.at(i).tokens.size() == static_cast<size_t>(rs[i].params.max_tokens));
    CHECK(together.at(i).tokens == alone.at(i).tokens);
    // Bitwise: the same logits, not merely the same argmax.
    CHECK(together.at(i).logprobs == alone.at(i).logprobs);
    differ += together.at(i).tokens != alone.at(i).tokens || together.at(i).logprobs != alone.at(i).logprobs;
  }
  CHECK(differ == 0);
}

}  // namespace

TEST_CASE("engine batch-invariant mode, 32 mixed requests together equal each alone (f32, bf16)",
          "[serve][batch-invariant]") {
  CHECK(serve::EngineConfig{}.batch_invariant);  // on by default
  check_invariant(DType::f32, {});
  check_invariant(DType::bf16, {});
}

TEST_CASE("engine batch-invariant mode, compiled step (f32, bf16)", "[serve][batch-invariant][jit]") {
  check_invariant(DType::f32, {.compile = true});
  check_invariant(DType::bf16, {.compile = true});
}

// The chip's ragged attention program has two classes of work units that sum in different
// orders; every token must land in the same class however the step is cut (chunks of one
// prompt token, prompts resumed after a prefix-cache hit).
TEST_CASE("engine batch-invariant mode on the simulated chip: chunks of one token, prefix hits (f32, bf16)",
          "[serve][batch-invariant][sim]") {
  tpu::testing::TinySim chip;
  const Cut cut{.budget = 10, .prefix_caching = true};
  check_invariant(DType::bf16, cut, chip.dev(), 12);
  check_invariant(DType::f32, cut, chip.dev(), 12);
  check_invariant(DType::bf16, {.budget = 13}, chip.dev(), 12);
}

TEST_CASE("engine batch-invariant mode on the simulated chip, compiled step (bf16)",
          "[serve][batch-invariant][sim][jit]") {
  tpu::testing::TinySim chip;
  check_invariant(DType::bf16, {.compile = true, .budget = 10, .prefix_caching = true}, chip.dev(), 12);
}

// Every layer sliding (the steps planned with the window): a prefill unit's key steps start on a
// fixed grid whatever token the unit starts at (block size 4: two pages per prefill step).
TEST_CASE("engine batch-invariant mode on the simulated chip: every layer sliding (bf16, f32)",
          "[serve][batch-invariant][sim]") {
  tpu::testing::TinySim chip;
  check_invariant(DType::bf16, {.block_size = 4, .window = 7, .budget = 10}, chip.dev(), 12);
  check_invariant(DType::f32, {.block_size = 4, .window = 7, .budget = 10}, chip.dev(), 12);
}

#ifdef TPU_PJRT_SIM_PLUGIN
// pjrt devices run the step as StableHLO: attention gathers each token's context, padded to a
// power of two of the step's longest context (eager) or to the runner's whole context
// (compiled), and every matmul's row count is the step's (eager: one row for a lone decode
// token). The plugin's chip must give a row the same bits whatever it is batched with.
TEST_CASE("engine batch-invariant mode on pjrt:0 (the simulator's PJRT plugin), eager and compiled (f32, bf16)",
          "[serve][batch-invariant][pjrt]") {
  load_pjrt_plugin(TPU_PJRT_SIM_PLUGIN);
  for (bool compiled : {false, true}) {
    check_invariant(DType::f32, {.compile = compiled, .budget = 10}, Device("pjrt:0"), 8);
    check_invariant(DType::bf16, {.compile = compiled, .budget = 10}, Device("pjrt:0"), 8);
  }
}
#endif
