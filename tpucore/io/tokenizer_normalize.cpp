// Patterns (literal strings and regexes) and normalizers of tokenizer.json files. Normalization
// forms and case mapping come from ICU; a regex that is not one of the hand-matched pre-tokenizer
// patterns runs on ICU's regex engine, with \s / \S rewritten to the Unicode White_Space property
// (the class the reference library's engine gives \s).
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/ustring.h>
#include <unicode/utext.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "tpucore/core/error.h"
#include "tpucore/io/tokenizer_internal.h"

namespace tpu::tok {

using json = nlohmann::json;

void append_utf8(std::string& out, int32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

namespace {

// \s -> \p{White_Space}, \S -> \P{White_Space}; every other escape is kept as written.
std::string icu_regex_text(const std::string& r) {
  std::string out;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i] == '\\' && i + 1 < r.size()) {
      const char c = r[i + 1];
      if (c == 's') out += "\\p{White_Space}";
      else if (c == 'S') out += "\\P{White_Space}";
      else out.append(r, i, 2);
      ++i;
    } else {
      out += r[i];
    }
  }
  return out;
}

const icu::Normalizer2* form(Normalizer::Kind k) {
  UErrorCode st = U_ZERO_ERROR;
  const icu::Normalizer2* n = k == Normalizer::nfc    ? icu::Normalizer2::getNFCInstance(st)
                              : k == Normalizer::nfd  ? icu::Normalizer2::getNFDInstance(st)
                              : k == Normalizer::nfkc ? icu::Normalizer2::getNFKCInstance(st)
                                                      : icu::Normalizer2::getNFKDInstance(st);
  TPU_CHECK(U_SUCCESS(st) && n != nullptr, "Tokenizer: ICU has no normalizer ({})", u_errorName(st));
  return n;
}

void replace_all(std::string& s, const Matcher& m, const std::string& content) {
  std::string out;
  for (const Span& sp : find_matches(m, s)) {
    if (sp.match) out += content;
    else out.append(s, sp.begin, sp.end - sp.begin);
  }
  s.swap(out);
}

}  // namespace

Matcher matcher_of(const json& p, const std::string& where) {
  Matcher m;
  TPU_CHECK(p.is_object() && p.size() == 1 && (p.contains("String") || p.contains("Regex")),
            "{}: pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", where, p.dump().substr(0, 80));
  if (p.contains("String")) {
    TPU_CHECK(p["String"].is_string(), "{}: pattern.String must be a string", where);
    m.literal = p["String"].get<std::string>();
    TPU_CHECK(!m.literal.empty(), "{}: pattern.String is empty", where);
    return m;
  }
  TPU_CHECK(p["Regex"].is_string(), "{}: pattern.Regex must be a string", where);
  const std::string r = p["Regex"].get<std::string>();
  m.known = known_pattern(r);
  if (m.known != Pattern::none) return m;
  UErrorCode st = U_ZERO_ERROR;
  UParseError pe{};
  const icu::UnicodeString text = icu::UnicodeString::fromUTF8(icu_regex_text(r));
  m.regex.reset(icu::RegexPattern::compile(text, 0, pe, st));
  TPU_CHECK(U_SUCCESS(st) && m.regex, "{}: pattern.Regex '{}' does not compile ({} at offset {})", where, r,
            u_errorName(st), pe.offset);
  return m;
}

std::vector<Span> find_matches(const Matcher& m, std::string_view text) {
  std::vector<Span> out;
  size_t prev = 0;
  auto hit = [&](size_t b, size_t e) {
    if (e <= b) return;  // empty matches make no piece
    if (b > prev) out.push_back({prev, b, false});
    out.push_back({b, e, true});
    prev = e;
  };
  if (m.known != Pattern::none) {
    for (auto p : split_pieces(text, m.known)) {
      const size_t b = static_cast<size_t>(p.data() - text.data());
      hit(b, b + p.size());
    }
  } else if (m.regex) {
    UErrorCode st = U_ZERO_ERROR;
    UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &st);
    std::unique_ptr<icu::RegexMatcher> rm(m.regex->matcher(st));
    TPU_CHECK(U_SUCCESS(st) && rm, "Tokenizer: ICU regex matcher failed ({})", u_errorName(st));
    rm->reset(ut);
    while (rm->find(st) && U_SUCCESS(st)) {
      const auto b = static_cast<size_t>(rm->start64(st)), e = static_cast<size_t>(rm->end64(st));
      hit(b, e);
    }
    utext_close(ut);
    TPU_CHECK(U_SUCCESS(st), "Tokenizer: ICU regex matching failed ({})", u_errorName(st));
  } else if (!m.literal.empty()) {
    for (size_t at = text.find(m.literal); at != std::string_view::npos; at = text.find(m.literal, prev))
      hit(at, at + m.literal.size());
  }
  if (prev < text.size()) out.push_back({prev, text.size(), false});
  return out;
}

