// Values of the chat-template interpreter: truth, str(), repr(), json.dumps, comparison.
#include "tpucore/io/chat_template/value.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "tpucore/core/error.h"

namespace tpu::jinja {

void fail_at(Pos p, const std::string& what) { tpu::fail("chat template:{}:{}: {}", p.line, p.col, what); }

Value Value::make_list(List items, bool tuple) {
  Value v;
  v.kind = tuple ? Kind::Tuple : Kind::List;
  v.list = std::make_shared<const List>(std::move(items));
  return v;
}

Value Value::make_dict(std::shared_ptr<Dict> d, bool ns) {
  Value v;
  v.kind = ns ? Kind::Namespace : Kind::Dict;
  v.dict = std::move(d);
  return v;
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.b;
    case Value::Kind::Int: return v.i != 0;
    case Value::Kind::Float: return v.f != 0;
    case Value::Kind::String: return !v.s.empty();
    case Value::Kind::List: case Value::Kind::Tuple: return !v.list->empty();
    case Value::Kind::Dict: return !v.dict->items.empty();
    case Value::Kind::Namespace: case Value::Kind::Function: return true;
  }
  return false;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return "list";
    case Value::Kind::Tuple: return "tuple";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Function: return "function";
  }
  return "?";
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // e.g. "-1.2345e+02"
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0.";
      out.append(size_t(-exp - 1), '0');
      out += digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out += digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out.append(digits, 1);
  }
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + eb;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

namespace {

// The code point of one UTF-8 character (from utf8_chars); -1 for an invalid byte.
int32_t code_point(const std::string& ch) {
  const auto c0 = static_cast<unsigned char>(ch[0]);
  if (ch.size() == 1) return c0 < 0x80 ? c0 : -1;
  int32_t cp = ch.size() == 2 ? (c0 & 0x1F) : ch.size() == 3 ? (c0 & 0x0F) : (c0 & 0x07);
  for (size_t k = 1; k < ch.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(ch[k]) & 0x3F);
  return cp;
}

// Python's str.isprintable() for one code point.
bool printable(int32_t cp) {
  if (cp == ' ') return true;
  switch (u_charType(cp)) {
    case U_CONTROL_CHAR: case U_FORMAT_CHAR: case U_SURROGATE: case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED: case U_LINE_SEPARATOR: case U_PARAGRAPH_SEPARATOR: case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

std::string repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (const std::string& ch : utf8_chars(s)) {
    const int32_t cp = code_point(ch);
    char buf[16];
    if (cp == '\\' || cp == q) {
      out += '\\';
      out += char(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0) {
      out += ch;  // not reachable from valid UTF-8 input
    } else if (!printable(cp)) {
      std::snprintf(buf, sizeof buf, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", unsigned(cp));
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + q;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void json_into(std::string& out, const Value& v, int indent, int level, const std::string& isep,
               const std::string& ksep, bool sort_keys, Pos p) {
  if (level > 200) fail_at(p, "tojson: nesting deeper than 200 levels");
  auto newline = [&](int l) {
    if (indent >= 0) {
      out += '\n';
      out.append(size_t(indent) * size_t(l), ' ');
    }
  };
  switch (v.kind) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.i); return;
    case Value::Kind::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity") : float_repr(v.f);
      return;
    case Value::Kind::String: out += json_string(v.s); return;
    case Value::Kind::List: case Value::Kind::Tuple: {
      if (v.list->empty()) { out += "[]"; return; }
      out += "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += isep;
        newline(level + 1);
        json_into(out, (*v.list)[k], indent, level + 1, isep, ksep, sort_keys, p);
      }
      newline(level);
      out += "]";
      return;
    }
    case Value::Kind::Dict: {
      if (v.dict->items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += isep;
        newline(level + 1);
        out += json_string(items[k]->first) + ksep;
        json_into(out, items[k]->second, indent, level + 1, isep, ksep, sort_keys, p);
      }
      newline(level);
      out += "}";
      return;
    }
    default:
      fail_at(p, std::string("tojson: Object of type ") + type_name(v) + " is not JSON serializable");
  }
}

std::string repr_depth(const Value& v, int depth);

std::string seq_repr(const Value& v, int depth) {
  std::string out = v.kind == Value::Kind::Tuple ? "(" : "[";
  for (size_t k = 0; k < v.list->size(); ++k) {
    if (k) out += ", ";
    out += repr_depth((*v.list)[k], depth + 1);
  }
  if (v.kind == Value::Kind::Tuple && v.list->size() == 1) out += ",";
  return out + (v.kind == Value::Kind::Tuple ? ")" : "]");
}

std::string dict_repr(const Dict& d, int depth) {
  std::string out = "{";
  for (size_t k = 0; k < d.items.size(); ++k) {
    if (k) out += ", ";
    out += repr_string(d.items[k].first) + ": " + repr_depth(d.items[k].second, depth + 1);
  }
  return out + "}";
}

std::string repr_depth(const Value& v, int depth) {
  if (depth > 200) tpu::fail("chat template: a value nested deeper than 200 levels cannot be printed");
  switch (v.kind) {
    case Value::Kind::String: return repr_string(v.s);
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::List: case Value::Kind::Tuple: return seq_repr(v, depth);
    case Value::Kind::Dict: return dict_repr(*v.dict, depth);
    case Value::Kind::Namespace: return "<Namespace " + dict_repr(*v.dict, depth) + ">";
    default: return to_str(v);
  }
}

}  // namespace

std::string repr(const Value& v) { return repr_depth(v, 0); }

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.b ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return float_repr(v.f);
    case Value::Kind::String: return v.s;
    case Value::Kind::Function:
      tpu::fail("chat template: cannot print the function '{}' (Python prints its address)", v.fn->name);
    default: return repr(v);
  }
}

std::string to_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                    bool sort_keys, Pos p) {
  std::string out;
  const std::string isep = !item_sep.empty() ? item_sep : indent >= 0 ? "," : ", ";
  const std::string ksep = !key_sep.empty() ? key_sep : ": ";
  json_into(out, v, indent, 0, isep, ksep, sort_keys, p);
  return out;
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind == K::Float || b.kind == K::Float) return a.as_double() == b.as_double();
    return (a.kind == K::Bool ? int64_t(a.b) : a.i) == (b.kind == K::Bool ? int64_t(b.b) : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined: case K::None: return true;
    case K::String: return a.s == b.s;
    case K::List: case K::Tuple:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case K::Dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    case K::Namespace: return a.dict == b.dict;
    case K::Function: return a.fn == b.fn;
    default: return false;
  }
}

