// Serving throughput and latency on the cpu, model shaped like the fortunes example's earlier
// recipe (Llama layout, 3 layers, hidden 128, 4 query / 2 KV heads, byte vocabulary of 257;
// random weights, or the checkpoint folder named by TPU_SERVE_BENCH_MODEL, e.g. the trained
// fortunes model).
//
// BM_engine/N/C: N requests (32-token prompts, 64 greedy tokens each, eos ignored) submitted
//   at once to serve::Engine and stepped to the end (continuous batching, paged cache); C = 1:
//   the compiled step (every bucket compiled before timing), C = 0: eager with the cpu kernel.
// BM_decode_invariant/I/N/D/H: decode steps of N running requests (each prefilled before the
//   timing, 64 tokens), parameters f32 (D = 0) or bf16 (D = 1), EngineConfig::batch_invariant
//   off (I = 0) or on (I = 1), the two run one after the other, on the model of hidden size H
//   (128: 3 layers; 768: 4 layers). Counters: decode
//   tokens/s (wall), process CPU time per decode token (all threads), and for I = 1 the
//   throughput lost against I = 0 at the same N and D by CPU time (cost_%; negative: faster).
// BM_linear_invariant/I/M/D: the 768 model's MLP linears alone (x [M, 768] W1^T W2^T, W1
//   [2304, 768]) with the mode off or on, f32 or bf16: the kernels' share of the mode's cost.
// BM_speculative/K/N/R: decode of N running greedy requests, 64 tokens each: R = 1, the
//   32-token prompts repeat an 8-token passage (n-gram proposals hit, and the greedy random
//   model falls into cycles); R = 0, prompts without a repeated passage and the model's
//   attention and MLP weights scaled by 8 (its output wanders: most proposals miss, the cost of
//   verifying them); with
//   EngineConfig::speculative_tokens K (0: plain decoding; run first, the reference).
//   Counters: decode tokens/s (wall), CPU time per decode token, the acceptance rate, speed-up
//   by CPU time against K = 0 at the same N and R, and same_output (1: every token equal to
//   K = 0's).
// BM_generate_batch/N: the same N prompts through models::generate() as one static batch
//   (contiguous KV cache), the baseline without a server.
// BM_http/N: tpu-serve in-process on 127.0.0.1 and N concurrent streaming clients (our load
//   generator), each sending 4 requests one after the other (32-byte prompts, max_tokens 64,
//   ignore_eos, temperature 0) over loopback. Counters: requests/s, output tokens/s, mean time
//   to first token and mean time per output token as the clients see them.
#include <benchmark/benchmark.h>

#include <httplib.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <tuple>
#include <ctime>
#include <unistd.h>

#include "server.h"
#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/core/batch_invariant.h"
#include "tpucore/models.h"
#include "tpucore/nn.h"
#include "tpucore/serve/engine.h"

using namespace tpu;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kPrompt = 32, kNew = 64;

