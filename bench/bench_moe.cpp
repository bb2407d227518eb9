// A Mixtral-shaped mixture-of-experts layer on the host (nn::SparseMoE: router, top-2 of 8,
// grouped_matmul over the tokens sorted by expert, weighted combine) at 64 tokens, against one
// dense product of the same FLOPs: the 128 routed rows (64 tokens x 2) through one expert's
// [H -> 2F] and [F -> H] products as plain linears. Counters: GFLOP/s of the expert products
// (2 x 128 x 3 x H x F) and, on the MoE run, `dense_ratio` = dense time / MoE time (1.0: the
// grouped layer runs as fast as the dense products of the same FLOPs). bf16 weights and
// activations. Arguments: tokens, hidden, expert width (Mixtral: 4096 and 14336; the default
// runs half the width to keep the 8 experts' 1.4 GB of bf16 weights within a shared machine).
//
// On a machine whose dense product runs from memory (AMX tiles make 128 rows of a 4096 x 28672
// product bound by reading its 176 MB of bf16 weight), the ratio is bounded by bytes, not FLOPs:
// the layer must read all 8 experts' weights (8 x the dense block's) for the same FLOPs. So both
// runs also report the bandwidth they reach: `moe_GBps` (the weights of the experts that got
// tokens / the layer's time), `dense_GBps` (the dense block's weight bytes / its time), and
// `stream_GBps`, a read of a 512 MiB buffer in the same iteration by the fastest of the stream
// peer's variants (BM_StreamRead: threads, streams per thread, 64- or 512-bit loads, software
// prefetch distance; the fastest is picked when the benchmark starts and named in its label),
// with `moe_stream_frac` = moe_GBps / stream_GBps and `ratio_bound` = dense time / (the weights /
// stream_GBps): the dense_ratio a layer that did nothing but read its weights at the peer's rate
// would reach. The layer's run also times its experts alone on its sorted slots (`experts_ms`;
// `rest_ms` = the layer's time less that: router, sort, permute, combine) and as one linear per
// expert on the same slots (`experts_loop_ms`). BM_GroupedMatmulStream times one of the layer's two grouped matmuls alone against
// the same peer (`gmm_stream_frac`), and the same products as one linear per expert in the same
// iterations (`loop_GBps`: each expert's product on its own, the threads joining after each).
//
// BM_MoEFfnFusedVsChain: the expert part of the same layer (after the router) as the fused node
// moe_ffn of compiled inference graphs (graph pass fuse_moe) against the chain it replaces, run
// op by op (moe_sort, moe_permute, two grouped matmuls with SwiGLU, moe_unpermute), on the same
// routing; counters fused_ms, chain_ms, `speedup` = chain / fused, and `dense_ratio` = the dense
// block's time / the fused node's time.
//
// BM_MoEFfnSimFusedVsChain: the same node on a simulated chip (sim:1 set to the preset named by
// the first argument: 0 v5e-ideal, 1 v5e), executed (not timing-only: the chain's permute reads
// the order its sort computed), bf16, at a Mixtral-like small shape: the fused program
// (codegen/moe_ffn_kernel.cpp) against the chain op by op (moe_sort, moe_permute, two
// grouped_matmul, the SwiGLU product, moe_unpermute). Counters: simulated cycles of each
// (fused_cycles, chain_cycles), `speedup` = chain / fused, programs run per call of each, HBM
// bytes read and written by each (fused_HBM_MB, chain_HBM_MB), and weight_read_cycles: the
// bound set by reading the weights of the experts that have tokens once at peak bandwidth.
#include <benchmark/benchmark.h>

#include <immintrin.h>

#include <chrono>
#include <algorithm>
#include <vector>

#include "codegen/launch.h"
#include "device/sim_driver.h"
#include "ops/registry.h"
#include "sim/presets.h"
#include "tpucore/autograd.h"
#include "tpucore/moe_ops.h"
#include "tpucore/nn/moe.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/core/parallel.h"

