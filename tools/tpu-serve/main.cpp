// tpu-serve: serves a causal LM checkpoint (Hugging Face layout: config.json, safetensors,
// tokenizer.json) over an OpenAI-compatible HTTP API with continuous batching on a paged KV
// cache. The chat endpoint formats prompts with the model's chat template (tokenizer_config.json's
// `chat_template`, or --chat-template FILE). The model runs on the cpu, a simulated chip (--device
// sim:N --chip PRESET) or a PJRT plugin's device (--device pjrt:N --pjrt-plugin PATH). SIGTERM /
// SIGINT drain the running requests and exit 0.
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "server.h"
#include "tools/cli_args.h"
#include "tpucore/devices.h"
#include "tpucore/models.h"
#include "tpucore/runtime/pjrt_client.h"

namespace {
volatile std::sig_atomic_t g_signal = 0;
void on_signal(int s) { g_signal = s; }
}  // namespace

int main(int argc, char** argv) {
  using namespace tpu;
  std::string model_dir, host = "127.0.0.1", dtype = "f32", chat_template_file, device = "cpu", chip, quantize = "none",
              pjrt_plugin;
  bool no_host_fallback = false;
  int port = 8000;
  serve_http::ServerOptions o;
  o.engine.max_waiting = 256;
  cli::Parser p("tpu-serve", "Serve a causal LM checkpoint over an OpenAI-compatible HTTP API (cpu, a simulated chip or a PJRT device).");
  p.value("--model", "DIR", "checkpoint folder: config.json, model.safetensors, tokenizer.json (required)",
          [&](const std::string& v) { model_dir = v; });
  p.value("--chat-template", "FILE",
          "chat template of the chat endpoint: a Jinja file, or a tokenizer_config.json (default: the model's "
          "tokenizer_config.json; without one the chat endpoint answers 400)",
          [&](const std::string& v) { chat_template_file = v; });
  p.value("--host", "ADDR", "address to listen on (default 127.0.0.1)", [&](const std::string& v) { host = v; });
  p.value("--port", "N", "port (default 8000; 0 picks a free one)", [&](const std::string& v) { port = static_cast<int>(p.to_int(v)); });
  p.value("--served-model-name", "NAME", "model id of the API (default: the folder name)",
          [&](const std::string& v) { o.model_name = v; });
  p.value("--dtype", "T", "parameter dtype f32 or bf16 (default f32)", [&](const std::string& v) { dtype = v; });
  p.value("--device", "DEV", "where the model runs: cpu (default), sim:N (the simulated chip; its cycles and cost per "
          "token in /metrics and in every response), pjrt:N (a PJRT plugin's device, see --pjrt-plugin) or tpu:N (a "
          "driver plugin's device)", [&](const std::string& v) { device = v; });
  p.value("--chip", "PRESET", "with --device sim:N: the chip preset or config JSON (default: TPU_SIM_CHIP, else the "
          "library's default)", [&](const std::string& v) { chip = v; });
  p.value("--pjrt-plugin", "PATH", "with --device pjrt:N: the PJRT plugin to load (default: TPU_PJRT_PLUGIN; "
          "libpjrt_tpucore_sim.so runs StableHLO on the simulated chip)", [&](const std::string& v) { pjrt_plugin = v; });
  p.flag("--no-host-fallback", "with --device pjrt:N: an op without a StableHLO counterpart is an error instead of "
         "running on the host (the default runs it on the host, counts it in /metrics and logs it once)",
         [&] { no_host_fallback = true; });
  p.value("--quantize", "Q",
          "weight-only quantization of the decoder layers' linear layers at load time: int8 or fp8 (e4m3; "
          "per output channel), int4 (groups of 32 columns) or none (default none)",
          [&](const std::string& v) { quantize = v; });
  p.value("--kv-cache-dtype", "T",
          "storage of the paged KV cache: auto (the float cache), int8 or fp8_e4m3 (one byte per value and one f32 "
          "scale per token and kv head, dequantized while attending; about half of bf16's bytes; the eager cpu "
          "step only)",
          [&](const std::string& v) { o.engine.kv_cache_dtype = nn::parse_kv_cache_dtype(v); });
  p.value("--block-size", "N", "token positions per KV block (default 16)",
          [&](const std::string& v) { o.engine.block_size = p.to_int(v); });
  p.value("--num-blocks", "N", "KV blocks in the pool (default: max-num-seqs full contexts)",
          [&](const std::string& v) { o.engine.num_blocks = p.to_int(v); });
  p.value("--max-num-seqs", "N", "sequences per step (default 16)", [&](const std::string& v) { o.engine.max_num_seqs = p.to_int(v); });
  p.value("--max-num-batched-tokens", "N", "token budget per step (default 256)",
          [&](const std::string& v) { o.engine.max_num_batched_tokens = p.to_int(v); });
  p.value("--max-model-len", "N", "context length (default: max_position_embeddings)",
          [&](const std::string& v) { o.engine.max_model_len = p.to_int(v); });
  p.value("--max-waiting", "N", "queued requests before answering 429 (default 256)",
          [&](const std::string& v) { o.engine.max_waiting = p.to_int(v); });
  p.flag("--compile", "run the engine step through tpu::compile (bucketed shapes, all compiled at start-up)",
         [&] { o.engine.compile = true; });
  p.value("--batch-invariant", "on|off",
          "batch-invariant numerics (default on): a request's tokens do not depend on the other requests of its "
          "step (every matmul row keeps one reduction order whatever the row count; costs decode speed at small "
          "batches, most with f32)",
          [&](const std::string& v) {
            TPU_CHECK(v == "on" || v == "off", "tpu-serve: --batch-invariant must be on or off, got '{}'", v);
            o.engine.batch_invariant = v == "on";
          });
  bool ngram_set = false;
  p.value("--speculative-tokens", "K",
          "speculative decoding with n-gram (prompt-lookup) proposals: up to K tokens per decoding request, verified "
          "in one forward (default 0: off); outputs stay those of plain decoding with --batch-invariant on",
          [&](const std::string& v) { o.engine.speculative_tokens = p.to_int(v); });
  p.value("--ngram-max", "N", "with --speculative-tokens: the longest n-gram matched (default 3)",
          [&](const std::string& v) {
            o.engine.ngram_max = p.to_int(v);
            ngram_set = true;
          });
  p.value("--ngram-min", "N", "with --speculative-tokens: the shortest n-gram matched (default 1)",
          [&](const std::string& v) {
            o.engine.ngram_min = p.to_int(v);
            ngram_set = true;
          });
  p.value("--threads", "N", "HTTP worker threads (default 64)", [&](const std::string& v) { o.threads = static_cast<int>(p.to_int(v)); });
  p.value("--drain-seconds", "S", "on SIGTERM, time running requests get to finish (default 30)",
          [&](const std::string& v) { o.drain_seconds = p.to_double(v); });
  p.epilog("Endpoints: POST /v1/completions, POST /v1/chat/completions (\"stream\": true for server-sent events),\n"
           "GET /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text, also vLLM's metric names).\n"
           "Request parameters and their status: docs/serving.md.");
  if (auto rc = p.parse(argc, argv)) return *rc;
  if (model_dir.empty()) {
    std::fputs("tpu-serve: --model DIR is required (see --help)\n", stderr);
    return 2;
  }
  try {
    TPU_CHECK(dtype == "f32" || dtype == "bf16", "tpu-serve: --dtype must be f32 or bf16, got '{}'", dtype);
    TPU_CHECK(!ngram_set || o.engine.speculative_tokens > 0,
              "tpu-serve: --ngram-max and --ngram-min need --speculative-tokens K (K > 0)");
    if (o.model_name == "tpucore") {
      std::string d = model_dir;
      while (d.size() > 1 && d.back() == '/') d.pop_back();
      o.model_name = d.substr(d.find_last_of('/') == std::string::npos ? 0 : d.find_last_of('/') + 1);
    }
    const Device dev(device);
    TPU_CHECK(chip.empty() || dev.type == DeviceType::sim, "tpu-serve: --chip {} needs --device sim:N (got {})", chip, device);
    if (!chip.empty()) set_sim_chip(chip, static_cast<int>(dev.index));
    TPU_CHECK(pjrt_plugin.empty() || dev.type == DeviceType::pjrt, "tpu-serve: --pjrt-plugin needs --device pjrt:N (got {})",
              device);
    TPU_CHECK(!no_host_fallback || dev.type == DeviceType::pjrt,
              "tpu-serve: --no-host-fallback needs --device pjrt:N (got {})", device);
    if (dev.type == DeviceType::pjrt) {
      const char* env = std::getenv("TPU_PJRT_PLUGIN");
      TPU_CHECK(!pjrt_plugin.empty() || (env && *env),
                "tpu-serve: --device {} needs a PJRT plugin: --pjrt-plugin PATH or TPU_PJRT_PLUGIN", device);
      if (!pjrt_plugin.empty()) fmt::print("tpu-serve: PJRT plugin {} ({})\n", pjrt_plugin, load_pjrt_plugin(pjrt_plugin));
      if (no_host_fallback) set_pjrt_host_fallback(false);
    }
    TPU_CHECK(quantize == "none" || quantize == "int8" || quantize == "int4" || quantize == "fp8",
              "tpu-serve: --quantize must be int8, int4, fp8 or none, got '{}'", quantize);
    models::LoadOptions lo;
    lo.device = dev;
    lo.dtype = dtype == "bf16" ? DType::bf16 : DType::f32;
    lo.quantize = nn::parse_weight_quant(quantize);
    auto model = models::load_causal_lm(model_dir, lo);
    Tokenizer tok = Tokenizer::from_file(model_dir + "/tokenizer.json");
    const std::string model_config = model_dir + "/tokenizer_config.json";
    if (!chat_template_file.empty()) {
      const bool is_config = chat_template_file.size() >= 5 &&
                             chat_template_file.compare(chat_template_file.size() - 5, 5, ".json") == 0;
      if (is_config) {
        o.chat_template = ChatTemplate::from_config_file(chat_template_file);
      } else {
        std::ifstream in(chat_template_file, std::ios::binary);
        TPU_CHECK(in.good(), "tpu-serve: cannot open --chat-template {}", chat_template_file);
        std::stringstream ss;
        ss << in.rdbuf();
        o.chat_template = ChatTemplate::from_source(ss.str(), chat_template_file);
      }
    } else if (std::filesystem::exists(model_config)) {
      try {
        o.chat_template = ChatTemplate::from_config_file(model_config);
      } catch (const Error& e) {
        fmt::print(stderr, "tpu-serve: no chat template, the chat endpoint will answer 400 ({})\n", e.what());
      }
    } else {
      fmt::print(stderr, "tpu-serve: {} not found: the chat endpoint will answer 400 (see --chat-template)\n",
                 model_config);
    }
    std::signal(SIGPIPE, SIG_IGN);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    serve_http::ApiServer server(model, std::move(tok), o);
    if (o.engine.compile)
      fmt::print("tpu-serve: compiled {} step shapes\n", server.engine().warm_up());
    const int bound = server.bind(host, port);
    fmt::print("tpu-serve: model '{}' ({} parameters, {}) on http://{}:{}\n", o.model_name, model->num_parameters(),
               dev.str(), host, bound);
    std::fflush(stdout);
    std::thread watcher([&] {
      while (!g_signal) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      fmt::print("tpu-serve: signal {}: draining\n", static_cast<int>(g_signal));
      std::fflush(stdout);
      server.shutdown();
    });
    server.serve();
    if (!g_signal) g_signal = SIGTERM;  // the listener stopped on its own: let the watcher end
    watcher.join();
    const auto m = server.engine().metrics();
    fmt::print("tpu-serve: stopped ({} requests finished, {} cancelled, {} tokens generated)\n", m.requests_finished,
               m.requests_cancelled, m.generation_tokens);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "tpu-serve: {}\n", e.what());
    return 1;
  }
}
