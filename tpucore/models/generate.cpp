#include "tpucore/models/generate.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <map>
#include <mutex>
#include <set>

#include "codegen/cache_update.h"
#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/core/cpu_features.h"

namespace tpu::models {

namespace {

// Two chains of 16 lanes (AVX-512): each lane keeps the first largest of its elements under `<`
// (an ordered compare: a NaN never wins), the lanes are merged by value, then by the smaller
// index, and the tail past the last 32 is scanned after them (its indices are larger).
__attribute__((target("avx512f"))) int64_t first_argmax_avx512(const float* row, int64_t n) {
  __m512 b0 = _mm512_set1_ps(row[0]), b1 = b0;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0;
  __m512i i0 = _mm512_add_epi32(_mm512_set1_epi32(1), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(16));
  const __m512i step = _mm512_set1_epi32(32);
  int64_t i = 1;
  for (; i + 32 <= n; i += 32) {
    const __m512 x0 = _mm512_loadu_ps(row + i), x1 = _mm512_loadu_ps(row + i + 16);
    const __mmask16 m0 = _mm512_cmp_ps_mask(b0, x0, _CMP_LT_OQ), m1 = _mm512_cmp_ps_mask(b1, x1, _CMP_LT_OQ);
    b0 = _mm512_mask_mov_ps(b0, m0, x0), a0 = _mm512_mask_mov_epi32(a0, m0, i0);
    b1 = _mm512_mask_mov_ps(b1, m1, x1), a1 = _mm512_mask_mov_epi32(a1, m1, i1);
    i0 = _mm512_add_epi32(i0, step), i1 = _mm512_add_epi32(i1, step);
  }
  alignas(64) float best[32];
  alignas(64) int32_t at[32];
  _mm512_store_ps(best, b0), _mm512_store_ps(best + 16, b1);
  _mm512_store_si512(at, a0), _mm512_store_si512(at + 16, a1);
  int64_t r = at[0];
  float v = best[0];
  for (int c = 1; c < 32; ++c)
    if (v < best[c] || (v == best[c] && at[c] < r)) v = best[c], r = at[c];
  for (; i < n; ++i)
    if (v < row[i]) v = row[i], r = i;
  return r;
}

}  // namespace

// Eight interleaved chains instead of one (or 32 AVX-512 lanes): each keeps the first largest of
// its elements, and the chains' answers are merged by value, then by the smaller index.
int64_t first_argmax(const float* row, int64_t n) {
  if (n <= 0 || std::isnan(row[0])) return 0;
  if (n >= 64 && n < (int64_t{1} << 31) && cpu_features().avx512f) return first_argmax_avx512(row, n);
  constexpr int kChains = 8;
  float best[kChains];
  int64_t at[kChains];
  for (int c = 0; c < kChains; ++c) best[c] = row[0], at[c] = 0;
  int64_t i = 1;
  for (; i + kChains <= n; i += kChains)
    for (int c = 0; c < kChains; ++c)
      if (best[c] < row[i + c]) best[c] = row[i + c], at[c] = i + c;
  for (; i < n; ++i)
    if (best[0] < row[i]) best[0] = row[i], at[0] = i;
  int64_t r = at[0];
  float v = best[0];
  for (int c = 1; c < kChains; ++c)
    if (v < best[c] || (v == best[c] && at[c] < r)) v = best[c], r = at[c];
  return r;
}

int64_t choose_token(std::vector<float> logits, const std::vector<int64_t>& history, const GenerationConfig& cfg,
                     std::mt19937_64& rng) {
  const auto n = static_cast<int64_t>(logits.size());
  TPU_CHECK(n > 0, "generate: empty logits row");
  if (cfg.repetition_penalty != 1.0) {
    std::set<int64_t> seen(history.begin(), history.end());
    for (int64_t t : seen)
      if (t >= 0 && t < n) {
        float& l = logits[static_cast<size_t>(t)];
        l = l < 0 ? l * static_cast<float>(cfg.repetition_penalty) : l / static_cast<float>(cfg.repetition_penalty);
      }
  }
  if (!cfg.do_sample) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  // Candidates sorted by logit (ties: lower id first), then cut by top-k and top-p.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
  size_t keep = order.size();
  if (cfg.top_k > 0) keep = std::min(keep, static_cast<size_t>(cfg.top_k));
  const double inv_t = 1.0 / cfg.temperature;
  const double top = static_cast<double>(logits[static_cast<size_t>(order[0])]);
  std::vector<double> p(keep);
  double z = 0;
  for (size_t i = 0; i < keep; ++i)
    z += p[i] = std::exp((static_cast<double>(logits[static_cast<size_t>(order[i])]) - top) * inv_t);
  for (double& v : p) v /= z;
  if (cfg.top_p < 1.0) {
    // The smallest prefix whose probability reaches top_p (at least one token).
    double c = 0;
    size_t k = 0;
    while (k < keep && (k == 0 || c < cfg.top_p)) c += p[k++];
    keep = k;
    p.resize(keep);
    for (double& v : p) v /= c;
  }
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double r = u(rng), c = 0;
  for (size_t i = 0; i < keep; ++i) {
    c += p[i];
    if (r < c) return order[i];
  }
  return order[keep - 1];
}

nn::KVCache make_generation_cache(const CausalLM& m, int64_t batch, int64_t capacity, bool shape_static) {
  const ModelConfig& c = m.config;
  const int64_t w = c.sliding_window;
  if (w <= 0 || m.kv_dtype() != nn::KVCacheDType::auto_dtype || w >= capacity) return m.make_cache(batch, capacity);
  std::vector<int64_t> rings(static_cast<size_t>(c.num_hidden_layers), 0);
  bool all = true, any = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool sl = c.is_sliding(i);
    rings[static_cast<size_t>(i)] = sl ? w : 0;
    all = all && sl;
    any = any || sl;
  }
  if (all) return nn::KVCache(c.num_hidden_layers, batch, c.num_key_value_heads, w, c.head_dim, m.dtype(), m.device(),
                              rings);
  if (!any || shape_static) return m.make_cache(batch, capacity);
  return nn::KVCache(c.num_hidden_layers, batch, c.num_key_value_heads, capacity, c.head_dim, m.dtype(), m.device(),
                     rings);
}

