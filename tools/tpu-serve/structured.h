// Structured output and tool calling for tpu-serve's chat endpoint.
//
// response_format {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema":
// ...}} becomes a serve::JsonConstraint on the request (constrained decoding). `tools` are passed
// to the chat template; with tool_choice "auto" (the default) the output is parsed for tool calls,
// with "required" or a named function the output is also constrained to one call of the family's
// format (ToolFormat), so it parses by construction; "none" leaves the output as text.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tpucore/serve/json_constraint.h"
#include "tpucore/tokenizer.h"

namespace tpu::serve_http {

// How the model writes a tool call: Qwen / Hermes `<tool_call>{"name", "arguments"}</tool_call>`,
// or Llama 3.x's bare JSON `{"name", "parameters"}`.
enum class ToolFormat { hermes, llama_json };
// From the chat template's source (templates that write `<tool_call>` are Hermes; those with
// Llama 3's `<|python_tag|>` or `"parameters"` are Llama JSON; others Hermes).
ToolFormat detect_tool_format(const std::string& template_source);

// Every token's bytes as the engine's constraints walk them (special tokens and ids past the
// tokenizer have none).
std::shared_ptr<const serve::TokenBytes> token_bytes(const Tokenizer& tok, int64_t vocab);

struct ToolCall {
  std::string name, arguments;  // arguments: a JSON text
};
// The model's text split into its content (outside the calls, trimmed) and its tool calls; only
// calls of functions in `names` count.
struct ToolOutput {
  std::string content;
  std::vector<ToolCall> calls;
};
ToolOutput parse_tool_calls(const std::string& text, const std::vector<std::string>& names);

// What a chat body asks of structured output and tools.
struct Structured {
  std::shared_ptr<const serve::JsonConstraint> constraint;  // null: free text
  nlohmann::ordered_json tools = nullptr;                   // for the chat template
  std::vector<std::string> tool_names;
  bool parse_tools = false;  // look for tool calls in the output
};
// Reads response_format, tools, tool_choice and parallel_tool_calls; throws ApiError (400 naming
// the parameter, and the schema keyword when unsupported).
Structured parse_structured(const nlohmann::json& body, const std::shared_ptr<const serve::TokenBytes>& vocab,
                            ToolFormat format);

// With tool calls in `text`: sets message's content (null when empty) and tool_calls (with
// "index" when streamed) and returns true; otherwise leaves message alone.
bool attach_tool_calls(nlohmann::json& message, const std::string& text, const std::vector<std::string>& names,
                       bool streamed);

}  // namespace tpu::serve_http
