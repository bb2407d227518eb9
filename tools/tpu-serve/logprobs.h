// The log-probability objects of tpu-serve's responses, in the two shapes OpenAI sends:
//   completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}
//   chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
// A token's text is its own decoding (special tokens by name); `bytes` are its UTF-8 bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tpucore/serve/engine.h"
#include "tpucore/tokenizer.h"

namespace tpu::serve_http {

std::string token_text(const Tokenizer& tok, int64_t id);
// offset: the text offset of the first token (advanced past every token's text).
nlohmann::json completion_logprobs(const Tokenizer& tok, const std::vector<serve::TokenOutput>& outs, size_t& offset);
// The prompt's part with echo: the first token's logprob and top_logprobs are null, entry i of
// `outs` is prompt token i + 1's (missing entries are null).
nlohmann::json echo_logprobs(const Tokenizer& tok, const std::vector<int64_t>& prompt,
                             const std::vector<serve::TokenOutput>& outs, size_t& offset);
// Appends b's four arrays to a's.
void append_logprobs(nlohmann::json& a, const nlohmann::json& b);
nlohmann::json chat_logprobs(const Tokenizer& tok, const std::vector<serve::TokenOutput>& outs);

}  // namespace tpu::serve_http
