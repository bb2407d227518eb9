// The attention-cache interface (nn::AttentionCache): the model's one decoder loop
// (CausalLM::hidden_states) through a cache that records what each layer hands it, and through
// the serving runner's paged caches (the cpu kernel eagerly, the in-place graph node under
// tpu::compile) over a ragged batch of two sequences in scattered blocks, both against the
// independent double-precision reference forward of tests/core/llm_reference.h.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "core/llm_reference.h"
#include "tpucore/autograd.h"
#include "tpucore/models.h"
#include "tpucore/serve/model_runner.h"

using namespace tpu;
namespace llm = tpu::testing::llm;

namespace {

struct Tiny {
  llm::TinyCfg c;
  llm::Weights w;
  std::shared_ptr<models::CausalLM> m;
};

Tiny tiny(uint32_t seed) {
  Tiny t;
  t.c.model_type = "qwen3";
  t.c.qk_norm = true;
  auto dir = llm::temp_dir("attention_cache");
  t.w = llm::write_tiny_model(dir, t.c, DType::f32, 1, seed);
  t.m = models::load_causal_lm(dir.string());
  std::filesystem::remove_all(dir);
  return t;
}

double max_diff(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::abs(static_cast<double>(got[i]) - want[i]));
  return e;
}

// Attention over the new tokens only, recording which layer called with which shapes.
class RecordingCache : public nn::AttentionCache {
 public:
  explicit RecordingCache(int64_t layers) : layers_(layers) {}
  Tensor update_and_attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep,
                           double scale) override {
    calls.push_back({layer, q.shape(), k.shape(), v.shape()});
    return nn::dense_attention(q, k, v, keep, scale);
  }
  int64_t num_layers() const override { return layers_; }
  struct Call {
    int64_t layer;
    Shape q, k, v;
  };
  std::vector<Call> calls;

 private:
  int64_t layers_;
};

}  // namespace

TEST_CASE("attention cache: every layer hands its cache rotated heads, in layer order", "[llm][attention-cache]") {
  Tiny t = tiny(41);
  NoGradGuard ng;
  const std::vector<int64_t> ids{3, 17, 5, 30, 8}, pos{0, 1, 2, 3, 4};
  RecordingCache rec(t.c.layers);
  auto [cos, sin] = t.m->rope_tables(pos, 1);
  const Tensor logits = t.m->forward(from_vector(ids, Shape{1, 5}, TensorOptions(DType::i64)), cos, sin, &rec);
  REQUIRE(rec.calls.size() == static_cast<size_t>(t.c.layers));
  for (int64_t l = 0; l < t.c.layers; ++l) {
    const auto& call = rec.calls[static_cast<size_t>(l)];
    CHECK(call.layer == l);
    CHECK(call.q == Shape({1, t.c.heads, 5, t.c.head_dim}));
    CHECK(call.k == Shape({1, t.c.kv_heads, 5, t.c.head_dim}));
    CHECK(call.v == Shape({1, t.c.kv_heads, 5, t.c.head_dim}));
  }
  const auto want = llm::ref_forward(t.c, t.w, ids, pos);
  std::vector<double> flat;
  for (const auto& row : want) flat.insert(flat.end(), row.begin(), row.end());
  CHECK(max_diff(logits.contiguous().to_vector<float>(), flat) < 1e-4);
}

TEST_CASE("attention cache: the serving runner's paged caches run the model's loop over a ragged batch",
          "[llm][attention-cache][serve]") {
  Tiny t = tiny(43);
  const int64_t bs = 4;
  serve::PagedCacheConfig pc{t.c.layers, t.c.kv_heads, t.c.head_dim, bs, 8};
  const std::vector<int64_t> a{3, 17, 5, 30, 8, 11}, b{9, 2, 21};  // a's last token is decoded later
  for (bool compile : {false, true}) {
    serve::RunnerOptions o;
    o.compile = compile;
    o.compile_name = "test_attention_cache_runner";
    o.max_tokens = 16, o.max_context = 16, o.max_seqs = 4;
    serve::ModelRunner runner(*t.m, pc, o);
    runner.warm_up();
    const std::vector<int32_t> ta{6, 1}, tb{3};  // scattered blocks
    // Step 1: a's first 5 tokens (prefill) and all of b, in one row.
    serve::StepBatch s;
    s.ids = {a[0], a[1], a[2], a[3], a[4], b[0], b[1], b[2]};
    s.positions = {0, 1, 2, 3, 4, 0, 1, 2};
    s.batch.query_start = {0, 5, 8};
    s.batch.context_len = {5, 3};
    s.batch.block_tables = {&ta, &tb};
    s.logit_rows = {4, 7};
    const std::vector<float> got = runner.run(s).to_vector<float>();
    std::vector<double> want = llm::ref_forward(t.c, t.w, {a.begin(), a.begin() + 5}, {0, 1, 2, 3, 4})[4];
    const auto wb = llm::ref_forward(t.c, t.w, b, {0, 1, 2})[2];
    want.insert(want.end(), wb.begin(), wb.end());
    CHECK(max_diff(got, want) < 1e-4);
    // Step 2: a's sixth token as a decode over the five cached positions.
    serve::StepBatch d;
    d.ids = {a[5]};
    d.positions = {5};
    d.batch.query_start = {0, 1};
    d.batch.context_len = {6};
    d.batch.block_tables = {&ta};
    d.logit_rows = {0};
    CHECK(max_diff(runner.run(d).to_vector<float>(), llm::ref_forward(t.c, t.w, a, {0, 1, 2, 3, 4, 5})[5]) < 1e-4);
  }
}
