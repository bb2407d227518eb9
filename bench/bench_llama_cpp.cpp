// tpucore's cpu decode and prefill beside llama.cpp's on the same model, in the same run.
//
// The model: a random Llama of ~125M parameters (12 layers, hidden 768, MLP 2048, 12 query / 4
// KV heads, vocab 32000, untied head; the ~100M shape of bench_llm with its own output head).
// For each precision the float model is written as GGUF (tools/tpu-gguf) and loaded by
// llama.cpp's prebuilt CPU library (scripts/setup_llama_cpp_peer.sh installs it; the folder
// holding libllama comes from TPU_LLAMA_CPP_DIR or --llama-dir; without it the llama.cpp rows are
// skipped with a message), driven through its C API (dlopen) with a persistent thread pool
// attached to its context, as llama-bench does. Precisions (tpucore / llama.cpp):
//   f32 / F32, bf16 / BF16, f16 / F16 (whole models in that dtype);
//   int8 (per-channel scales) / Q8_0, int4 (groups of 32) / Q4_0: the projections and the head
//   quantized, the embedding f32 in both.
// Tasks, each timed in rounds that alternate which engine runs first (the median is reported):
//   decode-1: 31 greedy decode steps of one sequence after an 8-token prompt (tokens/s from the
//     first generated token to the last);
//   prefill-512: a 512-token prompt through to its first generated token (prompt tokens/s);
//   decode-16: 16 sequences of 8-token prompts, 31 decode steps (generated tokens/s, all rows).
// Both engines use --threads threads (default 2). llama.cpp's KV cache is f32 in the f32 run (as
// tpucore's), its default f16 in the others. Every run reports how many of decode-1's 32 greedy
// tokens (the one after the prompt, then the 31 steps) agree between the engines.
//   bench_llama_cpp [--precisions f32,bf16,f16,int8,int4] [--tasks decode-1,prefill,decode-16] [--rounds 3] [--threads 2]
//                   [--llama-dir DIR] [--work-dir DIR] [--small]
// Output: a markdown table on stdout (scripts/gen_llama_cpp_table.sh puts it in the docs).
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "../tools/cli_args.h"
#include "gguf_writer.h"
#include "tpucore/core/parallel.h"
#include "tpucore/models.h"
#include "tpucore/tpucore.h"

using namespace tpu;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- llama.cpp through its C API (declared here from the published llama.h / ggml.h) ----
// Parameter structs are handled as opaque buffers larger than the library's (returned and passed
// in memory by the x86-64 calling convention); the few fields set are at offsets checked against
// the defaults *_default_params() returns, and the context's getters confirm them afterwards.
struct OpaqueParams {
  alignas(8) unsigned char bytes[1024];
  uint32_t u32(size_t off) const {
    uint32_t v;
    std::memcpy(&v, bytes + off, 4);
    return v;
  }
  void set_u32(size_t off, uint32_t v) { std::memcpy(bytes + off, &v, 4); }
  const void* ptr(size_t off) const {
    const void* p;
    std::memcpy(&p, bytes + off, sizeof p);
    return p;
  }
};
struct LlamaBatchView {  // struct llama_batch
  int32_t n_tokens;
  int32_t* token;
  float* embd;
  int32_t* pos;
  int32_t* n_seq_id;
  int32_t** seq_id;
  int8_t* logits;
};
// llama_context_params: n_ctx, n_batch, n_ubatch, n_seq_max at 0, 4, 8, 12; n_threads and
// n_threads_batch at 28 and 32 in this release (defaults 512, 2048, 512, 1, 4, 4); the KV
// cache's element types type_k and type_v at 104 and 108 (default 1, GGML_TYPE_F16).
constexpr size_t kCtxNCtx = 0, kCtxNBatch = 4, kCtxNUbatch = 8, kCtxNSeqMax = 12, kCtxThreads = 28,
                 kCtxThreadsBatch = 32, kCtxTypeK = 104, kCtxTypeV = 108;
constexpr size_t kThreadpoolNThreads = 512;  // ggml_threadpool_params: bool cpumask[512], int n_threads

