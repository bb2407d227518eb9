// The small transformer language model of the sharded-training tests, its data and training
// loop helpers. Every rank builds the same model from the same seed; the reference is this model
// trained in one process on the whole global batch, with no sharding code involved.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tpucore/dist.h"
#include "tpucore/nn.h"
#include "tpucore/nn/parallel/fsdp.h"

namespace sharded_test {

using namespace tpu;

inline int g_failures = 0, g_checks = 0;
inline void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok && ++g_failures < 30) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
}

struct Config {
  int64_t vocab = 29, hidden = 16, heads = 4, kv_heads = 2, inter = 24, layers = 2;
};

// Pre-norm block: x + attn(norm(x)); h + mlp(norm(h)). Causal attention with grouped KV heads
// and q/k RMSNorm (no rotary).
struct Block : nn::Module {
  std::shared_ptr<nn::RMSNorm> norm1, norm2;
  std::shared_ptr<nn::Attention> attn;
  std::shared_ptr<nn::GatedMLP> mlp;
  Block(const Config& c, Generator* g) {
    norm1 = register_module("norm1", std::make_shared<nn::RMSNorm>(Shape{c.hidden}, 1e-6));
    nn::AttentionConfig ac;
    ac.hidden = c.hidden;
    ac.num_heads = c.heads;
    ac.num_kv_heads = c.kv_heads;
    ac.qk_norm = true;
    attn = register_module("attn", std::make_shared<nn::Attention>(ac, g));
    norm2 = register_module("norm2", std::make_shared<nn::RMSNorm>(Shape{c.hidden}, 1e-6));
    mlp = register_module("mlp", std::make_shared<nn::GatedMLP>(c.hidden, c.inter, "silu", false, g));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = add(x, attn->forward(norm1->forward(x)));
    return add(h, mlp->forward(norm2->forward(h)));
  }
};

struct TinyLM : nn::Module {
  std::shared_ptr<nn::Embedding> embed;
  std::vector<std::shared_ptr<nn::Module>> blocks;  // FSDP replaces them by their handles
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> head;
  explicit TinyLM(const Config& c, uint64_t seed = 7) {
    Generator g(seed);
    embed = register_module("embed", std::make_shared<nn::Embedding>(c.vocab, c.hidden, &g));
    for (int64_t i = 0; i < c.layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), std::make_shared<Block>(c, &g)));
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(Shape{c.hidden}, 1e-6));
    head = register_module("head", std::make_shared<nn::Linear>(c.hidden, c.vocab, true, &g));
  }
  Tensor forward(const Tensor& ids) override {
    Tensor h = embed->forward(ids);
    for (auto& b : blocks) h = b->forward(h);
    return head->forward(norm->forward(h));
  }
};

// Token ids of the global batch of step `step`: [batch, seq + 1] (inputs and shifted targets).
inline Tensor batch_tokens(int step, int64_t batch, int64_t seq, int64_t vocab) {
  std::vector<int64_t> v(static_cast<size_t>(batch * (seq + 1)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 7 + static_cast<size_t>(step) * 13 + i * i) % static_cast<size_t>(vocab));
  return from_vector(v, Shape{batch, seq + 1});
}

inline Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  const int64_t v = logits.size(-1);
  Tensor l = logits.dtype() == DType::f32 ? logits : logits.to(DType::f32);
  return nn::cross_entropy(l.reshape(Shape{-1, v}), targets.reshape(Shape{-1}));
}

// One-process training on the whole global batch (worker_fsdp.cpp).
struct Reference {
  std::vector<double> losses;
  std::map<std::string, Tensor> grads0;  // gradients of the first step
  nn::StateDict final_params;
};
Reference train_reference(const Config& c, const std::string& opt_kind, bool mixed, int steps);
std::unique_ptr<optim::Optimizer> make_opt(const std::string& kind, std::vector<Tensor> params);
inline constexpr int64_t kBatch = 4, kSeq = 6;

// Rows of `full` a rank holds when split into `world` chunks along dim 0 (as fully_shard does).
inline Tensor my_rows(const Tensor& full, int rank, int world) {
  const int64_t rows = full.dim() ? full.size(0) : 1;
  const int64_t chunk = (rows + world - 1) / world;
  const int64_t first = std::min(rows, rank * chunk), n = std::max<int64_t>(0, std::min(chunk, rows - rank * chunk));
  Tensor f = full.dim() ? full : full.reshape(Shape{1});
  return narrow(f, 0, first, n);
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to(DType::f32).contiguous().to_vector<float>(), y = b.to(DType::f32).contiguous().to_vector<float>();
  if (x.size() != y.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(x[i]) - y[i]));
  return m;
}

// Step 0 of a sharded run against the one-process reference: each parameter of `m` holds a
// gradient within 1e-5 of want(name), the reference's gradient cut to this rank's part.
inline void check_step0_grads(nn::Module& m, const std::function<Tensor(const std::string&)>& want) {
  for (auto& [n, p] : m.named_parameters()) {
    const double d = p.grad().defined() ? max_abs_diff(p.grad(), want(n)) : INFINITY;
    check(d <= 1e-5, fmt::format("step 0 gradient of {}: max diff {}", n, d));
  }
}

// The parameters a sharded run ends with: the full state dict from FSDP's root, else `m`'s own.
inline nn::StateDict final_params(const std::shared_ptr<nn::parallel::FSDPModule>& root, nn::Module& m) {
  if (root) return root->full_state_dict();
  nn::StateDict got;
  for (auto& [n, p] : m.named_parameters()) got[n] = p.detach();
  return got;
}

// The end of a sharded run against the one-process reference: every final parameter (the full
// state dict from FSDP's root, or the rank's own parameters) equals `part(name, reference)`, the
// slice this rank holds, within 1e-4.
inline void check_final_params(const nn::StateDict& got, const nn::StateDict& reference,
                               const std::function<Tensor(const std::string&, const Tensor&)>& part) {
  check(got.size() == reference.size(), "every parameter is there");
  for (auto& [n, want] : reference) {
    auto it = got.find(n);
    check(it != got.end(), "has " + n);
    if (it == got.end()) continue;
    const double d = max_abs_diff(it->second, part(n, want));
    check(d <= 1e-4, fmt::format("final {}: max diff {} to the reference slice", n, d));
  }
}

// Runs f and checks that it throws a tpu::Error whose message mentions `must`.
inline void check_error(const std::function<void()>& f, const char* must, const std::string& what) {
  try {
    f();
  } catch (const tpu::Error& e) {
    check(std::strstr(e.what(), must) != nullptr, what + ": '" + e.what() + "' should mention '" + must + "'");
    return;
  }
  check(false, what + ": no tpu::Error");
}

inline double max_abs(const Tensor& a) {
  double m = 0;
  for (float x : a.to(DType::f32).contiguous().to_vector<float>()) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

}  // namespace sharded_test