namespace {

// A compiled decode step and its cache, kept per model, batch and capacity outside the model.
struct CompiledDecode {
  nn::KVCache cache;
  std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&)> step;
};

struct DecodeRegistry {
  std::mutex mu;
  std::map<const CausalLM*, std::map<std::pair<int64_t, int64_t>, std::shared_ptr<CompiledDecode>>> steps;
};

DecodeRegistry& registry() {
  static DecodeRegistry* r = new DecodeRegistry;  // outlives every model, also static ones
  return *r;
}

std::shared_ptr<CompiledDecode> compiled_decode(CausalLM& m, int64_t batch, int64_t capacity, const std::string& name) {
  DecodeRegistry& reg = registry();
  std::lock_guard<std::mutex> lk(reg.mu);
  std::shared_ptr<CompiledDecode>& s = reg.steps[&m][{batch, capacity}];
  if (!s) {
    auto fresh = std::make_shared<CompiledDecode>(CompiledDecode{make_generation_cache(m, batch, capacity, true), {}});
    nn::KVCache* c = &fresh->cache;
    auto step_fn = [&m, c](const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& keep,
                           const Tensor& write) {
      c->set_write_position(write);
      Tensor out = m.forward(x, cos, sin, c, keep);
      c->set_write_position({});
      return out;
    };
    fresh->step = tpu::compile(step_fn, CompileOptions{.name = name});
    s = fresh;
  }
  return s;
}

}  // namespace

void release_generation_state(const CausalLM& m) {
  DecodeRegistry& reg = registry();
  std::lock_guard<std::mutex> lk(reg.mu);
  reg.steps.erase(&m);
}