using LogCallback = void (*)(int, const char*, void*);
void quiet_log(int, const char*, void*) {}

class LlamaCpp {
 public:
  // Loads the libraries of `dir` and the best CPU backend it holds; an empty string on success.
  std::string open(const std::string& dir) {
    for (const char* lib : {"libggml-base.so", "libggml.v0.5.0.so", "libllama.v0.5.0.so"}) {
      void* h = dlopen((dir + "/" + lib).c_str(), RTLD_NOW | RTLD_GLOBAL);
      if (h == nullptr) return fmt::format("cannot load {}/{}: {}", dir, lib, dlerror());
      handles_.push_back(h);
    }
    std::string missing;
    auto sym = [&](auto& fn, const char* name) {
      void* p = nullptr;
      for (void* h : handles_)
        if ((p = dlsym(h, name)) != nullptr) break;
      if (p == nullptr) missing += std::string(" ") + name;
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    sym(log_set, "llama_log_set"), sym(ggml_log_set, "ggml_log_set");
    sym(load_all_from_path, "ggml_backend_load_all_from_path"), sym(backend_init, "llama_backend_init");
    sym(model_default_params, "llama_model_default_params"), sym(context_default_params, "llama_context_default_params");
    sym(model_load, "llama_model_load_from_file"), sym(model_free, "llama_model_free");
    sym(init_from_model, "llama_init_from_model"), sym(free_ctx, "llama_free");
    sym(decode, "llama_decode"), sym(logits_ith, "llama_get_logits_ith");
    sym(get_memory, "llama_get_memory"), sym(memory_clear, "llama_memory_clear");
    sym(set_n_threads, "llama_set_n_threads"), sym(n_threads, "llama_n_threads");
    sym(n_threads_batch, "llama_n_threads_batch"), sym(n_ctx, "llama_n_ctx"), sym(n_batch, "llama_n_batch");
    sym(n_ubatch, "llama_n_ubatch"), sym(n_seq_max, "llama_n_seq_max");
    sym(batch_init, "llama_batch_init"), sym(batch_free, "llama_batch_free");
    sym(model_get_vocab, "llama_model_get_vocab"), sym(vocab_n_tokens, "llama_vocab_n_tokens");
    sym(attach_threadpool, "llama_attach_threadpool"), sym(dev_by_type, "ggml_backend_dev_by_type");
    sym(dev_backend_reg, "ggml_backend_dev_backend_reg"), sym(reg_proc, "ggml_backend_reg_get_proc_address");
    sym(threadpool_params_init, "ggml_threadpool_params_init");
    if (!missing.empty()) return "symbols missing:" + missing;
    log_set(quiet_log, nullptr), ggml_log_set(quiet_log, nullptr);
    load_all_from_path(dir.c_str());
    backend_init();
    void* cpu = dev_by_type(0);  // GGML_BACKEND_DEVICE_TYPE_CPU
    if (cpu == nullptr) return "no CPU backend loaded (libggml-cpu-*.so)";
    void* reg = dev_backend_reg(cpu);
    threadpool_new = reinterpret_cast<void* (*)(void*)>(reg_proc(reg, "ggml_threadpool_new"));
    threadpool_free = reinterpret_cast<void (*)(void*)>(reg_proc(reg, "ggml_threadpool_free"));
    if (threadpool_new == nullptr || threadpool_free == nullptr) return "the CPU backend has no ggml_threadpool_new";
    // Pausing the pool between llama.cpp's tasks keeps its idle workers off the cores while
    // tpucore runs (the two engines alternate on the same cores).
    if (std::string err = cpu_variant(); !err.empty()) return err;
    void* variant = dlopen((dir + "/libggml-cpu-" + variant_name() + ".so").c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (variant != nullptr) {
      threadpool_pause = reinterpret_cast<void (*)(void*)>(dlsym(variant, "ggml_threadpool_pause"));
      threadpool_resume = reinterpret_cast<void (*)(void*)>(dlsym(variant, "ggml_threadpool_resume"));
    }
    if (threadpool_pause == nullptr || threadpool_resume == nullptr)
      return "the CPU backend has no ggml_threadpool_pause / ggml_threadpool_resume";
    const OpaqueParams c = context_default_params();
    const uint32_t want[] = {512, 2048, 512, 1};
    for (size_t i = 0; i < 4; ++i)
      if (c.u32(4 * i) != want[i]) return layout_error("llama_context_params", 4 * i, c.u32(4 * i), want[i]);
    if (c.u32(kCtxThreads) != 4 || c.u32(kCtxThreadsBatch) != 4)
      return layout_error("llama_context_params", kCtxThreads, c.u32(kCtxThreads), 4);
    if (c.u32(kCtxTypeK) != 1 || c.u32(kCtxTypeV) != 1)
      return layout_error("llama_context_params", kCtxTypeK, c.u32(kCtxTypeK), 1);
    const OpaqueParams m = model_default_params();
    if (m.ptr(0) != nullptr || m.ptr(8) != nullptr)
      return "llama_model_params: devices / tensor_buft_overrides are not null by default (another layout)";
    return {};
  }

  // The libggml-cpu-*.so variant ggml chose for this CPU (from the process's mappings).
  static std::string cpu_variant() {
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) {
      const auto p = line.find("libggml-cpu-");
      if (p != std::string::npos) {
        variant_name() = line.substr(p + 12, line.find(".so", p) - p - 12);
        return {};
      }
    }
    return "no libggml-cpu-*.so variant loaded";
  }
  static std::string& variant_name() {
    static std::string v;
    return v;
  }

  static std::string layout_error(const char* what, size_t off, uint32_t got, uint32_t want) {
    return fmt::format("{}: the default at byte {} is {}, expected {}: the library's struct layout is not the one "
                       "this program was written for (llama.cpp release of @node-llama-cpp/linux-x64 3.22.1)",
                       what, off, got, want);
  }

  void (*log_set)(LogCallback, void*) = nullptr;
  void (*ggml_log_set)(LogCallback, void*) = nullptr;
  void (*load_all_from_path)(const char*) = nullptr;
  void (*backend_init)() = nullptr;
  OpaqueParams (*model_default_params)() = nullptr;
  OpaqueParams (*context_default_params)() = nullptr;
  void* (*model_load)(const char*, OpaqueParams) = nullptr;
  void (*model_free)(void*) = nullptr;
  void* (*init_from_model)(void*, OpaqueParams) = nullptr;
  void (*free_ctx)(void*) = nullptr;
  int32_t (*decode)(void*, LlamaBatchView) = nullptr;
  float* (*logits_ith)(void*, int32_t) = nullptr;
  void* (*get_memory)(void*) = nullptr;
  void (*memory_clear)(void*, bool) = nullptr;
  void (*set_n_threads)(void*, int32_t, int32_t) = nullptr;
  int32_t (*n_threads)(void*) = nullptr;
  int32_t (*n_threads_batch)(void*) = nullptr;
  uint32_t (*n_ctx)(void*) = nullptr;
  uint32_t (*n_batch)(void*) = nullptr;
  uint32_t (*n_ubatch)(void*) = nullptr;
  uint32_t (*n_seq_max)(void*) = nullptr;
  LlamaBatchView (*batch_init)(int32_t, int32_t, int32_t) = nullptr;
  void (*batch_free)(LlamaBatchView) = nullptr;
  const void* (*model_get_vocab)(void*) = nullptr;
  int32_t (*vocab_n_tokens)(const void*) = nullptr;
  void (*attach_threadpool)(void*, void*, void*) = nullptr;
  void* (*dev_by_type)(int) = nullptr;
  void* (*dev_backend_reg)(void*) = nullptr;
  void* (*reg_proc)(void*, const char*) = nullptr;
  void (*threadpool_params_init)(void*, int) = nullptr;
  void* (*threadpool_new)(void*) = nullptr;
  void (*threadpool_free)(void*) = nullptr;
  void (*threadpool_pause)(void*) = nullptr;
  void (*threadpool_resume)(void*) = nullptr;

 private:
  std::vector<void*> handles_;
};

// One llama.cpp context (its own KV cache, batch and persistent thread pool) on a loaded model.
class LlamaSession {
 public:
  // kv_f32: the KV cache in f32 (as tpucore's f32 model keeps it) instead of llama.cpp's f16.
  LlamaSession(LlamaCpp& api, void* model, uint32_t ctx_len, uint32_t seqs, int threads, bool kv_f32) : api_(api) {
    OpaqueParams p = api.context_default_params();
    if (kv_f32) p.set_u32(kCtxTypeK, 0), p.set_u32(kCtxTypeV, 0);
    p.set_u32(kCtxNCtx, ctx_len), p.set_u32(kCtxNBatch, 512), p.set_u32(kCtxNUbatch, 512);
    p.set_u32(kCtxNSeqMax, seqs), p.set_u32(kCtxThreads, static_cast<uint32_t>(threads));
    p.set_u32(kCtxThreadsBatch, static_cast<uint32_t>(threads));
    ctx_ = api.init_from_model(model, p);
    TPU_CHECK(ctx_ != nullptr, "llama.cpp: llama_init_from_model failed");
    // (llama.cpp rounds each sequence's context up to a multiple of 256)
    TPU_CHECK(api.n_ctx(ctx_) >= ctx_len && api.n_batch(ctx_) == 512 && api.n_ubatch(ctx_) == 512 &&
                  api.n_seq_max(ctx_) == seqs && api.n_threads(ctx_) == threads && api.n_threads_batch(ctx_) == threads,
              "llama.cpp: the context reports n_ctx {} n_batch {} n_ubatch {} n_seq_max {} threads {}/{}, not the values "
              "set (a struct layout mismatch)",
              api.n_ctx(ctx_), api.n_batch(ctx_), api.n_ubatch(ctx_), api.n_seq_max(ctx_), api.n_threads(ctx_),
              api.n_threads_batch(ctx_));
    OpaqueParams tp{};
    api.threadpool_params_init(tp.bytes, threads);
    TPU_CHECK(tp.u32(kThreadpoolNThreads) == static_cast<uint32_t>(threads),
              "llama.cpp: ggml_threadpool_params has another layout (n_threads not at byte {})", kThreadpoolNThreads);
    pool_ = api.threadpool_new(tp.bytes);
    TPU_CHECK(pool_ != nullptr, "llama.cpp: ggml_threadpool_new failed");
    api.attach_threadpool(ctx_, pool_, pool_);
    api.threadpool_pause(pool_);
    batch_ = api.batch_init(512, 0, 1);
    TPU_CHECK(batch_.token != nullptr && batch_.embd == nullptr && batch_.pos != nullptr && batch_.seq_id != nullptr &&
                  batch_.logits != nullptr,
              "llama.cpp: llama_batch has another layout");
    n_vocab_ = api.vocab_n_tokens(api.model_get_vocab(model));
  }
  ~LlamaSession() {
    api_.batch_free(batch_);
    api_.free_ctx(ctx_);
    api_.threadpool_free(pool_);
  }
  LlamaSession(const LlamaSession&) = delete;
  LlamaSession& operator=(const LlamaSession&) = delete;

