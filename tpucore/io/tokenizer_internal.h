// Internals of tpucore/tokenizer.h shared by its source files: the pieces of a tokenizer.json
// pipeline (normalizer, pre-tokenizer, BPE model, post-processor, decoder) as read from the file.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <unicode/uversion.h>

U_NAMESPACE_BEGIN
class RegexPattern;
U_NAMESPACE_END

namespace tpu::tok {

enum class Pattern { none, gpt2, llama3, qwen2 };

struct Codepoint {
  int32_t cp;  // -1 for a byte that is not valid UTF-8
  size_t byte, len;
};
std::vector<Codepoint> decode_utf8(std::string_view s);
void append_utf8(std::string& out, int32_t cp);

// The pre-tokenizer pattern of a Split / ByteLevel regex when it is one of the three patterns
// matched by hand (none otherwise), and the pieces it cuts text into (views into text).
Pattern known_pattern(std::string_view regex);
std::vector<std::string_view> split_pieces(std::string_view text, Pattern p);
// The regex text of a pattern as tokenizer.json files spell it (empty for none).
std::string_view pattern_regex(Pattern p);

// A pattern of Split, Replace: a literal string, one of the hand-matched regexes, or any other
// regex (run by ICU's engine with \s meaning Unicode White_Space, as the reference's engine).
struct Matcher {
  std::string literal;
  Pattern known = Pattern::none;
  std::shared_ptr<icu::RegexPattern> regex;
};
// {"String": s} or {"Regex": r}; a tpu::Error naming `where` otherwise.
Matcher matcher_of(const nlohmann::json& pattern, const std::string& where);
struct Span {
  size_t begin, end;
  bool match;
};
// Covers the text: alternating unmatched and matched spans, left to right, no empty span.
std::vector<Span> find_matches(const Matcher& m, std::string_view text);

struct Normalizer {
  enum Kind { nfc, nfd, nfkc, nfkd, lowercase, strip, prepend, replace, sequence } kind = sequence;
  bool left = false, right = false;  // Strip
  std::string content;               // Prepend, Replace
  Matcher pattern;                   // Replace
  std::vector<Normalizer> seq;
};
Normalizer normalizer_of(const nlohmann::json& j, const std::string& where);
void normalize(const Normalizer& n, std::string& s);

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };
// The pieces [begin, end) that `behavior` makes of the spans (empty pieces left out).
std::vector<std::pair<size_t, size_t>> apply_behavior(std::vector<Span> spans, Behavior b, bool invert);

struct PreTokenizer {
  enum Kind { byte_level, split, metaspace, sequence } kind = sequence;
  bool add_prefix_space = false, use_regex = true;  // ByteLevel
  Matcher pattern;                                  // Split
  Behavior behavior = Behavior::isolated;
  bool invert = false;
  std::string replacement;                             // Metaspace, as UTF-8
  enum Prepend { always, first, never } prepend = always;  // Metaspace
  bool metaspace_split = true;                         // Metaspace
  std::vector<PreTokenizer> seq;
};
PreTokenizer pre_tokenizer_of(const nlohmann::json& j, const std::string& where);
// A piece of text and whether it starts at the start of the input (Metaspace's "first").
struct Piece {
  std::string text;
  bool at_start;
};
void pre_tokenize(const PreTokenizer& p, std::vector<Piece>& pieces);
// Whether the chain ends with a ByteLevel step (its byte-to-character mapping applies).
bool ends_byte_level(const PreTokenizer& p);

struct Decoder {
  enum Kind { none, byte_level, metaspace, byte_fallback, fuse, strip, replace, sequence } kind = none;
  std::string content, pattern;  // Strip (content), Replace (pattern -> content), Metaspace (content)
  int64_t start = 0, stop = 0;   // Strip
  bool prepend = true;           // Metaspace: drop the leading space of the first token
  std::vector<Decoder> seq;
};
Decoder decoder_of(const nlohmann::json& j, const std::string& where);
std::vector<std::string> decode_chain(const Decoder& d, std::vector<std::string> tokens);

// GPT-2's byte <-> printable character table.
const std::string& byte_char(uint8_t b);
int byte_of_char(int32_t cp);  // -1 when cp is not in the table

// TemplateProcessing: a list of items, each a special token or sequence A (0) / B (1).
struct TemplateItem {
  bool special;
  std::string token;  // special: its name in special_tokens
  int seq;            // sequence: 0 or 1
};
struct PostProcessor {
  bool has_template = false;
  std::vector<TemplateItem> single, pair;
  std::unordered_map<std::string, std::vector<int64_t>> special_tokens;
};
// ByteLevel, TemplateProcessing or a Sequence of them; the template is merged into `out`.
void post_processor_of(const nlohmann::json& j, const std::string& where, PostProcessor& out);

// Byte trie over the added tokens' contents: the longest content starting at a position.
class Trie {
 public:
  void add(std::string_view s, int32_t value);
  // Length and value of the longest entry at text[i...] (0, -1 if none).
  std::pair<size_t, int32_t> longest(std::string_view text, size_t i) const {
    size_t best_len = 0;
    int32_t best = -1, node = 0;
    for (size_t k = i; k < text.size(); ++k) {
      auto it = next_.find(key(node, static_cast<uint8_t>(text[k])));
      if (it == next_.end()) break;
      node = it->second;
      const int32_t v = value_[static_cast<size_t>(node)];
      if (v >= 0) best_len = k + 1 - i, best = v;
    }
    return {best_len, best};
  }
  bool empty() const { return value_.size() <= 1; }

 private:
  static uint64_t key(int32_t node, uint8_t b) { return (static_cast<uint64_t>(node) << 8) | b; }
  std::unordered_map<uint64_t, int32_t> next_;
  std::vector<int32_t> value_{-1};
};

}  // namespace tpu::tok
