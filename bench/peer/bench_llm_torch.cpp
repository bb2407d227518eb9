// Peer benchmark: the decode loop of bench_llm in libtorch. The same Llama-layout model
// (RMSNorm, q/k/v/o projections, rotate-half rotary embedding, grouped KV heads repeated as
// Hugging Face's repeat_kv does, SwiGLU MLP, tied embedding as the head), f32 on the cpu with two
// threads, random weights, and the same loop: a prefill of an 8-token prompt (logits of every
// position), then greedy decoding through a preallocated KV cache until 32 tokens are generated
// (31 decode steps), argmax of the last position's logits taken on the host. Run it next to
// bench_llm and compare tokens/s and tokens/cpu_s (process CPU time, all threads) of the same
// model and batch.
// libtorch 1.13 has no fused scaled_dot_product_attention: the attention is written out (two
// matmuls and a softmax), as in the Hugging Face eager implementation of that time.
#include <benchmark/benchmark.h>
#include <time.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

namespace {

// CPU time of the whole process (every thread): on a host shared with other work, wall time
// also counts the waits for a core; tokens per CPU-second does not.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Shape {
  int64_t vocab, hidden, inter, layers, heads, kv_heads;
};
// The same shapes as bench_llm: 0 the fortunes model, 1 ~28M parameters, 2 ~100M parameters.
Shape shape(int which) {
  if (which == 0) return {257, 128, 384, 3, 4, 2};
  if (which == 1) return {32000, 512, 1536, 4, 8, 2};
  return {32000, 768, 2048, 12, 12, 4};
}

struct Layer {
  torch::Tensor ln1, ln2, wq, wk, wv, wo, wg, wu, wd;
};

class Model {
 public:
  explicit Model(const Shape& s) : s_(s), d_(s.hidden / s.heads) {
    torch::manual_seed(1);
    auto w = [](int64_t out, int64_t in) { return torch::randn({out, in}) / std::sqrt(double(in)); };
    emb_ = torch::randn({s.vocab, s.hidden}) * 0.02;
    for (int64_t i = 0; i < s.layers; ++i)
      layers_.push_back({torch::ones({s.hidden}), torch::ones({s.hidden}), w(s.heads * d_, s.hidden),
                         w(s.kv_heads * d_, s.hidden), w(s.kv_heads * d_, s.hidden), w(s.hidden, s.heads * d_),
                         w(s.inter, s.hidden), w(s.inter, s.hidden), w(s.hidden, s.inter)});
    norm_ = torch::ones({s.hidden});
    std::vector<float> f(static_cast<size_t>(d_ / 2));
    for (int64_t i = 0; i < d_ / 2; ++i) f[size_t(i)] = float(std::pow(10000.0, -2.0 * double(i) / double(d_)));
    inv_freq_ = torch::tensor(f);
  }
  int64_t parameters() const {
    int64_t n = emb_.numel() + norm_.numel();
    for (const Layer& l : layers_)
      for (const auto* t : {&l.ln1, &l.ln2, &l.wq, &l.wk, &l.wv, &l.wo, &l.wg, &l.wu, &l.wd}) n += t->numel();
    return n;
  }
  void reset_cache(int64_t batch, int64_t capacity) {
    kc_.clear();
    vc_.clear();
    for (int64_t i = 0; i < s_.layers; ++i) {
      kc_.push_back(torch::zeros({batch, s_.kv_heads, capacity, d_}));
      vc_.push_back(torch::zeros({batch, s_.kv_heads, capacity, d_}));
    }
    len_ = 0;
  }
  // ids [B, T] -> logits [B, T, vocab]; appends to the cache.
  torch::Tensor forward(const torch::Tensor& ids) {
    const int64_t b = ids.size(0), t = ids.size(1);
    const torch::Tensor pos = torch::arange(len_, len_ + t, torch::kFloat);
    const torch::Tensor ang = torch::outer(pos, inv_freq_);
    const torch::Tensor cos = torch::cat({ang, ang}, -1).cos(), sin = torch::cat({ang, ang}, -1).sin();
    torch::Tensor x = torch::embedding(emb_, ids);
    torch::Tensor mask;
    if (t > 1) mask = torch::full({t, len_ + t}, -INFINITY).triu(len_ + 1);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      torch::Tensor h = rms(x, l.ln1);
      auto heads = [&](const torch::Tensor& y, int64_t n) { return y.view({b, t, n, d_}).transpose(1, 2); };
      torch::Tensor q = rope(heads(torch::linear(h, l.wq), s_.heads), cos, sin);
      torch::Tensor k = rope(heads(torch::linear(h, l.wk), s_.kv_heads), cos, sin);
      torch::Tensor v = heads(torch::linear(h, l.wv), s_.kv_heads);
      kc_[i].narrow(2, len_, t).copy_(k);
      vc_[i].narrow(2, len_, t).copy_(v);
      const int64_t g = s_.heads / s_.kv_heads;
      const torch::Tensor kk = kc_[i].narrow(2, 0, len_ + t).repeat_interleave(g, 1);
      const torch::Tensor vv = vc_[i].narrow(2, 0, len_ + t).repeat_interleave(g, 1);
      torch::Tensor sc = torch::matmul(q, kk.transpose(-1, -2)) / std::sqrt(double(d_));
      if (mask.defined()) sc = sc + mask;
      torch::Tensor a = torch::matmul(torch::softmax(sc, -1), vv).transpose(1, 2).reshape({b, t, s_.heads * d_});
      x = x + torch::linear(a, l.wo);
      h = rms(x, l.ln2);
      x = x + torch::linear(torch::silu(torch::linear(h, l.wg)) * torch::linear(h, l.wu), l.wd);
    }
    len_ += t;
    return torch::linear(rms(x, norm_), emb_);
  }

 private:
  static torch::Tensor rms(const torch::Tensor& x, const torch::Tensor& w) {
    return x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * w;
  }
  torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) const {
    const torch::Tensor x1 = x.narrow(-1, 0, d_ / 2), x2 = x.narrow(-1, d_ / 2, d_ / 2);
    return x * cos + torch::cat({-x2, x1}, -1) * sin;
  }
  Shape s_;
  int64_t d_;
  torch::Tensor emb_, norm_, inv_freq_;
  std::vector<Layer> layers_;
  std::vector<torch::Tensor> kc_, vc_;
  int64_t len_ = 0;
};