namespace {

using namespace tpu;

constexpr int64_t kExperts = 8, kTopK = 2;

double expert_flops(int64_t tokens, int64_t h, int64_t f) {
  return 2.0 * static_cast<double>(tokens * kTopK) * 3.0 * static_cast<double>(h) * static_cast<double>(f);
}

// One dense block of the same FLOPs: [T k, H] -> [T k, 2F] -> act * -> [T k, H].
struct Dense {
  Tensor w1, w2;
  Dense(int64_t h, int64_t f, Generator& g)
      : w1(to(rand({2 * f, h}, {}, &g), DType::bf16)), w2(to(rand({h, f}, {}, &g), DType::bf16)) {}
  Tensor operator()(const Tensor& x) const {
    const int64_t f = w2.size(1);
    Tensor a = linear(x, w1);
    return linear(mul(silu(narrow(a, 1, 0, f)), narrow(a, 1, f, f)), w2);
  }
};

// Reads of a buffer over the pool's threads, the peer the layer's weight streaming is held
// against. Each variant is one way of reading memory as fast as it goes: `threads` threads (each
// a contiguous share of the buffer), each splitting its share into `streams` parts read side by
// side one cache line of each at a time (as a kernel reading 16 weight rows does), with 64-bit
// scalar loads (four independent sums, so the loads and not an add chain bound it) or 512-bit
// loads, and an optional software prefetch `prefetch` cache lines ahead of each stream (into the
// L1d, or the L2 with `l2`). BM_StreamRead reports each; the layer benchmarks time the fastest.
struct StreamVariant {
  const char* name;
  int threads;    // 0: all of the pool's threads
  int streams;    // parts of a thread's share read side by side
  bool wide;      // 512-bit loads (AVX-512), else 64-bit scalar loads
  int prefetch;   // cache lines ahead of each stream, 0: none
  bool l2;        // prefetch into the L2 instead of the L1d
};
constexpr StreamVariant kStreamVariants[] = {
    {"scalar-1x1", 0, 1, false, 0, false},    {"zmm-1x1", 0, 1, true, 0, false},
    {"zmm-1x1-pf16", 0, 1, true, 16, false},  {"zmm-1x1-pf64", 0, 1, true, 64, false},
    {"zmm-1x1-pf64-l2", 0, 1, true, 64, true}, {"zmm-4", 0, 4, true, 0, false},
    {"zmm-8", 0, 8, true, 0, false},          {"zmm-16", 0, 16, true, 0, false},
    {"zmm-4-pf16", 0, 4, true, 16, false},    {"zmm-16-pf8-l2", 0, 16, true, 8, true},
    {"zmm-1thread", 1, 1, true, 0, false},
};
constexpr int kNumStreamVariants = static_cast<int>(sizeof(kStreamVariants) / sizeof(kStreamVariants[0]));

inline void prefetch_line(const char* p, bool l2) {
  if (l2) _mm_prefetch(p, _MM_HINT_T1);
  else _mm_prefetch(p, _MM_HINT_T0);
}

// Sums lines [b, e) of `base` (64-byte lines) as `streams` parts side by side.
uint64_t read_scalar(const char* base, int64_t b, int64_t e, int streams, int prefetch, bool l2) {
  const int64_t len = (e - b) / streams;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int64_t i = 0; i < len; ++i)
    for (int s = 0; s < streams; ++s) {
      const int64_t line = b + s * len + i;
      if (prefetch > 0 && i + prefetch < len) prefetch_line(base + (line + prefetch) * 64, l2);
      const auto* p = reinterpret_cast<const uint64_t*>(base + line * 64);
      s0 += p[0] + p[4];
      s1 += p[1] + p[5];
      s2 += p[2] + p[6];
      s3 += p[3] + p[7];
    }
  for (int64_t line = b + streams * len; line < e; ++line) s0 += *reinterpret_cast<const uint64_t*>(base + line * 64);
  return s0 + s1 + s2 + s3;
}

