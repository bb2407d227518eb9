// Pre-tokenizer patterns of byte-level BPE tokenizers, matched by hand. The three supported
// regexes (GPT-2, Llama 3, Qwen2) are alternations tried left to right at each position, the
// first alternative that matches wins (with the greedy quantifiers' backtracking worked out per
// alternative below). Classes: \p{L} letters and \p{N} numbers by Unicode general category,
// \s the Unicode White_Space property (as the Oniguruma engine of the reference library).
#include <unicode/uchar.h>

#include "tpucore/core/error.h"
#include "tpucore/io/tokenizer_internal.h"

namespace tpu::tok {

namespace {

bool is_letter(int32_t c) { return c >= 0 && (U_GET_GC_MASK(c) & U_GC_L_MASK) != 0; }
bool is_number(int32_t c) { return c >= 0 && (U_GET_GC_MASK(c) & U_GC_N_MASK) != 0; }
bool is_space(int32_t c) { return c >= 0 && u_isUWhiteSpace(c); }
bool is_crlf(int32_t c) { return c == '\r' || c == '\n'; }
int32_t lower(int32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// Length of the match at cps[i] (at least 1).
size_t match_at(const std::vector<int32_t>& cps, size_t i, Pattern p) {
  const size_t n = cps.size();
  auto at = [&](size_t k) { return k < n ? cps[k] : -1; };
  const bool llama = p != Pattern::gpt2;
  // 1. Contractions 's 't 're 've 'm 'll 'd (case-insensitive in Llama 3 / Qwen2).
  if (cps[i] == '\'') {
    auto ch = [&](size_t k) { return llama ? lower(at(k)) : at(k); };
    const int32_t a = ch(i + 1), b = ch(i + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  auto run = [&](size_t k, bool (*cls)(int32_t)) {
    while (k < n && cls(cps[k])) ++k;
    return k;
  };
  // 2. Letters: GPT-2 " ?\p{L}+"; Llama "[^\r\n\p{L}\p{N}]?\p{L}+".
  {
    const int32_t c = cps[i];
    const bool lead = llama ? (!is_crlf(c) && !is_letter(c) && !is_number(c)) : c == ' ';
    if (lead && is_letter(at(i + 1))) return run(i + 1, is_letter) - i;
    if (is_letter(c)) return run(i, is_letter) - i;
  }
  // 3. Numbers: GPT-2 " ?\p{N}+"; Llama 3 "\p{N}{1,3}"; Qwen2 "\p{N}".
  if (p == Pattern::gpt2) {
    if (cps[i] == ' ' && is_number(at(i + 1))) return run(i + 1, is_number) - i;
    if (is_number(cps[i])) return run(i, is_number) - i;
  } else if (is_number(cps[i])) {
    const size_t cap = p == Pattern::llama3 ? 3 : 1;
    size_t k = i;
    while (k < n && k - i < cap && is_number(cps[k])) ++k;
    return k - i;
  }
  // 4. Other symbols: " ?[^\s\p{L}\p{N}]+" (Llama: then "[\r\n]*").
  {
    auto other = [](int32_t c) { return !is_space(c) && !is_letter(c) && !is_number(c); };
    size_t k = i;
    if (cps[k] == ' ' && other(at(k + 1))) ++k;
    if (other(at(k))) {
      while (k < n && other(cps[k])) ++k;
      if (llama)
        while (k < n && is_crlf(cps[k])) ++k;
      return k - i;
    }
  }
  // White space only from here.
  const size_t end = run(i, is_space);
  if (end == i) return 1;  // unreachable with these patterns; keeps the scan moving
  // 5. Llama: "\s*[\r\n]+": up to and including the last line break of the white-space run.
  if (llama) {
    for (size_t k = end; k > i; --k)
      if (is_crlf(cps[k - 1])) return k - i;
  }
  // 6. "\s+(?!\S)": the run, minus its last character when text follows.
  if (end == n) return end - i;
  if (end - 1 > i) return end - 1 - i;
  // 7. "\s+".
  return end - i;
}

}  // namespace

std::vector<Codepoint> decode_utf8(std::string_view s) {
  std::vector<Codepoint> out;
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    int32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1f) : len == 3 ? (b0 & 0x0f) : (b0 & 0x07);
    bool ok = len > 0 && i + static_cast<size_t>(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto b = static_cast<uint8_t>(s[i + static_cast<size_t>(k)]);
      ok = (b >> 6) == 2;
      cp = (cp << 6) | (b & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid too.
    if (ok) ok = !(len == 2 && cp < 0x80) && !(len == 3 && cp < 0x800) && !(len == 4 && cp < 0x10000) &&
                 !(cp >= 0xd800 && cp <= 0xdfff) && cp <= 0x10ffff;
    if (!ok) len = 1, cp = -1;  // an invalid byte stands alone (class: other symbol)
    out.push_back({cp, i, static_cast<size_t>(len)});
    i += static_cast<size_t>(len);
  }
  return out;
}

std::vector<std::string_view> split_pieces(std::string_view text, Pattern p) {
  std::vector<std::string_view> out;
  if (p == Pattern::none) {
    if (!text.empty()) out.push_back(text);
    return out;
  }
  const std::vector<Codepoint> cps = decode_utf8(text);
  std::vector<int32_t> c(cps.size());
  for (size_t k = 0; k < cps.size(); ++k) c[k] = cps[k].cp < 0 ? 0xfffd : cps[k].cp;
  // U+FFFD is an "other symbol", the class an invalid byte gets.
  size_t i = 0;
  while (i < c.size()) {
    const size_t len = match_at(c, i, p);
    const size_t b = cps[i].byte, e = cps[i + len - 1].byte + cps[i + len - 1].len;
    out.push_back(text.substr(b, e - b));
    i += len;
  }
  return out;
}

namespace {
constexpr std::string_view kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}  // namespace

Pattern known_pattern(std::string_view regex) {
  if (regex == kGpt2) return Pattern::gpt2;
  if (regex == kLlama3) return Pattern::llama3;
  if (regex == kQwen2) return Pattern::qwen2;
  return Pattern::none;
}

std::string_view pattern_regex(Pattern p) {
  switch (p) {
    case Pattern::gpt2: return kGpt2;
    case Pattern::llama3: return kLlama3;
    case Pattern::qwen2: return kQwen2;
    case Pattern::none: break;
  }
  return {};
}

}  // namespace tpu::tok