  void clear() { api_.memory_clear(api_.get_memory(ctx_), true); }
  // Greedy generation for prompts of equal length (one sequence each); on_token(step) after
  // every step's tokens are chosen. Returns the tokens of each sequence.
  std::vector<std::vector<int64_t>> generate(const std::vector<std::vector<int64_t>>& prompts, int64_t new_tokens,
                                             const std::function<void(int64_t)>& on_token) {
    clear();
    api_.threadpool_resume(pool_);
    struct PauseAtExit {
      LlamaCpp& api;
      void* pool;
      ~PauseAtExit() { api.threadpool_pause(pool); }
    } pause_at_exit{api_, pool_};
    const auto seqs = static_cast<int32_t>(prompts.size());
    std::vector<std::vector<int64_t>> out(prompts.size());
    batch_.n_tokens = 0;
    for (int32_t s = 0; s < seqs; ++s)
      for (size_t i = 0; i < prompts[static_cast<size_t>(s)].size(); ++i)
        add(prompts[static_cast<size_t>(s)][i], static_cast<int32_t>(i), s, i + 1 == prompts[static_cast<size_t>(s)].size());
    auto pos = static_cast<int32_t>(prompts[0].size());
    for (int64_t step = 0; step < new_tokens; ++step) {
      TPU_CHECK(api_.decode(ctx_, batch_) == 0, "llama.cpp: llama_decode failed");
      std::vector<int64_t> next(prompts.size());
      for (int32_t s = 0, row = 0; row < batch_.n_tokens; ++row) {
        if (!batch_.logits[row]) continue;
        const float* l = api_.logits_ith(ctx_, row);
        next[static_cast<size_t>(s)] = std::max_element(l, l + n_vocab_) - l;
        out[static_cast<size_t>(s)].push_back(next[static_cast<size_t>(s)]);
        ++s;
      }
      on_token(step);
      if (step + 1 == new_tokens) break;
      batch_.n_tokens = 0;
      for (int32_t s = 0; s < seqs; ++s) add(next[static_cast<size_t>(s)], pos, s, true);
      ++pos;
    }
    return out;
  }

