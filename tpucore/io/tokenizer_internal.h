// Internals of tpucore/tokenizer.h shared by its source files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tpu::tok {

enum class Pattern { none, gpt2, llama3, qwen2 };

struct Codepoint {
  int32_t cp;  // -1 for a byte that is not valid UTF-8
  size_t byte, len;
};
std::vector<Codepoint> decode_utf8(std::string_view s);

// The pre-tokenizer pattern of a Split / ByteLevel regex (a tpu::Error naming `where` if it is
// none of the supported ones), and the pieces it cuts text into (views into text).
Pattern pattern_of(std::string_view regex, const std::string& where);
std::vector<std::string_view> split_pieces(std::string_view text, Pattern p);
// The regex text of a pattern as tokenizer.json files spell it (empty for none).
std::string_view pattern_regex(Pattern p);

}  // namespace tpu::tok