// A checkpoint folder: TPU_SERVE_BENCH_MODEL, or a random fortunes-shaped model with a byte
// tokenizer written once into a temporary folder.
// The bench model: hidden 128, 3 layers (the default), or with `hidden` 768 a wider one of 4
// layers (intermediate 3x hidden) whose products are large enough to show kernel costs.
std::string model_dir(int64_t hidden = 128) {
  static std::map<int64_t, std::string> dirs;
  if (dirs.count(hidden)) return dirs[hidden];
  return dirs[hidden] = [hidden] {
    if (const char* d = std::getenv("TPU_SERVE_BENCH_MODEL"); d && hidden == 128) return std::string(d);
    const auto p = std::filesystem::temp_directory_path() /
                   ("tpucore_bench_serve_" + std::to_string(::getpid()) + "_" + std::to_string(hidden));
    std::filesystem::create_directories(p);
    static struct Cleanup {
      std::filesystem::path p;
      ~Cleanup() { std::filesystem::remove_all(p); }
    } cleanup{p};
    models::ModelConfig c;
    c.vocab_size = 257, c.hidden_size = hidden, c.intermediate_size = 3 * hidden, c.num_hidden_layers = hidden > 128 ? 4 : 3;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 256;
    c.tie_word_embeddings = true;
    c.eos_token_ids = {256};
    Generator gen(1);
    models::CausalLM m(c, &gen);
    models::save_causal_lm(m, p.string());
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(static_cast<uint8_t>(b))] = b;
    nlohmann::json t{{"version", "1.0"},
                     {"added_tokens", {{{"id", 256}, {"content", "<|endoftext|>"}, {"special", true}}}},
                     {"normalizer", nullptr},
                     {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                     {"decoder", {{"type", "ByteLevel"}}},
                     {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
    std::ofstream(p / "tokenizer.json") << t.dump();
    return p.string();
  }();
}

std::vector<std::vector<int64_t>> prompts(int64_t n) {
  std::vector<std::vector<int64_t>> ps(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < kPrompt; ++j) ps[static_cast<size_t>(i)].push_back(32 + (i * 7 + j * 13) % 90);
  return ps;
}

void BM_engine(benchmark::State& st) {
  const int64_t n = st.range(0);
  auto m = models::load_causal_lm(model_dir());
  serve::EngineConfig ec;
  ec.max_num_seqs = std::max<int64_t>(n, 1);
  ec.max_num_batched_tokens = 512;
  ec.max_model_len = 256;
  ec.compile = st.range(1) != 0;
  serve::Engine e(m, ec);
  e.warm_up();
  models::GenerationConfig g;
  g.max_new_tokens = kNew;
  for (auto _ : st) {
    for (const auto& p : prompts(n)) e.add_request(p, serve::SamplingParams::from_generation_config(g), {});
    for (int i = 0; i < 100000 && e.has_work(); ++i) e.step();
  }
  const double it = static_cast<double>(st.iterations());
  st.counters["requests/s"] = benchmark::Counter(it * static_cast<double>(n), benchmark::Counter::kIsRate);
  st.counters["out_tokens/s"] = benchmark::Counter(it * static_cast<double>(n * kNew), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_engine)
    ->ArgsProduct({{1, 4, 16, 32}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The decode timing of BM_decode_invariant and BM_speculative: per iteration, untimed, `add`
// queues the n requests (kNew new tokens each) and one step prefills them and samples their first
// tokens; then the decode steps to the end are timed. Sets decode_tokens/s and cpu_us/token;
// returns the process CPU seconds per decoded token (0 when nothing was timed).
template <class Add>
double time_decodes(benchmark::State& st, serve::Engine& e, int64_t n, Add add) {
  int64_t decoded = 0;
  double seconds = 0, cpu = 0;
  for (auto _ : st) {
    st.PauseTiming();
    add();
    e.step();  // the prefill and the first tokens
    st.ResumeTiming();
    const auto t0 = Clock::now();
    const double c0 = process_cpu_seconds();
    for (int i = 0; i < 100000 && e.has_work(); ++i) e.step();
    cpu += process_cpu_seconds() - c0;
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    decoded += n * (kNew - 1);
  }
  if (decoded == 0 || seconds <= 0) return 0;
  const double cpu_per_token = cpu / static_cast<double>(decoded);
  st.counters["decode_tokens/s"] = static_cast<double>(decoded) / seconds;
  st.counters["cpu_us/token"] = 1e6 * cpu_per_token;
  return cpu_per_token;
}

void BM_decode_invariant(benchmark::State& st) {
  // (N, D) -> process CPU seconds per decode token with the mode off
  static std::map<std::tuple<int64_t, int64_t, int64_t>, double> off_cpu;
  const int64_t invariant = st.range(0), n = st.range(1), dt = st.range(2), hidden = st.range(3);
  auto m = models::load_causal_lm(model_dir(hidden), Device(), dt ? DType::bf16 : DType::f32);
  serve::EngineConfig ec;
  ec.max_num_seqs = n;
  ec.max_num_batched_tokens = 2048;  // every prompt in the first step
  ec.max_model_len = 256;
  ec.batch_invariant = invariant != 0;
  serve::Engine e(m, ec);
  models::GenerationConfig g;
  g.max_new_tokens = kNew;
  const double cpu_per_token = time_decodes(st, e, n, [&] {
    for (const auto& p : prompts(n)) e.add_request(p, serve::SamplingParams::from_generation_config(g), {});
  });
  if (cpu_per_token <= 0) return;
  const auto key = std::tuple{n, dt, hidden};
  if (!invariant) off_cpu[key] = cpu_per_token;
  else if (off_cpu.count(key))  // throughput lost at equal CPU time (a shared host skews wall time)
    st.counters["cost_%"] = 100.0 * (1.0 - off_cpu[key] / cpu_per_token);
}
BENCHMARK(BM_decode_invariant)
    ->ArgsProduct({{0, 1}, {1, 8, 16, 32}, {0, 1}, {128, 768}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The linears of BM_decode_invariant's 768 model alone: x [M, 768] through the MLP's up
// projection W1 [2304, 768] and its down projection W2 [768, 2304] (x W1^T W2^T), with the
// batch-invariant mode off or on (I), f32 or bf16 (D). Isolates the kernels' share of the mode's
// cost from the rest of a decode step (which the mode does not change).
void BM_linear_invariant(benchmark::State& st) {
  const int64_t invariant = st.range(0), m = st.range(1), dt = st.range(2);
  Generator g(5);
  const DType d = dt ? DType::bf16 : DType::f32;
  const Tensor w1 = randn({2304, 768}, {}, &g).to(d), w2 = randn({768, 2304}, {}, &g).to(d);
  const Tensor x = randn({m, 768}, {}, &g).to(d);
  const BatchInvariantScope scope(invariant != 0);
  for (auto _ : st) benchmark::DoNotOptimize(matmul(matmul(x, w1.t()), w2.t()));
  st.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(st.iterations()) * 4.0 * static_cast<double>(m * 768 * 2304) * 1e-9,
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_linear_invariant)->ArgsProduct({{0, 1}, {1, 4, 16, 32}, {0, 1}})->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_speculative(benchmark::State& st) {
  // (N, R) -> (cpu/token, outputs) of K = 0
  static std::map<std::pair<int64_t, int64_t>, std::pair<double, std::vector<std::vector<int64_t>>>> plain;
  const int64_t k = st.range(0), n = st.range(1), repeat = st.range(2);
  auto m = models::load_causal_lm(model_dir());
  if (!repeat) {
    NoGradGuard ng;
    nn::StateDict sd = m->state_dict();
    for (auto& [name, t] : sd)
      if (name.find("_proj") != std::string::npos) t = t * 8.0;
    m->load_state_dict(sd);
  }
  serve::EngineConfig ec;
  ec.max_num_seqs = n;
  ec.max_num_batched_tokens = 2048;
  ec.max_model_len = 256;
  ec.speculative_tokens = k;
  serve::Engine e(m, ec);
  models::GenerationConfig g;
  g.max_new_tokens = kNew;
  std::vector<std::vector<int64_t>> out;
  const double cpu_per_token = time_decodes(st, e, n, [&] {
    out.assign(static_cast<size_t>(n), {});
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int64_t> p;
      for (int64_t j = 0; j < kPrompt; ++j) p.push_back(32 + (i * 7 + (repeat ? j % 8 : j * j + 3 * j) * 13) % 90);
      auto* o = &out[static_cast<size_t>(i)];
      e.add_request(p, serve::SamplingParams::from_generation_config(g), {[o](int64_t t) {
                              o->push_back(t);
                              return true;
                            },
                            {}});
    }
  });
  if (cpu_per_token <= 0) return;
  const serve::EngineMetrics mt = e.metrics();
  st.counters["acceptance"] = mt.spec_acceptance_rate();
  const auto key = std::pair{n, repeat};
  if (k == 0) {
    plain[key] = {cpu_per_token, out};
  } else if (plain.count(key)) {
    st.counters["speedup_x"] = plain[key].first / cpu_per_token;
    st.counters["same_output"] = plain[key].second == out ? 1 : 0;
  }
}
BENCHMARK(BM_speculative)->ArgsProduct({{0, 4}, {1, 4, 16}, {1, 0}})->Unit(benchmark::kMillisecond)->UseRealTime();

// A mixed workload of n requests: prompts of 8..64 tokens, 16..64 new tokens each, arriving
// one every other step (so prefill chunks share steps with decodes under a 128-token budget).
// Returns the steps run; the generated tokens go to `out` (one vector per request).
int64_t run_mixed(serve::Engine& e, int64_t n, std::vector<std::vector<int64_t>>& out) {
  out.assign(static_cast<size_t>(n), {});
  int64_t next = 0, steps = 0;
  for (int i = 0; i < 100000 && (next < n || e.has_work()); ++i) {
    if (next < n && i % 2 == 0) {
      std::vector<int64_t> p;
      for (int64_t j = 0; j < 8 + (next * 23) % 57; ++j) p.push_back(32 + (next * 7 + j * 13) % 90);
      models::GenerationConfig g;
      g.max_new_tokens = 16 + (next * 37) % 49;
      auto* o = &out[static_cast<size_t>(next)];
      e.add_request(p, serve::SamplingParams::from_generation_config(g), {[o](int64_t t) {
                              o->push_back(t);
                              return true;
                            },
                            {}});
      ++next;
    }
    steps += e.step() ? 1 : 0;
  }
  return steps;
}

// BM_step_interleaved/N: the eager step (cpu ragged kernel) and the compiled step (every token
// bucket compiled before timing) run the same mixed workload of N requests alternately in every
// iteration, so both see the same load on a shared machine. Counters: CPU time of the whole
// process (all threads) per step for each side, their ratio, wall time per step, and the
// number of requests whose tokens differ between the two (greedy: should be 0).
void BM_step_interleaved(benchmark::State& st) {
  const int64_t n = st.range(0);
  auto m = models::load_causal_lm(model_dir());
  serve::EngineConfig ec;
  ec.max_num_seqs = std::max<int64_t>(n, 1);
  ec.max_num_batched_tokens = 128;
  ec.max_model_len = 256;
  serve::Engine eager(m, ec);
  ec.compile = true;
  ec.compile_name = "bench_serve_step";
  serve::Engine compiled(m, ec);
  compiled.warm_up();
  std::vector<std::vector<int64_t>> out_e, out_c;
  double cpu_e = 0, cpu_c = 0, wall_e = 0, wall_c = 0;
  int64_t steps_e = 0, steps_c = 0, differ = 0;
  for (auto _ : st) {
    for (int side = 0; side < 2; ++side) {
      const double c0 = process_cpu_seconds();
      const auto w0 = Clock::now();
      const int64_t steps = run_mixed(side == 0 ? eager : compiled, n, side == 0 ? out_e : out_c);
      const double cpu = process_cpu_seconds() - c0, wall = std::chrono::duration<double>(Clock::now() - w0).count();
      (side == 0 ? cpu_e : cpu_c) += cpu;
      (side == 0 ? wall_e : wall_c) += wall;
      (side == 0 ? steps_e : steps_c) += steps;
    }
    for (int64_t i = 0; i < n; ++i) differ += out_e[static_cast<size_t>(i)] != out_c[static_cast<size_t>(i)];
  }
  st.counters["eager_cpu_us/step"] = 1e6 * cpu_e / static_cast<double>(steps_e);
  st.counters["compiled_cpu_us/step"] = 1e6 * cpu_c / static_cast<double>(steps_c);
  st.counters["compiled/eager_cpu"] = cpu_c / cpu_e;
  st.counters["eager_wall_us/step"] = 1e6 * wall_e / static_cast<double>(steps_e);
  st.counters["compiled_wall_us/step"] = 1e6 * wall_c / static_cast<double>(steps_c);
  st.counters["steps"] = static_cast<double>(steps_e) / static_cast<double>(st.iterations());
  st.counters["differ"] = static_cast<double>(differ);
  const jit::Stats js = jit::stats();
  if (const jit::FunctionStats* f = js.find("bench_serve_step")) {
    st.counters["graphs"] = static_cast<double>(f->compiles);
    st.counters["compile_ms/graph"] = f->compile_ms / static_cast<double>(std::max<int64_t>(f->compiles, 1));
  }
}
BENCHMARK(BM_step_interleaved)->Arg(1)->Arg(8)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_generate_batch(benchmark::State& st) {
  const int64_t n = st.range(0);
  auto m = models::load_causal_lm(model_dir());
  models::GenerationConfig g;
  g.max_new_tokens = kNew;
  const auto ps = prompts(n);
  for (auto _ : st) benchmark::DoNotOptimize(models::generate(*m, ps, g));
  const double it = static_cast<double>(st.iterations());
  st.counters["requests/s"] = benchmark::Counter(it * static_cast<double>(n), benchmark::Counter::kIsRate);
  st.counters["out_tokens/s"] = benchmark::Counter(it * static_cast<double>(n * kNew), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_generate_batch)->Arg(1)->Arg(4)->Arg(16)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_http(benchmark::State& st) {
  const int clients = static_cast<int>(st.range(0)), per_client = 4;
  auto m = models::load_causal_lm(model_dir());
  serve_http::ServerOptions o;
  o.model_name = "fortunes";
  o.engine.max_num_seqs = 32;
  o.engine.max_num_batched_tokens = 512;
  o.engine.max_model_len = 256;
  serve_http::ApiServer server(m, Tokenizer::from_file(model_dir() + "/tokenizer.json"), o);
  const int port = server.bind("127.0.0.1", 0);
  std::thread serving([&] { server.serve(); });
  const std::string body = nlohmann::json{{"prompt", "Q: What is the meaning of life? A:"},
                                          {"max_tokens", kNew},
                                          {"temperature", 0},
                                          {"ignore_eos", true},
                                          {"stream", true}}
                               .dump();
  std::atomic<int64_t> ok{0}, failed{0};
  double ttft_sum = 0, tpot_sum = 0;
  std::mutex mu;
  for (auto _ : st) {
    std::vector<std::thread> ts;
    for (int c = 0; c < clients; ++c)
      ts.emplace_back([&] {
        httplib::Client cl("127.0.0.1", port);
        cl.set_read_timeout(60);
        for (int r = 0; r < per_client; ++r) {
          httplib::Request req;
          req.method = "POST";
          req.path = "/v1/completions";
          req.body = body;
          req.set_header("Content-Type", "application/json");
          const auto t0 = Clock::now();
          Clock::time_point first{};
          req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
            if (first == Clock::time_point{}) first = Clock::now();
            return true;
          };
          auto res = cl.send(req);
          const auto t1 = Clock::now();
          if (!res || res->status != 200) {
            failed++;
            continue;
          }
          ok++;
          std::lock_guard<std::mutex> lk(mu);
          ttft_sum += std::chrono::duration<double>(first - t0).count();
          tpot_sum += std::chrono::duration<double>(t1 - first).count() / static_cast<double>(kNew - 1);
        }
      });
    for (auto& t : ts) t.join();
  }
  server.shutdown();
  serving.join();
  const double done = static_cast<double>(ok.load());
  st.counters["requests/s"] = benchmark::Counter(done, benchmark::Counter::kIsRate);
  st.counters["out_tokens/s"] = benchmark::Counter(done * kNew, benchmark::Counter::kIsRate);
  st.counters["ttft_ms"] = done > 0 ? 1e3 * ttft_sum / done : 0;
  st.counters["tpot_ms"] = done > 0 ? 1e3 * tpot_sum / done : 0;
  st.counters["failed"] = static_cast<double>(failed.load());
}
BENCHMARK(BM_http)->Arg(1)->Arg(4)->Arg(16)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