std::vector<std::pair<size_t, size_t>> apply_behavior(std::vector<Span> spans, Behavior b, bool invert) {
  if (invert)
    for (Span& s : spans) s.match = !s.match;
  std::vector<std::pair<size_t, size_t>> out;
  bool previous_match = false;
  switch (b) {
    case Behavior::removed:
      for (const Span& s : spans)
        if (!s.match) out.emplace_back(s.begin, s.end);
      break;
    case Behavior::isolated:
      for (const Span& s : spans) out.emplace_back(s.begin, s.end);
      break;
    case Behavior::merged_with_previous:
      for (const Span& s : spans) {
        if (s.match && !previous_match && !out.empty()) out.back().second = s.end;
        else out.emplace_back(s.begin, s.end);
        previous_match = s.match;
      }
      break;
    case Behavior::merged_with_next:
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.match && !previous_match && !out.empty()) out.back().first = s.begin;
        else out.emplace_back(s.begin, s.end);
        previous_match = s.match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::contiguous:
      for (size_t k = 0; k < spans.size(); ++k) {
        const Span& s = spans[k];
        if (k > 0 && s.match == previous_match) out.back().second = s.end;
        else out.emplace_back(s.begin, s.end);
        previous_match = s.match;
      }
      break;
  }
  std::erase_if(out, [](const auto& p) { return p.second <= p.first; });
  return out;
}

Normalizer normalizer_of(const json& j, const std::string& where) {
  TPU_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), "{}: needs a \"type\"", where);
  const std::string type = j["type"].get<std::string>();
  Normalizer n;
  if (type == "NFC") n.kind = Normalizer::nfc;
  else if (type == "NFD") n.kind = Normalizer::nfd;
  else if (type == "NFKC") n.kind = Normalizer::nfkc;
  else if (type == "NFKD") n.kind = Normalizer::nfkd;
  else if (type == "Lowercase") n.kind = Normalizer::lowercase;
  else if (type == "Strip") {
    n.kind = Normalizer::strip;
    n.left = j.value("strip_left", false);
    n.right = j.value("strip_right", false);
  } else if (type == "Prepend") {
    n.kind = Normalizer::prepend;
    TPU_CHECK(j.contains("prepend") && j["prepend"].is_string(), "{}: Prepend needs a \"prepend\" string", where);
    n.content = j["prepend"].get<std::string>();
  } else if (type == "Replace") {
    n.kind = Normalizer::replace;
    TPU_CHECK(j.contains("pattern") && j.contains("content") && j["content"].is_string(),
              "{}: Replace needs \"pattern\" and a \"content\" string", where);
    n.pattern = matcher_of(j["pattern"], where + " Replace");
    n.content = j["content"].get<std::string>();
  } else if (type == "Sequence") {
    TPU_CHECK(j.contains("normalizers") && j["normalizers"].is_array(), "{}: Sequence needs a \"normalizers\" list",
              where);
    for (const auto& q : j["normalizers"]) n.seq.push_back(normalizer_of(q, where));
  } else {
    fail("{}: normalizer type '{}' is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, "
         "Sequence)",
         where, type);
  }
  return n;
}

void normalize(const Normalizer& n, std::string& s) {
  switch (n.kind) {
    case Normalizer::nfc:
    case Normalizer::nfd:
    case Normalizer::nfkc:
    case Normalizer::nfkd: {
      const icu::Normalizer2* f = form(n.kind);
      UErrorCode st = U_ZERO_ERROR;
      if (f->isNormalizedUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), st) && U_SUCCESS(st)) return;
      st = U_ZERO_ERROR;
      std::string out;
      icu::StringByteSink<std::string> sink(&out);
      f->normalizeUTF8(0, icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), sink, nullptr, st);
      TPU_CHECK(U_SUCCESS(st), "Tokenizer: Unicode normalization failed ({})", u_errorName(st));
      s.swap(out);
      return;
    }
    case Normalizer::lowercase: {
      // Each character's full lowercase mapping on its own (no context, as the reference).
      std::string out;
      for (const Codepoint& c : decode_utf8(s)) {
        if (c.cp < 0) {
          out.append(s, c.byte, c.len);
        } else if (c.cp < 0x80) {
          out += static_cast<char>(c.cp >= 'A' && c.cp <= 'Z' ? c.cp + 32 : c.cp);
        } else {
          UChar src[2], dst[8];
          int32_t len = 0;
          U16_APPEND_UNSAFE(src, len, c.cp);
          UErrorCode st = U_ZERO_ERROR;
          const int32_t n16 = u_strToLower(dst, 8, src, len, "", &st);
          if (U_FAILURE(st)) {
            out.append(s, c.byte, c.len);
            continue;
          }
          for (int32_t k = 0; k < n16;) {
            UChar32 cp;
            U16_NEXT(dst, k, n16, cp);
            append_utf8(out, cp);
          }
        }
      }
      s.swap(out);
      return;
    }
    case Normalizer::strip: {
      const auto cps = decode_utf8(s);
      size_t b = 0, e = cps.size();
      if (n.left)
        while (b < e && cps[b].cp >= 0 && u_isUWhiteSpace(cps[b].cp)) ++b;
      if (n.right)
        while (e > b && cps[e - 1].cp >= 0 && u_isUWhiteSpace(cps[e - 1].cp)) --e;
      s = b == e ? std::string() : s.substr(cps[b].byte, cps[e - 1].byte + cps[e - 1].len - cps[b].byte);
      return;
    }
    case Normalizer::prepend:
      if (!s.empty()) s.insert(0, n.content);
      return;
    case Normalizer::replace:
      replace_all(s, n.pattern, n.content);
      return;
    case Normalizer::sequence:
      for (const Normalizer& q : n.seq) normalize(q, s);
      return;
  }
}

}  // namespace tpu::tok
