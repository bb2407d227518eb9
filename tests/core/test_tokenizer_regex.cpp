// The tokenizer's hand-written pre-tokenizer matcher against a real regex engine: ICU's
// (backtracking, leftmost alternative first, like the Oniguruma engine of the reference
// library) runs the GPT-2, Llama 3 and Qwen2 patterns verbatim, except that \s / \S become the
// Unicode White_Space property (ICU's \s leaves out U+000B and U+0085). Random strings over
// letters, digits, spaces, line breaks, apostrophes and symbols of several scripts.
#include <catch2/catch.hpp>

#include <unicode/regex.h>
#include <unicode/unistr.h>

#include <random>
#include <string>
#include <vector>

#include "tpucore/tokenizer.h"

using namespace tpu;

namespace {

const std::string kGpt2Split = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const std::string kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::string kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}

// All matches of the pattern, in order (the patterns match every character, so they tile the text).
std::vector<std::string> icu_split(const std::string& pattern, const std::string& text) {
  const std::string p = replace_all(replace_all(pattern, "\\s", "\\p{White_Space}"), "\\S", "\\P{White_Space}");
  UErrorCode err = U_ZERO_ERROR;
  icu::RegexPattern* re = icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(p), 0, err);
  REQUIRE(U_SUCCESS(err));
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
  icu::RegexMatcher* m = re->matcher(u, err);
  std::vector<std::string> out;
  while (m->find()) {
    std::string piece;
    u.tempSubStringBetween(m->start(err), m->end(err)).toUTF8String(piece);
    out.push_back(piece);
  }
  delete m;
  delete re;
  return out;
}

Tokenizer with_pattern(const std::string& regex) {
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    std::string c = byte_to_unicode(static_cast<uint8_t>(b));
    if (c == "\"" || c == "\\") c = "\\" + c;
    vocab += (b ? ", \"" : "\"") + c + "\": " + std::to_string(b);
  }
  std::string esc = replace_all(regex, "\\", "\\\\");
  return Tokenizer::from_json(R"({"model": {"type": "BPE", "merges": [], "vocab": )" + vocab +
                              R"(}}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": ")" + esc +
                              R"("}, "behavior": "Isolated"}})");
}

}  // namespace

TEST_CASE("tokenizer: the hand-written split equals ICU's regex engine on random text", "[tokenizer]") {
  const std::vector<std::string> alphabet{"a", "Z", "s", "S", "t", "l", "L", "d", "v", "e", "r", "m", "é", "日", "ß",
                                          "1", "7", "٣", " ", " ", "\t", "\n", "\r", "\u00a0", "\u2028", "'", "'",
                                          "!", ".", ",", "-", "\u201c", "😀", "_"};
  std::mt19937 rng(2024);
  for (const std::string* pat : {&kGpt2Split, &kLlama3Split, &kQwen2Split}) {
    Tokenizer t = with_pattern(*pat);
    int checked = 0;
    for (int n = 0; n < 1500; ++n) {
      std::string text;
      const int len = static_cast<int>(rng() % 16);
      for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
      const auto want = icu_split(*pat, text);
      const auto got = t.pre_tokenize(text);
      INFO("pattern " << *pat << "\ntext '" << text << "'");
      REQUIRE(got == want);
      ++checked;
    }
    CHECK(checked == 1500);
  }
}
