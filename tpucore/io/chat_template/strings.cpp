// Python's str methods on UTF-8 strings for the chat-template interpreter.
#include "tpucore/io/chat_template/strings.h"

#include <unicode/uchar.h>
#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <algorithm>

#include "tpucore/io/chat_template/value.h"

namespace tpu::jinja {
namespace {

int32_t cp_of(const std::string& ch) {
  const auto c0 = static_cast<unsigned char>(ch[0]);
  if (ch.size() == 1) return c0 < 0x80 ? c0 : -1;
  int32_t cp = ch.size() == 2 ? (c0 & 0x1F) : ch.size() == 3 ? (c0 & 0x0F) : (c0 & 0x07);
  for (size_t k = 1; k < ch.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(ch[k]) & 0x3F);
  return cp;
}

// CPython's str.isspace() for one code point (bidirectional class WS, B or S, or category Zs).
bool py_space(int32_t c) {
  if (c < 0) return false;
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85) return true;
  if (c < 0x80) return false;
  const auto bidi = u_charDirection(c);
  return u_charType(c) == U_SPACE_SEPARATOR || bidi == U_WHITE_SPACE_NEUTRAL || bidi == U_BLOCK_SEPARATOR ||
         bidi == U_SEGMENT_SEPARATOR;
}

std::string join(const std::vector<std::string>& chars, size_t a, size_t b) {
  std::string out;
  for (size_t k = a; k < b; ++k) out += chars[k];
  return out;
}

template <class Pred>
std::string strip_if(const std::string& s, bool left, bool right, Pred pred) {
  const auto chars = utf8_chars(s);
  size_t a = 0, b = chars.size();
  if (left)
    while (a < b && pred(chars[a])) ++a;
  if (right)
    while (b > a && pred(chars[b - 1])) --b;
  return join(chars, a, b);
}

}  // namespace

std::string py_strip(const std::string& s, bool left, bool right) {
  return strip_if(s, left, right, [](const std::string& ch) { return py_space(cp_of(ch)); });
}

std::string py_strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  const auto set = utf8_chars(chars);
  return strip_if(s, left, right, [&](const std::string& ch) { return std::find(set.begin(), set.end(), ch) != set.end(); });
}

std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (sep) {
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
        const size_t at = s.find(*sep, pos);
        if (at == std::string::npos) break;
        out.push_back(s.substr(pos, at - pos));
        pos = at + sep->size();
      }
      out.push_back(s.substr(pos));
      return out;
    }
    size_t end = s.size();
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string::npos) break;
      out.push_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.push_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  auto chars = utf8_chars(s);
  if (from_right) std::reverse(chars.begin(), chars.end());
  size_t k = 0;
  while (true) {
    while (k < chars.size() && py_space(cp_of(chars[k]))) ++k;
    if (k == chars.size()) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      size_t e = chars.size();
      while (e > k && py_space(cp_of(chars[e - 1]))) --e;
      std::vector<std::string> rest(chars.begin() + long(k), chars.begin() + long(e));
      if (from_right) std::reverse(rest.begin(), rest.end());
      out.push_back(join(rest, 0, rest.size()));
      break;
    }
    size_t e = k;
    while (e < chars.size() && !py_space(cp_of(chars[e]))) ++e;
    std::vector<std::string> word(chars.begin() + long(k), chars.begin() + long(e));
    if (from_right) std::reverse(word.begin(), word.end());
    out.push_back(join(word, 0, word.size()));
    k = e;
  }
  if (from_right) std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> py_splitlines(const std::string& s) {
  const auto chars = utf8_chars(s);
  std::vector<std::string> out;
  std::string cur;
  for (size_t k = 0; k < chars.size(); ++k) {
    const int32_t c = cp_of(chars[k]);
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      cur += chars[k];
      continue;
    }
    if (c == '\r' && k + 1 < chars.size() && chars[k + 1] == "\n") ++k;
    out.push_back(std::move(cur));
    cur.clear();
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

std::string py_case(const std::string& s, const std::string& how) {
  auto conv = [](const std::string& x, bool upper) {
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(x);
    if (upper) u.toUpper(icu::Locale::getRoot());
    else u.toLower(icu::Locale::getRoot());
    std::string out;
    u.toUTF8String(out);
    return out;
  };
  if (how == "upper") return conv(s, true);
  if (how == "lower") return conv(s, false);
  const auto chars = utf8_chars(s);
  std::string out;
  bool prev_cased = false;
  for (size_t k = 0; k < chars.size(); ++k) {
    const int32_t c = cp_of(chars[k]);
    const bool cased = c >= 0 && (u_hasBinaryProperty(c, UCHAR_CASED));
    bool up = how == "title" ? !prev_cased : k == 0;
    if (up) {
      icu::UnicodeString u = icu::UnicodeString::fromUTF8(chars[k]);
      u.toTitle(nullptr, icu::Locale::getRoot(), U_TITLECASE_NO_LOWERCASE | U_TITLECASE_NO_BREAK_ADJUSTMENT);
      std::string t;
      u.toUTF8String(t);
      out += t;
    } else {
      out += conv(chars[k], false);
    }
    if (how == "title") prev_cased = cased || (c >= 0 && u_hasBinaryProperty(c, UCHAR_CASE_IGNORABLE) && prev_cased);
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& a, const std::string& b, int64_t count) {
  std::string out;
  if (a.empty()) {  // Python inserts `b` between every character
    const auto chars = utf8_chars(s);
    int64_t n = 0;
    for (size_t k = 0; k <= chars.size(); ++k) {
      if (count < 0 || n < count) { out += b; ++n; }
      if (k < chars.size()) out += chars[k];
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(a, pos);
    if (at == std::string::npos) break;
    out += s.substr(pos, at - pos) + b;
    pos = at + a.size();
    ++n;
  }
  return out + s.substr(pos);
}

int64_t py_count(const std::string& s, const std::string& sub) {
  if (sub.empty()) return utf8_length(s) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

bool py_is(const std::string& s, const std::string& what) {
  const auto chars = utf8_chars(s);
  if (chars.empty()) return false;
  bool any_cased = false;
  for (const auto& ch : chars) {
    const int32_t c = cp_of(ch);
    if (c < 0) return false;
    if (what == "isspace" && !py_space(c)) return false;
    if (what == "isdigit") {
      const int nt = u_getIntPropertyValue(c, UCHAR_NUMERIC_TYPE);
      if (nt != U_NT_DECIMAL && nt != U_NT_DIGIT) return false;
    }
    if (what == "isalpha" && !u_isalpha(c)) return false;
    if (what == "isalnum" && !u_isalnum(c)) return false;
    if (what == "isupper" && u_islower(c)) return false;
    if (what == "islower" && u_isupper(c)) return false;
    if ((what == "isupper" && u_isupper(c)) || (what == "islower" && u_islower(c))) any_cased = true;
  }
  return (what == "isupper" || what == "islower") ? any_cased : true;
}

}  // namespace tpu::jinja