// 32 greedy tokens per row after an 8-token prompt (1..8), as bench_llm's generate().
int64_t generate(Model& m, int64_t batch) {
  constexpr int64_t kPrompt = 8, kNew = 32;
  m.reset_cache(batch, kPrompt + kNew);
  torch::Tensor ids = torch::arange(1, kPrompt + 1, torch::kLong).repeat({batch, 1});
  torch::Tensor logits = m.forward(ids);
  int64_t produced = 0;
  for (int64_t step = 0; step < kNew; ++step) {
    const torch::Tensor next = logits.select(1, logits.size(1) - 1).argmax(-1).contiguous();
    std::vector<int64_t> host(next.data_ptr<int64_t>(), next.data_ptr<int64_t>() + batch);  // on the host
    produced += batch;
    if (step + 1 == kNew) break;
    logits = m.forward(torch::from_blob(host.data(), {batch, 1}, torch::kLong).clone());
  }
  return produced;
}

void BM_decode(benchmark::State& st) {
  torch::set_num_threads(2);
  torch::NoGradGuard ng;
  const int which = static_cast<int>(st.range(0));
  const int64_t batch = st.range(1);
  Model m(shape(which));
  generate(m, batch);  // warm up
  int64_t tokens = 0;
  const double cpu0 = process_cpu_seconds();
  for (auto _ : st) tokens += generate(m, batch);
  st.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  st.counters["tokens/cpu_s"] = static_cast<double>(tokens) / (process_cpu_seconds() - cpu0);
  st.SetLabel(std::to_string(m.parameters()) + " params, batch " + std::to_string(batch) + ", libtorch eager");
}

}  // namespace

BENCHMARK(BM_decode)
    ->ArgsProduct({{0, 1, 2}, {1, 16}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(1.0);

BENCHMARK_MAIN();
