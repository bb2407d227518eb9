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
#include "structured.h"

namespace tpu::serve_http {

// A request the API refuses: HTTP status, OpenAI error type, the offending parameter and
// OpenAI's error code string (empty: null in the body, as OpenAI sends for most errors).
struct ApiError {
  int status = 400;
  std::string message, type = "invalid_request_error", param, code;
};
std::string error_body(const ApiError& e);

struct ModelInfo {
  std::string name;
  const Tokenizer* tokenizer = nullptr;
  int64_t max_model_len = 0;
  std::vector<int64_t> eos;  // stop tokens of the model (config.json eos_token_id)
  const ChatTemplate* chat_template = nullptr;  // the chat endpoint's prompt format (null: refused)
  std::shared_ptr<const serve::TokenBytes> token_bytes;  // for structured output (model's vocabulary)
  ToolFormat tool_format = ToolFormat::hermes;
};

struct CompletionRequest {
  bool chat = false, stream = false, include_usage = false;
  std::vector<int64_t> prompt;
  std::string prompt_text;  // completions: the prompt as text (echo)
  serve::SamplingParams params;  // of choice 0; choice i > 0 gets choice_seed(params.seed, i)
  std::vector<std::string> stop;  // stop strings (not part of the returned text)
  int64_t n = 1;        // choices returned
  int64_t best_of = 1;  // sequences generated (>= n); the n with the highest summed logprob are returned
  int64_t logprobs = -1;  // -1: none; else log-probabilities with this many top alternatives
  bool echo = false;      // completions: the prompt text before the completion
  bool parse_tools = false;             // chat with tools: the output is parsed for tool calls
  std::vector<std::string> tool_names;  // the functions a call may name
};

// Throws ApiError for invalid JSON, wrong types or values, an unknown model (404), a prompt
// that does not fit the context (400), and every parameter that would change the result but is
// not implemented (400 naming it, code "unsupported_parameter"). Without a `seed`, a fresh
// random one is drawn for the request.
CompletionRequest parse_request(const std::string& body, bool chat, const ModelInfo& info);

// The seed of choice i of a request seeded with `seed` (choice 0: the seed itself).
uint64_t choice_seed(uint64_t seed, int64_t i);

// The prompt text of chat messages: the model's chat template rendered on {role, content}
// messages (an assistant's tool_calls, a tool message's tool_call_id kept) and the tools, with
// the assistant's turn opened (add_generation_prompt). Without a template, or when the template
// rejects the conversation, an ApiError (400).
std::string chat_prompt(const nlohmann::json& messages, const ChatTemplate* tmpl,
                        const nlohmann::ordered_json& tools = nullptr);

// Length of the longest prefix of s that does not end inside a UTF-8 sequence.
size_t utf8_complete(const std::string& s);

}  // namespace tpu::serve_http
