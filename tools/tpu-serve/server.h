// tpu-serve's HTTP side: an OpenAI-compatible API over cpp-httplib in front of a
// serve::Engine stepped by one background thread.
//
//   POST /v1/completions, /v1/chat/completions   (JSON, or server-sent events with "stream")
//   GET  /v1/models, /v1/models/{id}, /health (200, empty body), /metrics (Prometheus text,
//        tpu_serve_* and vLLM's vllm:* names)
//
// Chat requests may ask for structured output (response_format json_object / json_schema:
// constrained decoding) and tool calls (tools, tool_choice; the output parsed into
// message.tool_calls); see structured.h.
// Every completion carries the host's (and on a sim device the simulated chip's) time to first
// token and per output token: x-tpucore-* headers, or a streamed response's last chunk (timing.h).
// A request is n choices (best_of sequences when more), each an engine request of its own;
// stop strings are checked by the engine at every token (EngineConfig::detokenize), so a
// request stops at the token that completes one. Errors are JSON bodies {"error": {"message",
// "type", "param", "code"}} with a 4xx status (404 unknown route or model, 400 bad request,
// unsupported parameter or prompt longer than the context, 429 queue full, 503 while shutting
// down); code is OpenAI's string or null. A client that disconnects is cancelled and its KV blocks
// freed: a streaming one at its next token (the write fails), a non-streaming one when its
// wait loop sees the socket closed. shutdown() stops accepting requests (503), lets running
// ones finish for up to drain_seconds, cancels what remains, then stops the listener.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tpucore/chat_template.h"
#include "tpucore/serve/engine.h"
#include "tpucore/tokenizer.h"

namespace tpu::serve_http {

struct ServerOptions {
  std::string model_name = "tpucore";
  int threads = 64;            // HTTP worker threads (each streaming client holds one)
  double drain_seconds = 30;   // shutdown: how long running requests may still finish
  serve::EngineConfig engine;
  std::optional<ChatTemplate> chat_template;  // the chat endpoint's prompt format (none: it answers 400)
};

class ApiServer {
 public:
  ApiServer(std::shared_ptr<models::CausalLM> model, Tokenizer tokenizer, ServerOptions opts);
  ~ApiServer();
  // Binds host:port (port 0: any free port) and returns the port; a tpu::Error if it fails.
  int bind(const std::string& host, int port);
  // Serves until shutdown() (blocks).
  void serve();
  // Drains and stops; safe from any thread except a signal handler; idempotent.
  void shutdown();
  serve::Engine& engine();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpu::serve_http
