// The OpenAI-compatible request side of tpu-serve: parsing and validating /v1/completions and
// /v1/chat/completions bodies into engine requests, the chat template, error bodies, and the
// UTF-8 care that streaming byte-level tokens needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tpucore/chat_template.h"
#include "tpucore/serve/sampling_params.h"
#include "tpucore/tokenizer.h"

namespace tpu::serve_http {

// A request the API refuses: HTTP status, OpenAI error type and the offending parameter.
struct ApiError {
  int status = 400;
  std::string message, type = "invalid_request_error", param;
};
std::string error_body(const ApiError& e);

struct ModelInfo {
  std::string name;
  const Tokenizer* tokenizer = nullptr;
  int64_t max_model_len = 0;
  std::vector<int64_t> eos;  // stop tokens of the model (config.json eos_token_id)
  const ChatTemplate* chat_template = nullptr;  // the chat endpoint's prompt format (null: refused)
};

struct CompletionRequest {
  bool chat = false, stream = false, include_usage = false;
  std::vector<int64_t> prompt;
  serve::SamplingParams params;
  std::vector<std::string> stop;  // stop strings (not part of the returned text)
};

// Throws ApiError for invalid JSON, wrong types or values, an unknown model (404) and a
// prompt that does not fit the context (400).
CompletionRequest parse_request(const std::string& body, bool chat, const ModelInfo& info);

// The prompt text of chat messages: the model's chat template rendered on {role, content}
// messages with the assistant's turn opened (add_generation_prompt). Without a template, or when
// the template rejects the conversation, an ApiError (400).
std::string chat_prompt(const nlohmann::json& messages, const ChatTemplate* tmpl);

// Length of the longest prefix of s that does not end inside a UTF-8 sequence.
size_t utf8_complete(const std::string& s);

}  // namespace tpu::serve_http
