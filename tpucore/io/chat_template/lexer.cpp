// The chat-template lexer: Jinja2's tokenizer with the settings Transformers compiles chat templates
// with: trim_blocks (the first newline after a block or comment tag is dropped), lstrip_blocks
// (spaces and tabs before a block or comment tag at the start of a line are dropped), `-` and `+`
// whitespace control on either side of a tag, newlines normalized to \n and one trailing newline
// of the source removed (keep_trailing_newline off).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "tpucore/io/chat_template/ast.h"

namespace tpu::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) {
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {  // \r\n and \r become \n
      if (source[k] == '\r') {
        src_ += '\n';
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_ += source[k];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    for (size_t k = 0; k < src_.size(); ++k)
      if (src_[k] == '\n') line_starts_.push_back(k + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t k = src_.find('{', pos);
      while (k != std::string::npos && k + 1 < src_.size() && !std::strchr("{%#", src_[k + 1])) k = src_.find('{', k + 1);
      if (k == std::string::npos || k + 1 >= src_.size()) {
        emit_text(src_.substr(pos), pos);
        break;
      }
      const char kind = src_[k + 1];
      const char mod = k + 2 < src_.size() ? src_[k + 2] : '\0';
      std::string text = src_.substr(pos, k - pos);
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (mod != '+' && kind != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) &&
            std::all_of(text.begin() + long(l_pos), text.end(), [](char c) { return c == ' ' || c == '\t'; }))
          text.resize(l_pos);
      }
      emit_text(text, pos);
      size_t p = k + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t end = src_.find("#}", p);
        if (end == std::string::npos) fail_at(pos_of(k), "unterminated comment: '{#' without '#}'");
        const char before = end > p ? src_[end - 1] : '\0';
        p = end + 2;
        if (before == '-') {
          while (p < src_.size() && is_space(src_[p])) ++p;
        } else if (before != '+' && p < src_.size() && src_[p] == '\n') {
          ++p;
        }
      } else {
        p = tag(kind == '%', k, p);
      }
      line_starting = p > 0 && src_[p - 1] == '\n';
      pos = p;
    }
    Token eof;
    eof.type = Token::Type::Eof;
    eof.pos = pos_of(src_.size());
    out_.push_back(eof);
    return std::move(out_);
  }

 private:
  Pos pos_of(size_t off) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), off);
    const size_t start = it == line_starts_.begin() ? 0 : *(it - 1);
    return Pos{int(it - line_starts_.begin()) + 1, int(off - start) + 1};
  }

  void emit_text(const std::string& text, size_t off) {
    if (text.empty()) return;
    Token t;
    t.type = Token::Type::Text;
    t.text = text;
    t.pos = pos_of(off);
    out_.push_back(std::move(t));
  }

  void push(Token::Type type, std::string text, size_t off) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.pos = pos_of(off);
    out_.push_back(std::move(t));
  }

  // Tokens of one {% %} or {{ }} tag starting at `begin` (the body at p); returns the offset after it.
  size_t tag(bool block, size_t begin, size_t p) {
    push(block ? Token::Type::BlockBegin : Token::Type::VarBegin, block ? "{%" : "{{", begin);
    int depth = 0;
    const size_t first = out_.size();
    while (true) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size()) fail_at(pos_of(begin), std::string("unexpected end of template: '") + (block ? "{%" : "{{") + "' is never closed");
      if (depth == 0) {
        const char* close = block ? "%}" : "}}";
        const bool minus = src_.compare(p, 3, std::string("-") + close) == 0;
        const bool plus = block && src_.compare(p, 3, "+%}") == 0;
        if (minus || plus || src_.compare(p, 2, close) == 0) {
          if (block && out_.size() > first && out_[first].text == "raw")
            fail_at(out_[first].pos, "unsupported construct: '{% raw %}'");
          push(block ? Token::Type::BlockEnd : Token::Type::VarEnd, close, p);
          p += (minus || plus) ? 3 : 2;
          if (minus) {
            while (p < src_.size() && is_space(src_[p])) ++p;
          } else if (block && !plus && p < src_.size() && src_[p] == '\n') {
            ++p;
          }
          return p;
        }
      }
      const char c = src_[p];
      if (c == '\'' || c == '"') {
        p = string_literal(p);
      } else if (is_digit(c)) {
        p = number(p);
      } else if (is_name_start(c)) {
        size_t e = p;
        while (e < src_.size() && (is_name_start(src_[e]) || is_digit(src_[e]))) ++e;
        push(Token::Type::Name, src_.substr(p, e - p), p);
        p = e;
      } else {
        static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : two)
          if (src_.compare(p, 2, t) == 0) op = t;
        if (op.empty()) {
          if (!std::strchr("+-*/%~<>=()[]{},.:|", c))
            fail_at(pos_of(p), std::string("unexpected character '") + c + "' in a tag");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) fail_at(pos_of(p), "unexpected '" + op + "'");
          --depth;
        }
        push(Token::Type::Op, op, p);
        p += op.size();
      }
    }
  }

  size_t number(size_t p) {
    const size_t start = p;
    auto digits = [&] {
      while (p < src_.size() && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && is_digit(src_[p + 1])))) ++p;
    };
    digits();
    bool is_float = false;
    if (p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
      ++p;
      digits();
      is_float = true;
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        p = q;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = start; k < p; ++k)
      if (src_[k] != '_') text += src_[k];
    Token t;
    t.pos = pos_of(start);
    t.text = text;
    if (is_float) {
      t.type = Token::Type::Float;
      t.f = std::strtod(text.c_str(), nullptr);
    } else {
      t.type = Token::Type::Int;
      errno = 0;
      const long long v = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) fail_at(t.pos, "integer literal " + text + " is beyond int64");
      t.i = v;
    }
    out_.push_back(std::move(t));
    return p;
  }

  // A quoted string with Python's escapes (Jinja decodes literals with 'unicode-escape').
  size_t string_literal(size_t p) {
    const char q = src_[p];
    const size_t start = p++;
    std::string val;
    while (true) {
      if (p >= src_.size()) fail_at(pos_of(start), "unterminated string literal");
      const char c = src_[p];
      if (c == q) break;
      if (c != '\\') {
        val += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) fail_at(pos_of(start), "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      auto hex = [&](int n) {
        uint32_t cp = 0;
        for (int k = 0; k < n; ++k, ++p) {
          if (p >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[p])))
            fail_at(pos_of(start), "bad \\x, \\u or \\U escape in a string literal");
          cp = cp * 16 + uint32_t(std::stoi(std::string(1, src_[p]), nullptr, 16));
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
          fail_at(pos_of(start), "escape of an invalid code point in a string literal");
        append_utf8(val, cp);
      };
      switch (e) {
        case '\n': break;
        case '\\': val += '\\'; break;
        case '\'': val += '\''; break;
        case '"': val += '"'; break;
        case 'a': val += '\a'; break;
        case 'b': val += '\b'; break;
        case 'f': val += '\f'; break;
        case 'n': val += '\n'; break;
        case 'r': val += '\r'; break;
        case 't': val += '\t'; break;
        case 'v': val += '\v'; break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        case 'N': fail_at(pos_of(start), "unsupported construct: \\N{...} escape in a string literal");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = uint32_t(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k, ++p) cp = cp * 8 + uint32_t(src_[p] - '0');
            append_utf8(val, cp);
          } else {
            val += '\\';
            val += e;
          }
      }
    }
    Token t;
    t.type = Token::Type::String;
    t.text = std::move(val);
    t.pos = pos_of(start);
    out_.push_back(std::move(t));
    return p + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace tpu::jinja