std::vector<std::vector<int64_t>> generate(CausalLM& m, const std::vector<std::vector<int64_t>>& user_prompts,
                                           const GenerationConfig& cfg, const TokenCallback& on_token) {
  TPU_CHECK(!user_prompts.empty(), "generate: no prompts");
  TPU_CHECK(cfg.max_new_tokens >= 0 && cfg.max_length >= 0, "generate: max_new_tokens ({}) and max_length ({}) must be >= 0",
            cfg.max_new_tokens, cfg.max_length);
  TPU_CHECK(!cfg.do_sample || (cfg.temperature > 0 && std::isfinite(cfg.temperature)),
            "generate: temperature must be positive and finite, got {}", cfg.temperature);
  TPU_CHECK(cfg.top_p > 0 && cfg.top_p <= 1 && cfg.top_k >= 0 && cfg.repetition_penalty > 0,
            "generate: need 0 < top_p <= 1 (got {}), top_k >= 0 (got {}), repetition_penalty > 0 (got {})", cfg.top_p,
            cfg.top_k, cfg.repetition_penalty);
  const int64_t vocab = m.config.vocab_size;
  TPU_CHECK(cfg.pad_token_id >= 0 && cfg.pad_token_id < vocab,
            "generate: pad_token_id {} is outside the vocabulary of {}", cfg.pad_token_id, vocab);
  size_t longest = 0;
  for (size_t r = 0; r < user_prompts.size(); ++r) {
    TPU_CHECK(!user_prompts[r].empty(), "generate: prompt {} is empty", r);
    for (int64_t t : user_prompts[r])
      TPU_CHECK(t >= 0 && t < vocab, "generate: prompt {} holds token {}, outside the vocabulary of {}", r, t, vocab);
    longest = std::max(longest, user_prompts[r].size());
  }
  const size_t nreal = user_prompts.size();
  // Compiled decoding buckets the batch to a power of two: the extra rows hold one padding
  // token, are finished from the start and never reported, so 3 and 4 prompts share one
  // compiled step.
  std::vector<std::vector<int64_t>> prompts = user_prompts;
  if (cfg.compile) {
    size_t bucket = 1;
    while (bucket < nreal) bucket *= 2;
    prompts.resize(bucket, std::vector<int64_t>{cfg.pad_token_id});
  }
  const auto b = static_cast<int64_t>(prompts.size()), plen = static_cast<int64_t>(longest);
  int64_t steps = cfg.max_new_tokens;
  if (cfg.max_length > 0) steps = std::min(steps, std::max<int64_t>(0, cfg.max_length - plen));
  std::vector<std::vector<int64_t>> out(nreal);
  if (steps == 0) return out;

  NoGradGuard ng;
  std::shared_ptr<CompiledDecode> slot;
  std::optional<nn::KVCache> own;
  if (cfg.compile) {
    int64_t bucket = 64;
    while (bucket < plen + steps) bucket *= 2;
    slot = compiled_decode(m, b, bucket, cfg.compile_name);
    slot->cache.reset();  // stale entries past the new prompts stay masked out
  } else {
    own.emplace(make_generation_cache(m, b, plen + steps));
  }
  nn::KVCache& cache = slot ? slot->cache : *own;
  // The cache's slots (a ring: the window) and the positions a sequence reaches.
  const int64_t cap = cache.capacity(), span = plen + steps;
  // Left padding: row r's tokens end at column plen - 1; valid[r][j] marks real tokens.
  std::vector<uint8_t> valid(static_cast<size_t>(b * span), 0);
  std::vector<int64_t> ids(static_cast<size_t>(b * plen), cfg.pad_token_id), pos(ids.size(), 0), next_pos(prompts.size());
  for (int64_t r = 0; r < b; ++r) {
    const auto& p = prompts[static_cast<size_t>(r)];
    const int64_t pad = plen - static_cast<int64_t>(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      const auto j = static_cast<size_t>(r * plen + pad) + i;
      ids[j] = p[i];
      pos[j] = static_cast<int64_t>(i);
      valid[static_cast<size_t>(r * span + pad) + i] = 1;
    }
    next_pos[static_cast<size_t>(r)] = static_cast<int64_t>(p.size());
  }
  auto keep_mask = [&](int64_t t) {
    const int64_t past = cache.length(), s = past + t;
    std::vector<uint8_t> v(static_cast<size_t>(b * s));
    for (int64_t r = 0; r < b; ++r)
      for (int64_t j = 0; j < s; ++j) v[static_cast<size_t>(r * s + j)] = valid[static_cast<size_t>(r * span + j)];
    return nn::causal_keep_mask(b, t, past, v, m.device());
  };
  std::vector<std::vector<int64_t>> history(prompts.begin(), prompts.end());
  std::vector<bool> done(prompts.size(), false);
  for (size_t r = nreal; r < prompts.size(); ++r) done[r] = true;
  std::mt19937_64 rng(cfg.seed);
  const std::set<int64_t> stops(cfg.stop_tokens.begin(), cfg.stop_tokens.end());

  // Compiled decoding: position-dependent inputs as tensors over the whole cache.
  auto static_step = [&](const std::vector<int64_t>& next, const std::vector<int64_t>& p) {
    const int64_t past = cache.length();
    std::vector<bool> keep(static_cast<size_t>(b * cap), false);
    // Slot s holds position s, or in a ring the latest position p <= past with p % cap == s.
    for (int64_t r = 0; r < b; ++r)
      for (int64_t s = 0; s < cap; ++s) {
        const int64_t j = cache.ring() ? past - ((past - s) % cap + cap) % cap : s;
        if (j >= 0 && j <= past)
          keep[static_cast<size_t>(r * cap + s)] = valid[static_cast<size_t>(r * span + j)] != 0 || j == past;
      }
    auto [cos, sin] = m.rope_tables(p, b);
    Tensor out = slot->step(from_vector(next, Shape{b, 1}, TensorOptions(DType::i64, m.device())), cos, sin,
                          from_vector(keep, Shape{b, 1, 1, cap}, TensorOptions(DType::boolean, m.device())),
                          codegen::position_tensor(cache.ring() ? past % cap : past, m.device()));
    cache.advance(1);
    return out;
  };

  // The prompt: logits of its last position only (the one the first token is chosen from; the
  // rows are left-padded, so it is every row's last real token), a vocab-sized product per row
  // instead of one per prompt token.
  Tensor logits;
  {
    auto [cos, sin] = m.rope_tables(pos, b);
    const Tensor keep = keep_mask(plen);
    const Tensor h = m.hidden_states(from_vector(ids, Shape{b, plen}, TensorOptions(DType::i64, m.device())), cos, sin,
                                     &cache, keep);
    cache.advance(plen);
    logits = m.logits(narrow(h, 1, plen - 1, 1));
  }
  for (int64_t step = 0; step < steps; ++step) {
    // The last position's logits of every row, on the host in f32 (read in place on the cpu).
    const Tensor lt = to(select(logits, 1, logits.size(1) - 1), DType::f32);
    std::vector<float> host;
    const float* last = nullptr;
    if (lt.device().type == DeviceType::cpu && lt.is_contiguous()) {
      last = lt.data<float>();
    } else {
      host = lt.to_vector<float>();
      last = host.data();
    }
    std::vector<int64_t> next(prompts.size(), cfg.pad_token_id);
    for (size_t r = 0; r < prompts.size(); ++r) {
      if (done[r]) continue;
      const float* row = last + r * static_cast<size_t>(vocab);
      // Greedy without a penalty: the first largest logit (choose_token's answer, without a copy).
      const int64_t t = !cfg.do_sample && cfg.repetition_penalty == 1.0
                            ? first_argmax(row, vocab)
                            : choose_token(std::vector<float>(row, row + vocab), history[r], cfg, rng);
      next[r] = t;
      out[r].push_back(t);
      history[r].push_back(t);
      if (stops.count(t) || (on_token && !on_token(r, t))) done[r] = true;
    }
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; }) || step + 1 == steps) break;
    // Decode one token per row (finished rows feed padding that no one reads).
    std::vector<int64_t> p(prompts.size());
    for (size_t r = 0; r < prompts.size(); ++r) {
      p[r] = next_pos[r]++;
      valid[r * static_cast<size_t>(span) + static_cast<size_t>(cache.length())] = 1;
    }
    if (cfg.compile)
      logits = static_step(next, p);
    else
      logits = m.forward(from_vector(next, Shape{b, 1}, TensorOptions(DType::i64, m.device())), &cache, p, keep_mask(1));
  }
  return out;
}

}  // namespace tpu::models
