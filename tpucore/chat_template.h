// Chat templates: renders the Jinja `chat_template` of a Hugging Face tokenizer_config.json the way
// Transformers' `apply_chat_template` does (Jinja2 with trim_blocks and lstrip_blocks, the
// sandbox's immutable values, `raise_exception`, `strftime_now` and Transformers' `tojson`).
// The interpreter covers the Jinja subset chat templates use; any other construct is a tpu::Error
// naming it and its line:column, never a silently different prompt.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace tpu {

/// What a chat template renders: the variables Transformers passes to the template.
struct ChatRequest {
  /// The conversation: an array of objects with "role", "content" and, where the template reads
  /// them, "tool_calls", "reasoning_content", "name", "tool_call_id" and so on (key order kept).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  /// Tool definitions (JSON schemas, an array) or null when the request has none.
  nlohmann::ordered_json tools = nullptr;
  /// Documents for retrieval-augmented templates (an array) or null.
  nlohmann::ordered_json documents = nullptr;
  /// Appends the header of an assistant turn (`add_generation_prompt`).
  bool add_generation_prompt = false;
  /// Further variables (an object), e.g. {"enable_thinking": false} for Qwen 3; they override the
  /// special tokens of the same name.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

/// Limits of one render, so a hostile template cannot exhaust the process.
struct ChatTemplateLimits {
  /// Largest output (and largest string built) in bytes.
  size_t max_output = size_t(16) << 20;
  /// Evaluation steps (expressions, statements, loop iterations) before the render is refused.
  size_t max_steps = size_t(20) << 20;
};

/// A parsed chat template with the special tokens of its tokenizer_config.json.
class ChatTemplate {
 public:
  /// Parses a template source. Syntax errors and unsupported constructs are tpu::Error naming
  /// `name` and the line:column.
  static ChatTemplate from_source(const std::string& source, const std::string& name = "chat_template");
  /// Reads tokenizer_config.json text: `chat_template` (a string, or a list of {"name",
  /// "template"} objects, of which `template_name` is taken, "default" when empty) and the
  /// special tokens (`bos_token`, `eos_token`, `unk_token`, `pad_token`: strings or AddedToken
  /// objects). A config without a chat template is a tpu::Error.
  static ChatTemplate from_config_text(const std::string& json_text, const std::string& template_name = "",
                                       const std::string& origin = "tokenizer_config.json");
  /// from_config_text on a file.
  static ChatTemplate from_config_file(const std::string& path, const std::string& template_name = "");

  /// Renders a conversation: the variables are the special tokens found in the config, then
  /// `messages`, `tools`, `documents`, `add_generation_prompt` and `request.extra`.
  std::string render(const ChatRequest& request, const ChatTemplateLimits& limits = {}) const;

  /// The template source.
  const std::string& source() const;
  /// The BOS token string of the config ("" when none).
  const std::string& bos_token() const;
  /// The EOS token string of the config ("" when none).
  const std::string& eos_token() const;
  /// The special tokens passed to the template (an object: bos_token, eos_token, ...).
  const nlohmann::ordered_json& special_tokens() const;

 /// The parsed template and its tokens (internal).
  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tpu