__attribute__((target("avx512f"))) uint64_t read_wide(const char* base, int64_t b, int64_t e, int streams,
                                                       int prefetch, bool l2) {
  const int64_t len = (e - b) / streams;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  // Four lines of each stream per step: four independent adds.
  for (; i + 4 <= len; i += 4)
    for (int s = 0; s < streams; ++s) {
      const char* p = base + (b + s * len + i) * 64;
      if (prefetch > 0 && i + prefetch + 4 <= len)
        for (int k = 0; k < 4; ++k) prefetch_line(p + (prefetch + k) * 64, l2);
      a0 = _mm512_add_epi64(a0, _mm512_load_si512(p));
      a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + 64));
      a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + 128));
      a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + 192));
    }
  for (; i < len; ++i)
    for (int s = 0; s < streams; ++s) a0 = _mm512_add_epi64(a0, _mm512_load_si512(base + (b + s * len + i) * 64));
  for (int64_t line = b + streams * len; line < e; ++line) a1 = _mm512_add_epi64(a1, _mm512_load_si512(base + line * 64));
  alignas(64) uint64_t w[8];
  _mm512_store_si512(w, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t sum = 0;
  for (uint64_t x : w) sum += x;
  return sum;
}

struct StreamRead {
  std::vector<uint64_t> buf;  // 64-byte aligned lines (std::vector of 8-byte words: aligned below)
  const char* base = nullptr;
  int64_t lines = 0;
  explicit StreamRead(size_t bytes) : buf(bytes / sizeof(uint64_t) + 8, 1) {
    const auto a = reinterpret_cast<uintptr_t>(buf.data());
    base = reinterpret_cast<const char*>((a + 63) / 64 * 64);
    lines = static_cast<int64_t>(bytes / 64);
  }
  static bool available(const StreamVariant& v) { return !v.wide || cpu_features().avx512f; }
  // One read of the buffer by variant `v`: returns seconds.
  double operator()(const StreamVariant& v) const {
    const int threads = v.threads > 0 ? std::min(v.threads, num_threads()) : num_threads();
    std::vector<uint64_t> part(static_cast<size_t>(threads) * 8, 0);  // a cache line per thread
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t per = (lines + threads - 1) / threads;
    parallel_for(0, threads, 1, [&](int64_t t0_, int64_t t1_) {
      for (int64_t t = t0_; t < t1_; ++t) {
        const int64_t b = t * per, e = std::min(lines, b + per);
        part[static_cast<size_t>(t) * 8] = v.wide ? read_wide(base, b, e, v.streams, v.prefetch, v.l2)
                                                  : read_scalar(base, b, e, v.streams, v.prefetch, v.l2);
      }
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    uint64_t total = 0;
    for (uint64_t x : part) total += x;
    benchmark::DoNotOptimize(total);
    return s;
  }
  double gb() const { return static_cast<double>(lines) * 64e-9; }
  // The fastest variant here: each available one read twice, the best time kept.
  const StreamVariant& best() const {
    int bi = 0;
    double bt = 1e30;
    for (int i = 0; i < kNumStreamVariants; ++i) {
      if (!available(kStreamVariants[i])) continue;
      const double t = std::min((*this)(kStreamVariants[i]), (*this)(kStreamVariants[i]));
      if (t < bt) {
        bt = t;
        bi = i;
      }
    }
    return kStreamVariants[bi];
  }
};
constexpr size_t kStreamBytes = size_t{512} << 20;

// Bytes of bf16 expert weights (gate, up and down) of `experts` experts.
double expert_weight_gb(int64_t experts, int64_t h, int64_t f) {
  return static_cast<double>(experts) * 3.0 * static_cast<double>(h) * static_cast<double>(f) * 2.0 * 1e-9;
}

// The times are totals over `n` iterations; the bytes are one iteration's.
void bandwidth_counters(benchmark::State& state, int64_t n, double moe_s, double dense_s, double stream_s,
                        double moe_gb, double dense_gb, double stream_gb) {
  const double k = static_cast<double>(std::max<int64_t>(n, 1));
  moe_s /= k;
  dense_s /= k;
  stream_s /= k;
  state.counters["moe_GBps"] = moe_gb / moe_s;
  state.counters["dense_GBps"] = dense_gb / dense_s;
  state.counters["stream_GBps"] = stream_gb / stream_s;
  state.counters["moe_stream_frac"] = (moe_gb / moe_s) / (stream_gb / stream_s);
  // The best dense_ratio reachable here if the layer read its weights at the stream peer's rate
  // (and did nothing else): the dense block's time over moe_gb / stream_GBps.
  state.counters["ratio_bound"] = dense_s / (moe_gb / (stream_gb / stream_s));
}

// The stream peer's variants one by one (argument: the index in kStreamVariants), 512 MiB each.
void BM_StreamRead(benchmark::State& state) {
  const StreamVariant& v = kStreamVariants[state.range(0)];
  if (!StreamRead::available(v)) {
    state.SkipWithError("needs AVX-512");
    return;
  }
  const StreamRead stream(kStreamBytes);
  stream(v);  // pages touched, pool started
  double total = 0;
  for (auto _ : state) {
    const double dt = stream(v);
    total += dt;
    state.SetIterationTime(dt);
  }
  state.SetLabel(v.name);
  state.counters["GBps"] = stream.gb() * static_cast<double>(state.iterations()) / total;
}
BENCHMARK(BM_StreamRead)->DenseRange(0, kNumStreamVariants - 1)->Unit(benchmark::kMillisecond)->UseManualTime();

struct SparseMoE_Slots {
  Tensor xs, counts;
};
// The layer's routed slots of x sorted by expert, and the count of each expert.
SparseMoE_Slots sorted_slots(nn::SparseMoE& moe, const Tensor& x) {
  const nn::SparseMoE::Routing r = moe.route(x);
  auto [order, counts] = moe_sort(r.experts, moe.cfg.num_experts);
  return {moe_permute(reshape(x, Shape{-1, moe.cfg.hidden}), order, moe.cfg.top_k), counts};
}

// The same experts on the same sorted slots as one linear per expert (gate/up, SwiGLU, down):
// each expert's products on their own, the threads joining after each.
Tensor experts_per_expert(nn::SparseMoE& moe, const SparseMoE_Slots& s) {
  const std::vector<int64_t> counts = s.counts.to(DType::i64).to_vector<int64_t>();
  const Tensor& w1 = moe.experts->gate_up_proj;
  const Tensor& w2 = moe.experts->down_proj;
  const int64_t f = w2.size(2);
  std::vector<Tensor> parts;
  int64_t row = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    const Tensor hh = linear(narrow(s.xs, 0, row, counts[e]), select(w1, 0, static_cast<int64_t>(e)));
    parts.push_back(linear(mul(silu(narrow(hh, 1, 0, f)), narrow(hh, 1, f, f)), select(w2, 0, static_cast<int64_t>(e))));
    row += counts[e];
  }
  return cat(parts, 0);
}

void BM_MixtralMoELayer(benchmark::State& state) {
  const int64_t tokens = state.range(0), h = state.range(1), f = state.range(2);
  NoGradGuard ng;
  Generator g(1);
  nn::MoEConfig c;
  c.hidden = h;
  c.intermediate = f;
  c.num_experts = kExperts;
  c.top_k = kTopK;
  nn::SparseMoE moe(c, &g);
  moe.to(DType::bf16);
  moe.eval();
  const Tensor x = to(randn({tokens, h}, {}, &g), DType::bf16);
  Dense dense(h, f, g);
  const Tensor xd = to(randn({tokens * kTopK, h}, {}, &g), DType::bf16);
  benchmark::DoNotOptimize(moe(x).raw_data());  // warm-up (scratch buffers, thread pool)
  benchmark::DoNotOptimize(dense(xd).raw_data());
  const StreamRead stream(kStreamBytes);
  const StreamVariant& peer = stream.best();
  state.SetLabel(std::string("stream peer ") + peer.name);
  // All timed in every iteration, so a shared machine's load falls on each alike.
  // The experts alone (two grouped matmuls and SwiGLU) on the layer's routed slots, sorted once:
  // the rest of the layer's time is its router, sort, permute and combine.
  const SparseMoE_Slots slots = sorted_slots(moe, x);
  double moe_total = 0, dense_total = 0, stream_total = 0, experts_total = 0, loop_total = 0;
  int64_t n = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    Tensor y = moe(x);
    benchmark::DoNotOptimize(y.raw_data());
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    moe_total += dt;
    state.SetIterationTime(dt);
    state.PauseTiming();
    t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(moe.experts->forward(slots.xs, slots.counts).raw_data());
    experts_total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(experts_per_expert(moe, slots).raw_data());
    loop_total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(dense(xd).raw_data());
    dense_total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stream_total += stream(peer);
    state.ResumeTiming();
    ++n;
  }
  const double dense_s = dense_total / static_cast<double>(std::max<int64_t>(n, 1));
  state.counters["GFLOP/s"] =
      benchmark::Counter(expert_flops(tokens, h, f) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["dense_ms"] = dense_s * 1e3;
  state.counters["dense_ratio"] = dense_total / moe_total;
  state.counters["experts_ms"] = experts_total / static_cast<double>(std::max<int64_t>(n, 1)) * 1e3;
  state.counters["experts_loop_ms"] = loop_total / static_cast<double>(std::max<int64_t>(n, 1)) * 1e3;
  state.counters["rest_ms"] = (moe_total - experts_total) / static_cast<double>(std::max<int64_t>(n, 1)) * 1e3;
  // With 2 x tokens routed slots over 8 experts (128 at 64 tokens) every expert gets tokens.
  bandwidth_counters(state, n, moe_total, dense_total, stream_total, expert_weight_gb(kExperts, h, f),
                     expert_weight_gb(1, h, f), stream.gb());
}
BENCHMARK(BM_MixtralMoELayer)->Args({64, 4096, 7168})->Unit(benchmark::kMillisecond)->UseManualTime();
// A small shape for a quick run.
BENCHMARK(BM_MixtralMoELayer)->Args({64, 1024, 3584})->Unit(benchmark::kMillisecond)->UseManualTime();

// One grouped matmul of the layer alone, the 8 experts' weights [8, N, K] read in place, 2 x
// tokens rows in 8 equal groups (Mixtral's gate/up product: N 2F, K H; its down product: N H,
// K F), against the stream peer in the same iteration: `gmm_GBps` (the weights / its time) and
// `gmm_stream_frac` = gmm_GBps / stream_GBps; `loop_GBps`: the same products as one linear per
// expert (a GEMM call each), timed in the same iterations.
void BM_GroupedMatmulStream(benchmark::State& state) {
  const int64_t rows = state.range(0), n = state.range(1), k = state.range(2);
  NoGradGuard ng;
  Generator g(4);
  const Tensor x = to(randn({rows, k}, {}, &g), DType::bf16);
  const Tensor w = to(mul(rand({kExperts, n, k}, {}, &g), 0.02), DType::bf16);
  const Tensor sizes = from_vector(std::vector<int64_t>(kExperts, rows / kExperts), Shape{kExperts});
  benchmark::DoNotOptimize(grouped_matmul(x, w, sizes, true).raw_data());
  const StreamRead stream(kStreamBytes);
  const StreamVariant& peer = stream.best();
  state.SetLabel(std::string("stream peer ") + peer.name);
  double gmm_total = 0, stream_total = 0, loop_total = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(grouped_matmul(x, w, sizes, true).raw_data());
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gmm_total += dt;
    state.SetIterationTime(dt);
    stream_total += stream(peer);
    const auto t1 = std::chrono::steady_clock::now();
    for (int64_t e = 0; e < kExperts; ++e)
      benchmark::DoNotOptimize(linear(narrow(x, 0, e * (rows / kExperts), rows / kExperts), select(w, 0, e)).raw_data());
    loop_total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  const double it = static_cast<double>(state.iterations());
  const double gb = static_cast<double>(kExperts * n * k * 2) * 1e-9;
  state.counters["gmm_GBps"] = gb * it / gmm_total;
  state.counters["loop_GBps"] = gb * it / loop_total;
  state.counters["stream_GBps"] = stream.gb() * it / stream_total;
  state.counters["gmm_stream_frac"] = (gb / gmm_total) / (stream.gb() / stream_total);
}
BENCHMARK(BM_GroupedMatmulStream)->Args({128, 14336, 4096})->Unit(benchmark::kMillisecond)->UseManualTime();
BENCHMARK(BM_GroupedMatmulStream)->Args({128, 4096, 7168})->Unit(benchmark::kMillisecond)->UseManualTime();

// The MoE layer after its router as the fused moe_ffn node, and as the chain of ops it replaces
// (sort, permute, gate/up, SwiGLU over width f, down, weighted unpermute).
Tensor moe_fused(const Tensor& x, const Tensor& ids, const Tensor& w, const Tensor& w1, const Tensor& w2) {
  static const ops::OpDef& op = *ops::find_op("moe_ffn");
  return ops::call(op, {x, ids, w, w1, w2}, {{"num_experts", kExperts}, {"top_k", kTopK}});
}

Tensor moe_chain(const Tensor& x, const Tensor& ids, const Tensor& w, const Tensor& w1, const Tensor& w2, int64_t f) {
  auto [order, sizes] = moe_sort(ids, kExperts);
  Tensor hh = grouped_matmul(moe_permute(x, order, kTopK), w1, sizes, true);
  Tensor a = mul(silu(narrow(hh, 1, 0, f)), narrow(hh, 1, f, f));
  return moe_unpermute(grouped_matmul(a, w2, sizes, true), order, w, kTopK);
}

void BM_MoEFfnFusedVsChain(benchmark::State& state) {
  const int64_t tokens = state.range(0), h = state.range(1), f = state.range(2);
  NoGradGuard ng;
  Generator g(2);
  const Tensor x = to(randn({tokens, h}, {}, &g), DType::bf16);
  const Tensor w1 = to(mul(rand({kExperts, 2 * f, h}, {}, &g), 0.02), DType::bf16);
  const Tensor w2 = to(mul(rand({kExperts, h, f}, {}, &g), 0.02), DType::bf16);
  // Two distinct experts per token from a fixed uneven pattern, weights 0.6 and 0.4.
  std::vector<int64_t> ids;
  std::vector<float> wv;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t a = (t * 5 + t / 3) % kExperts;
    ids.push_back(a);
    ids.push_back((a + 1 + t % 3) % kExperts);
    wv.push_back(0.6f);
    wv.push_back(0.4f);
  }
  const Tensor idt = from_vector(ids, Shape{tokens, kTopK});
  const Tensor w = to(from_vector(wv, Shape{tokens, kTopK}), DType::bf16);
  auto fused = [&] { return moe_fused(x, idt, w, w1, w2); };
  auto chain = [&] { return moe_chain(x, idt, w, w1, w2, f); };
  Dense dense(h, f, g);
  const Tensor xd = to(randn({tokens * kTopK, h}, {}, &g), DType::bf16);
  benchmark::DoNotOptimize(fused().raw_data());  // warm-up
  benchmark::DoNotOptimize(chain().raw_data());
  benchmark::DoNotOptimize(dense(xd).raw_data());
  const StreamRead stream(kStreamBytes);
  const StreamVariant& peer = stream.best();
  state.SetLabel(std::string("stream peer ") + peer.name);
  double fused_total = 0, chain_total = 0, dense_total = 0, stream_total = 0;
  int64_t n = 0;
  auto timed = [](auto&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(fn().raw_data());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (auto _ : state) {
    const double dt = timed(fused);
    fused_total += dt;
    state.SetIterationTime(dt);
    chain_total += timed(chain);
    dense_total += timed([&] { return dense(xd); });
    stream_total += stream(peer);
    ++n;
  }
  const double per = 1e3 / static_cast<double>(std::max<int64_t>(n, 1));
  state.counters["GFLOP/s"] =
      benchmark::Counter(expert_flops(tokens, h, f) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["fused_ms"] = fused_total * per;
  state.counters["chain_ms"] = chain_total * per;
  state.counters["speedup"] = chain_total / fused_total;
  state.counters["dense_ratio"] = dense_total / fused_total;
  int64_t used = 0;  // experts with tokens (their weights are read)
  for (int64_t e = 0; e < kExperts; ++e) used += std::count(ids.begin(), ids.end(), e) > 0;
  bandwidth_counters(state, n, fused_total, dense_total, stream_total, expert_weight_gb(used, h, f),
                     expert_weight_gb(1, h, f), stream.gb());
}
BENCHMARK(BM_MoEFfnFusedVsChain)->Args({64, 4096, 7168})->Unit(benchmark::kMillisecond)->UseManualTime();
BENCHMARK(BM_MoEFfnFusedVsChain)->Args({64, 1024, 3584})->Unit(benchmark::kMillisecond)->UseManualTime();

void BM_MoEFfnSimFusedVsChain(benchmark::State& state) {
  const char* chip = state.range(0) == 0 ? "v5e-ideal" : "v5e";
  const int64_t tokens = state.range(1), h = state.range(2), f = state.range(3);
  const std::string prev = device::sim_chip(1);
  device::set_sim_chip(chip, 1);
  double fused_cycles = 0, chain_cycles = 0, fused_runs = 0, chain_runs = 0, fused_bytes = 0, chain_bytes = 0;
  {
    NoGradGuard ng;
    const Device d("sim:1");
    Generator g(3);
    const Tensor x = to(randn({tokens, h}, {}, &g), DType::bf16).to(d);
    const Tensor w1 = to(mul(rand({kExperts, 2 * f, h}, {}, &g), 0.02), DType::bf16).to(d);
    const Tensor w2 = to(mul(rand({kExperts, h, f}, {}, &g), 0.02), DType::bf16).to(d);
    std::vector<int64_t> ids;  // two distinct experts per token, drawn uniformly (seeded)
    std::vector<float> wv;
    for (int64_t t = 0; t < tokens; ++t) {
      const auto a = std::min<int64_t>(kExperts - 1, static_cast<int64_t>(g.next_double() * kExperts));
      const auto b = std::min<int64_t>(kExperts - 2, static_cast<int64_t>(g.next_double() * (kExperts - 1)));
      ids.push_back(a);
      ids.push_back((a + 1 + b) % kExperts);
      wv.push_back(0.6f);
      wv.push_back(0.4f);
    }
    const Tensor idt = from_vector(ids, Shape{tokens, kTopK}).to(d);
    const Tensor w = to(from_vector(wv, Shape{tokens, kTopK}), DType::bf16).to(d);
    int64_t used = 0;  // experts with tokens (their weights are read)
    for (int64_t e = 0; e < kExperts; ++e) used += std::count(ids.begin(), ids.end(), e) > 0;
    state.counters["experts_used"] = static_cast<double>(used);
    // The bound set by reading those experts' weights once at the HBM's peak bandwidth.
    state.counters["weight_read_cycles"] =
        static_cast<double>(used * 3 * h * f * 2) / sim::preset_config(chip).hbm_bytes_per_cycle();
    auto fused = [&] { return moe_fused(x, idt, w, w1, w2); };
    auto chain = [&] { return moe_chain(x, idt, w, w1, w2, f); };
    auto measure = [&](auto&& fn, double& cycles, double& runs, double& bytes) {
      synchronize(d);
      codegen::reset_stats();
      const Tensor out = fn();
      synchronize(d);
      benchmark::DoNotOptimize(out.numel());
      const codegen::CodegenStats cs = codegen::stats();
      cycles = cs.cycles;
      runs = static_cast<double>(cs.runs);
      bytes = static_cast<double>(cs.hbm_bytes);
    };
    measure(fused, fused_cycles, fused_runs, fused_bytes);  // builds the programs
    measure(chain, chain_cycles, chain_runs, chain_bytes);
    for (auto _ : state) {
      measure(fused, fused_cycles, fused_runs, fused_bytes);
      measure(chain, chain_cycles, chain_runs, chain_bytes);
    }
  }
  device::set_sim_chip(prev, 1);
  state.SetLabel(chip);
  state.counters["fused_cycles"] = fused_cycles;
  state.counters["chain_cycles"] = chain_cycles;
  state.counters["speedup"] = fused_cycles > 0 ? chain_cycles / fused_cycles : 0;
  state.counters["fused_programs"] = fused_runs;
  state.counters["chain_programs"] = chain_runs;
  state.counters["fused_HBM_MB"] = fused_bytes / 1e6;
  state.counters["chain_HBM_MB"] = chain_bytes / 1e6;
}
// Mixtral-like, small: 64 tokens, hidden 1024, expert width 3584, 8 experts, top 2.
BENCHMARK(BM_MoEFfnSimFusedVsChain)->Args({0, 64, 1024, 3584})->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_MoEFfnSimFusedVsChain)->Args({1, 64, 1024, 3584})->Unit(benchmark::kMillisecond)->Iterations(1);
// Decode-sized: 8 tokens.
BENCHMARK(BM_MoEFfnSimFusedVsChain)->Args({0, 8, 1024, 3584})->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_MoEFfnSimFusedVsChain)->Args({1, 8, 1024, 3584})->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