 private:
  void add(int64_t token, int32_t pos, int32_t seq, bool logits) {
    const int32_t i = batch_.n_tokens++;
    TPU_CHECK(i < 512, "llama.cpp: more than 512 tokens in one batch");
    batch_.token[i] = static_cast<int32_t>(token), batch_.pos[i] = pos, batch_.n_seq_id[i] = 1;
    batch_.seq_id[i][0] = seq, batch_.logits[i] = logits ? 1 : 0;
  }
  LlamaCpp& api_;
  void* ctx_ = nullptr;
  void* pool_ = nullptr;
  LlamaBatchView batch_{};
  int32_t n_vocab_ = 0;
};

// ---- the tasks ----
struct TaskTiming {
  double rate = 0;                   // tokens/s of the task's measure
  std::vector<std::vector<int64_t>> tokens;
};

std::vector<std::vector<int64_t>> bench_prompts(int64_t rows, int64_t len, int64_t vocab) {
  std::vector<std::vector<int64_t>> p(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < len; ++i) p[static_cast<size_t>(r)].push_back(300 + (r * 7919 + i * 104729) % (vocab - 300));
  return p;
}

// Runs generate-like `run(prompts, new_tokens, on_step)`; the rate counts, for prefill, prompt
// tokens up to the first token, else generated tokens after the first step.
using RunFn = std::function<std::vector<std::vector<int64_t>>(const std::vector<std::vector<int64_t>>&, int64_t,
                                                              const std::function<void(int64_t)>&)>;
TaskTiming time_task(const RunFn& run, const std::vector<std::vector<int64_t>>& prompts, bool prefill, int64_t steps) {
  TaskTiming t;
  double t0 = now_s(), t_first = 0, t_last = 0;
  t.tokens = run(prompts, prefill ? 1 : steps + 1, [&](int64_t step) {
    if (step == 0) t_first = now_s();
    t_last = now_s();
  });
  if (prefill) {
    t.rate = static_cast<double>(prompts[0].size() * prompts.size()) / (t_first - t0);
  } else {
    t.rate = static_cast<double>(steps * static_cast<int64_t>(prompts.size())) / (t_last - t_first);
  }
  return t;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct PrecisionSpec {
  std::string name, peer;
  gguf::LlamaOptions gguf;
};

PrecisionSpec precision_spec(const std::string& p) {
  using gguf::TensorType;
  if (p == "f32") return {p, "F32", {TensorType::f32, TensorType::f32, "bench"}};
  if (p == "bf16") return {p, "BF16", {TensorType::bf16, TensorType::bf16, "bench"}};
  if (p == "f16") return {p, "F16", {TensorType::f16, TensorType::f16, "bench"}};
  if (p == "int8") return {p, "Q8_0", {TensorType::q8_0, TensorType::f32, "bench"}};
  if (p == "int4") return {p, "Q4_0", {TensorType::q4_0, TensorType::f32, "bench"}};
  fail("bench_llama_cpp: unknown precision '{}' (f32, bf16, f16, int8, int4)", p);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    const size_t b = std::min(s.find(',', a), s.size());
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string precisions = "f32,bf16,f16,int8,int4", tasks_arg = "decode-1,prefill,decode-16";
  const char* env_dir = std::getenv("TPU_LLAMA_CPP_DIR");
  std::string llama_dir = env_dir != nullptr ? env_dir : "";
  std::string work_dir = (std::filesystem::temp_directory_path() / "tpu_bench_llama_cpp").string();
  int rounds = 3, threads = 2;
  bool small = false;
  cli::Parser p("bench_llama_cpp", "tpucore's cpu decode and prefill beside llama.cpp's on the same model.");
  p.value("--precisions", "LIST", "comma-separated: f32,bf16,f16,int8,int4 (default all)",
          [&](const std::string& v) { precisions = v; });
  p.value("--tasks", "LIST", "comma-separated: decode-1,prefill,decode-16 (default all; the others print -)",
          [&](const std::string& v) { tasks_arg = v; });
  p.value("--rounds", "N", "timed rounds per task (default 3)", [&](const std::string& v) { rounds = static_cast<int>(p.to_int(v)); });
  p.value("--threads", "N", "threads of both engines (default 2)", [&](const std::string& v) { threads = static_cast<int>(p.to_int(v)); });
  p.value("--llama-dir", "DIR", "folder of libllama (default: TPU_LLAMA_CPP_DIR)", [&](const std::string& v) { llama_dir = v; });
  p.value("--work-dir", "DIR", "where the GGUF files are written (and removed)", [&](const std::string& v) { work_dir = v; });
  p.flag("--small", "a 2-layer, hidden-256 model and short tasks (checks the program, not figures)", [&] { small = true; });
  if (auto rc = p.parse(argc, argv)) return *rc;
  try {
    TPU_CHECK(rounds >= 1 && threads >= 1, "bench_llama_cpp: --rounds and --threads must be >= 1");
    const std::vector<std::string> wanted = split_commas(tasks_arg);
    const char* task_names[3] = {"decode-1", "prefill", "decode-16"};
    for (const std::string& w : wanted)
      TPU_CHECK(std::find(std::begin(task_names), std::end(task_names), w) != std::end(task_names),
                "unknown task '{}' (decode-1, prefill, decode-16)", w);
    set_num_threads(threads);
    LlamaCpp api;
    std::string why = llama_dir.empty() ? "TPU_LLAMA_CPP_DIR is not set (scripts/setup_llama_cpp_peer.sh DIR prints it)"
                                        : api.open(llama_dir);
    const bool peer = why.empty();
    if (!peer) std::fprintf(stderr, "bench_llama_cpp: llama.cpp rows skipped: %s\n", why.c_str());
    std::filesystem::create_directories(work_dir);

    models::ModelConfig cfg;
    cfg.vocab_size = 32000, cfg.hidden_size = small ? 256 : 768, cfg.intermediate_size = small ? 512 : 2048;
    cfg.num_hidden_layers = small ? 2 : 12, cfg.num_attention_heads = small ? 4 : 12, cfg.num_key_value_heads = 4;
    cfg.tie_word_embeddings = false, cfg.max_position_embeddings = 2048;
    const int64_t steps = small ? 7 : 31, prefill_len = small ? 64 : 512;
    const auto p1 = bench_prompts(1, 8, cfg.vocab_size), p16 = bench_prompts(16, 8, cfg.vocab_size),
               pre = bench_prompts(1, prefill_len, cfg.vocab_size);

    std::printf("| precision (tpucore / llama.cpp) | decode-1 tpucore | decode-1 llama.cpp | ratio | prefill-%lld tpucore | "
                "prefill-%lld llama.cpp | ratio | decode-16 tpucore | decode-16 llama.cpp | ratio |\n",
                static_cast<long long>(prefill_len), static_cast<long long>(prefill_len));
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    std::string notes;
    for (const std::string& prec : split_commas(precisions)) {
      const PrecisionSpec spec = precision_spec(prec);
      Generator gen(1);
      models::CausalLM m(cfg, &gen);
      m.eval();
      const std::string path = (std::filesystem::path(work_dir) / ("bench_" + prec + ".gguf")).string();
      if (peer) gguf::write_llama_gguf(m, path, spec.gguf);
      if (prec == "bf16") m.to(DType::bf16);
      if (prec == "f16") m.to(DType::f16);
      if (prec == "int8") models::quantize_causal_lm(m, nn::WeightQuant::int8, 32, true);
      if (prec == "int4") models::quantize_causal_lm(m, nn::WeightQuant::int4, 32, true);
      RunFn ours = [&](const std::vector<std::vector<int64_t>>& prompts, int64_t n, const std::function<void(int64_t)>& cb) {
        models::GenerationConfig g;
        g.max_new_tokens = n;
        size_t done = 0;
        int64_t step = 0;
        return models::generate(m, prompts, g, [&](size_t, int64_t) {
          if (++done == prompts.size() * static_cast<size_t>(step + 1)) cb(step++);
          return true;
        });
      };
      void* model = nullptr;
      std::unique_ptr<LlamaSession> s1, s16;
      if (peer) {
        model = api.model_load(path.c_str(), api.model_default_params());
        TPU_CHECK(model != nullptr, "llama.cpp: cannot load {}", path);
        s1 = std::make_unique<LlamaSession>(api, model, 768u, 1u, threads, prec == "f32");
        s16 = std::make_unique<LlamaSession>(api, model, 16u * 64u, 16u, threads, prec == "f32");
      }
      auto theirs = [&](LlamaSession* s) -> RunFn {
        return [s](const std::vector<std::vector<int64_t>>& prompts, int64_t n, const std::function<void(int64_t)>& cb) {
          return s->generate(prompts, n, cb);
        };
      };
      struct Task {
        const std::vector<std::vector<int64_t>>* prompts;
        bool prefill;
        LlamaSession* session;
      };
      const Task tasks[3] = {{&p1, false, s1.get()}, {&pre, true, s1.get()}, {&p16, false, s16.get()}};
      std::printf("| %s / %s", prec.c_str(), spec.peer.c_str());
      for (const Task& t : tasks) {
        if (std::find(wanted.begin(), wanted.end(), task_names[&t - tasks]) == wanted.end()) {
          std::printf(" | - | - | -");
          continue;
        }
        std::vector<double> a, b;
        TaskTiming ta = time_task(ours, *t.prompts, t.prefill, steps), tb;  // warm-up
        if (peer) tb = time_task(theirs(t.session), *t.prompts, t.prefill, steps);
        for (int r = 0; r < rounds; ++r) {
          const bool peer_first = r % 2 == 1;
          if (peer && peer_first) b.push_back(time_task(theirs(t.session), *t.prompts, t.prefill, steps).rate);
          a.push_back(time_task(ours, *t.prompts, t.prefill, steps).rate);
          if (peer && !peer_first) b.push_back(time_task(theirs(t.session), *t.prompts, t.prefill, steps).rate);
        }
        const double ra = median(a), rb = median(b);
        if (peer)
          std::printf(" | %.1f | %.1f | %.2fx", ra, rb, ra / rb);
        else
          std::printf(" | %.1f | - | -", ra);
        if (peer && !t.prefill && t.prompts == &p1) {
          size_t agree = 0;
          while (agree < ta.tokens[0].size() && agree < tb.tokens[0].size() && ta.tokens[0][agree] == tb.tokens[0][agree])
            ++agree;
          notes += fmt::format("- {}: greedy tokens agree on {} of the first {} (decode-1){}\n", prec, agree,
                               ta.tokens[0].size(), agree == ta.tokens[0].size() ? "" : ", then differ");
        }
      }
      std::printf(" |\n");
      std::fflush(stdout);
      s1.reset(), s16.reset();
      if (model != nullptr) api.model_free(model);
      std::filesystem::remove(path);
    }
    std::printf("\nTokens/s, the median of %d rounds, %d threads each; llama.cpp's CPU backend: %s.\n\n", rounds, threads,
                peer ? LlamaCpp::variant_name().c_str() : "not run");
    std::printf("%s", notes.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_llama_cpp: %s\n", e.what());
    return 1;
  }
  return 0;
}