bool less(const Value& a, const Value& b, Pos p) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::Float || b.kind == Value::Kind::Float) return a.as_double() < b.as_double();
    return (a.kind == Value::Kind::Bool ? int64_t(a.b) : a.i) < (b.kind == Value::Kind::Bool ? int64_t(b.b) : b.i);
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;
  if (a.kind == b.kind && a.is_sequence()) {
    const List &x = *a.list, &y = *b.list;
    for (size_t k = 0; k < std::min(x.size(), y.size()); ++k) {
      if (equal(x[k], y[k])) continue;
      return less(x[k], y[k], p);
    }
    return x.size() < y.size();
  }
  fail_at(p, std::string("'<' not supported between instances of '") + type_name(a) + "' and '" + type_name(b) + "'");
}

Value from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null: return Value::none();
    case T::boolean: return Value::boolean(j.get<bool>());
    case T::number_integer: return Value::integer(j.get<int64_t>());
    case T::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) tpu::fail("chat template: the integer {} in the input is beyond int64", u);
      return Value::integer(int64_t(u));
    }
    case T::number_float: return Value::real(j.get<double>());
    case T::string: return Value::string(j.get<std::string>());
    case T::array: {
      List items;
      for (const auto& x : j) items.push_back(from_json(x));
      return Value::make_list(std::move(items));
    }
    case T::object: {
      auto d = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it) d->items.emplace_back(it.key(), from_json(it.value()));
      return Value::make_dict(std::move(d));
    }
    default: tpu::fail("chat template: unsupported JSON value in the input ({})", j.type_name());
  }
}

}  // namespace tpu::jinja
