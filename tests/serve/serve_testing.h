// Helpers of the tpu-serve tests: a tiny random model with a byte-level tokenizer written in
// Hugging Face layout, a server on 127.0.0.1 (free port) in a background thread, and an HTTP
// client that reads server-sent events.
#pragma once

#include <catch2/catch.hpp>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <thread>

#include "core/llm_reference.h"
#include "server.h"
#include "tpucore/chat_template.h"
#include "tpucore/models.h"
#include "tpucore/serve/engine.h"
#include "tpucore/tokenizer.h"

namespace tpu::testing::serve {

// Runs `prompts` through an engine at once (greedy, n new tokens each, at most `max_steps` engine
// steps); the tokens per prompt.
inline std::vector<std::vector<int64_t>> engine_greedy_tokens(tpu::serve::Engine& e,
                                                              const std::vector<std::vector<int64_t>>& prompts,
                                                              int64_t n, int max_steps = 400) {
  std::vector<std::vector<int64_t>> out(prompts.size());
  models::GenerationConfig g;
  g.max_new_tokens = n;
  for (size_t i = 0; i < prompts.size(); ++i) {
    tpu::serve::RequestCallbacks cb;
    cb.on_token = [&out, i](int64_t t) {
      out[i].push_back(t);
      return true;
    };
    e.add_request(prompts[i], tpu::serve::SamplingParams::from_generation_config(g), cb);
  }
  for (int i = 0; i < max_steps && e.has_work(); ++i) e.step();
  REQUIRE_FALSE(e.has_work());
  return out;
}

// A byte-level tokenizer: ids 0..255 are the bytes, 256 is the special <|endoftext|>.
inline void write_byte_tokenizer(const std::filesystem::path& path) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(static_cast<uint8_t>(b))] = b;
  nlohmann::json j{{"version", "1.0"},
                   {"added_tokens", {{{"id", 256}, {"content", "<|endoftext|>"}, {"special", true}}}},
                   {"normalizer", nullptr},
                   {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                   {"decoder", {{"type", "ByteLevel"}}},
                   {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  std::ofstream(path) << j.dump();
}

// The engine tests' small random Llama (seed `seed`): the byte vocabulary of 257 tokens, hidden
// 64, 4 heads of 16 (2 KV heads), intermediate 96, loaded in `dt` (its folder removed); `edit`
// changes the config before it is written (another family, a sliding window, ...).
inline std::shared_ptr<models::CausalLM> small_engine_model(uint32_t seed, DType dt, Device device = Device(),
                                                            const std::function<void(llm::TinyCfg&)>& edit = {}) {
  llm::TinyCfg c;
  c.vocab = 257;
  c.hidden = 64;
  c.inter = 96;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  if (edit) edit(c);
  auto dir = llm::temp_dir("serve_engine");
  llm::write_tiny_model(dir, c, DType::f32, 1, seed);
  auto m = models::load_causal_lm(dir.string(), device, dt);
  std::filesystem::remove_all(dir);
  return m;
}

// A tiny random Llama with a 257-token byte vocabulary (eos ids 2 and 3) and its tokenizer.
inline std::filesystem::path write_model_dir(uint32_t seed) {
  llm::TinyCfg c;
  c.vocab = 257;
  auto dir = llm::temp_dir("serve_http");
  llm::write_tiny_model(dir, c, DType::f32, 1, seed);
  write_byte_tokenizer(dir / "tokenizer.json");
  return dir;
}

struct Running {
  std::unique_ptr<serve_http::ApiServer> server;
  std::thread thread;
  int port = 0;
  Running(std::shared_ptr<models::CausalLM> m, Tokenizer tok, serve_http::ServerOptions o) {
    server = std::make_unique<serve_http::ApiServer>(std::move(m), std::move(tok), o);
    port = server->bind("127.0.0.1", 0);
    thread = std::thread([this] { server->serve(); });
  }
  ~Running() {
    server->shutdown();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(5);
    c.set_read_timeout(20);
    c.set_write_timeout(5);
    return c;
  }
};

struct Sse {
  int status = 0;
  std::vector<nlohmann::json> events;  // parsed "data:" payloads before [DONE]
  bool done = false;                   // saw data: [DONE]
  std::string raw;
  std::string error;  // the client's error when there was no response
};

// POSTs body and reads the event stream; stop_after > 0 closes the connection after that
// many events (a client going away).
inline Sse post_stream(const Running& r, const std::string& path, const std::string& body, int stop_after = 0) {
  Sse out;
  httplib::Client c = r.client();
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  std::string buf;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    out.raw.append(d, n);
    buf.append(d, n);
    size_t e;
    while ((e = buf.find("\n\n")) != std::string::npos) {
      const std::string ev = buf.substr(0, e);
      buf.erase(0, e + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      const std::string payload = ev.substr(6);
      if (payload == "[DONE]") out.done = true;
      else out.events.push_back(nlohmann::json::parse(payload));
    }
    return stop_after == 0 || static_cast<int>(out.events.size()) < stop_after;
  };
  auto res = c.send(req);
  if (res) out.status = res->status;
  else out.error = httplib::to_string(res.error());
  return out;
}

// A tiny random checkpoint written to a temporary folder (removed with the fixture), loaded, and
// the server options the HTTP tests serve it with: "role: content" chat lines, then the
// assistant's turn.
struct ModelFixture {
  ModelFixture(uint32_t seed, int64_t max_model_len, int64_t max_num_batched_tokens)
      : dir(write_model_dir(seed)), max_model_len(max_model_len), max_num_batched_tokens(max_num_batched_tokens) {}
  ~ModelFixture() { std::filesystem::remove_all(dir); }
  std::filesystem::path dir;
  std::shared_ptr<models::CausalLM> model = models::load_causal_lm(dir.string());
  Tokenizer tok = Tokenizer::from_file((dir / "tokenizer.json").string());
  int64_t max_model_len, max_num_batched_tokens;
  serve_http::ServerOptions options() const {
    serve_http::ServerOptions o;
    o.model_name = "tiny";
    o.engine.block_size = 4;
    o.engine.max_model_len = max_model_len;
    o.engine.max_num_seqs = 8;
    o.engine.max_num_batched_tokens = max_num_batched_tokens;
    o.drain_seconds = 10;
    o.chat_template = ChatTemplate::from_source(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}");
    return o;
  }
};

}  // namespace tpu::testing::serve
