#include "tpucore/serve/json_constraint.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <set>

namespace tpu::serve {

using nlohmann::json;

namespace {
// Schema node kinds.
enum : int { kJcObject, kJcArray, kJcString, kJcNumber, kJcInteger, kJcLiterals, kJcAnyOf };
// Frame kinds.
enum : uint8_t { jcValue, jcObject, jcArray, jcString, jcNumber, jcText };
// Object phases.
enum : uint8_t { jcOpen, jcKeyStart, jcKeyLit, jcAfterKey, jcAfterValue };
// Array phases.
enum : uint8_t { jcArrOpen, jcArrAfterValue };
// Number phases (accepting: zero, int, frac, exp).
enum : uint8_t { jcMinus, jcZero, jcInt, jcDot, jcFrac, jcE, jcESign, jcExp };
constexpr int kJcMaxExponentDigits = 2;

bool jc_space(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool jc_hex_digit(uint8_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool jc_number_accepting(uint8_t phase) { return phase == jcZero || phase == jcInt || phase == jcFrac || phase == jcExp; }
}  // namespace

TokenBytes::TokenBytes(std::vector<std::optional<std::string>> bytes) : bytes_(std::move(bytes)) {
  for (size_t i = 0; i < bytes_.size(); ++i)
    if (bytes_[i] && !bytes_[i]->empty()) order_.push_back(static_cast<int64_t>(i));
  std::sort(order_.begin(), order_.end(), [&](int64_t a, int64_t b) {
    return *bytes_[static_cast<size_t>(a)] < *bytes_[static_cast<size_t>(b)] || (*bytes_[static_cast<size_t>(a)] == *bytes_[static_cast<size_t>(b)] && a < b);
  });
  common_.assign(order_.size(), 0);
  for (size_t i = 1; i < order_.size(); ++i) {
    const std::string &p = *bytes_[static_cast<size_t>(order_[i - 1])], &q = *bytes_[static_cast<size_t>(order_[i])];
    uint32_t k = 0;
    while (k < p.size() && k < q.size() && p[k] == q[k]) ++k;
    common_[i] = k;
  }
}

// Schema -> nodes.
struct JsonSchemaCompiler {
  JsonConstraint& g;
  int32_t any = -1;

  int32_t add(JsonConstraint::Node n) {
    g.nodes_.push_back(std::move(n));
    return static_cast<int32_t>(g.nodes_.size() - 1);
  }
  int32_t literal(const json& v) {
    g.literals_.push_back(v.dump());
    return static_cast<int32_t>(g.literals_.size() - 1);
  }
  int32_t literals(const std::vector<json>& vs) {
    JsonConstraint::Node n;
    n.kind = kJcLiterals;
    for (const json& v : vs) n.alts.push_back(literal(v));
    return add(n);
  }
  int32_t any_value() {
    if (any >= 0) return any;
    any = add({});
    g.nodes_[static_cast<size_t>(any)].kind = kJcAnyOf;
    JsonConstraint::Node obj, arr, str, num;
    obj.kind = kJcObject;
    obj.additional = any;
    arr.kind = kJcArray;
    arr.items = any;
    str.kind = kJcString;
    num.kind = kJcNumber;
    std::vector<int32_t> alts{add(obj), add(arr), add(str), add(num), literals({true, false, nullptr})};
    g.nodes_[static_cast<size_t>(any)].alts = alts;
    return any;
  }
  [[noreturn]] static void unsupported(const std::string& keyword, const std::string& at, const std::string& why) {
    throw UnsupportedSchema(keyword, fmt::format("the JSON schema {} at '{}' is not supported by constrained decoding{}",
                                                 keyword.empty() ? "value" : "keyword '" + keyword + "'", at, why));
  }

  int32_t compile(const json& s, const std::string& at, int depth) {
    if (depth > 32) unsupported("", at, " (nested more than 32 levels)");
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      unsupported("", at, " (the schema false accepts nothing)");
    }
    if (!s.is_object()) unsupported("", at, " (a schema must be an object or a boolean)");
    static const std::set<std::string> known{"type", "properties", "required", "additionalProperties", "items",
                                             "enum", "const", "anyOf", "title", "description", "default",
                                             "examples", "$schema", "$id", "$comment", "strict"};
    for (const auto& [k, v] : s.items())
      if (!known.count(k)) unsupported(k, at, "");
    if (s.contains("const")) return literals({s["const"]});
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) unsupported("enum", at, " (it must be a non-empty array)");
      return literals(std::vector<json>(s["enum"].begin(), s["enum"].end()));
    }
    if (s.contains("anyOf")) {
      const json& alts = s["anyOf"];
      if (!alts.is_array() || alts.empty()) unsupported("anyOf", at, " (it must be a non-empty array)");
      for (const char* k : {"type", "properties", "items"})
        if (s.contains(k)) unsupported("anyOf", at, fmt::format(" together with '{}'", k));
      JsonConstraint::Node n;
      n.kind = kJcAnyOf;
      for (size_t i = 0; i < alts.size(); ++i)
        n.alts.push_back(compile(alts[i], fmt::format("{}/anyOf/{}", at, i), depth + 1));
      return add(n);
    }
    std::string type;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_array()) {
        if (t.empty()) unsupported("type", at, " (an empty list of types)");
        JsonConstraint::Node n;
        n.kind = kJcAnyOf;
        for (const json& one : t) {
          json sub = s;
          sub["type"] = one;
          n.alts.push_back(compile(sub, at, depth + 1));
        }
        return add(n);
      }
      if (!t.is_string()) unsupported("type", at, " (it must be a string or a list of strings)");
      type = t.get<std::string>();
    } else if (s.contains("properties")) {
      type = "object";
    } else if (s.contains("items")) {
      type = "array";
    } else {
      return any_value();
    }
    JsonConstraint::Node n;
    if (type == "string") n.kind = kJcString;
    else if (type == "number") n.kind = kJcNumber;
    else if (type == "integer") n.kind = kJcInteger;
    else if (type == "boolean") return literals({true, false});
    else if (type == "null") return literals({nullptr});
    else if (type == "array") return compile_array(s, at, depth);
    else if (type == "object") return compile_object(s, at, depth);
    else unsupported("type", at, fmt::format(" (unknown type '{}')", type));
    return add(n);
  }

  int32_t compile_array(const json& s, const std::string& at, int depth) {
    JsonConstraint::Node n;
    n.kind = kJcArray;
    n.items = s.contains("items") ? compile(s["items"], at + "/items", depth + 1) : any_value();
    return add(n);
  }

  int32_t compile_object(const json& s, const std::string& at, int depth) {
    JsonConstraint::Node n;
    n.kind = kJcObject;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) unsupported("properties", at, " (it must be an object)");
      if (s["properties"].size() > 64) unsupported("properties", at, " (more than 64 properties)");
      for (const auto& [name, sub] : s["properties"].items()) {
        const std::string quoted = json(name).dump();
        n.props.push_back({quoted.substr(1, quoted.size() - 2), compile(sub, at + "/properties/" + name, depth + 1)});
      }
    }
    if (s.contains("required")) {
      if (!s["required"].is_array()) unsupported("required", at, " (it must be an array of names)");
      for (const json& r : s["required"]) {
        const std::string quoted = r.is_string() ? r.dump() : std::string();
        const auto it = std::find_if(n.props.begin(), n.props.end(), [&](const auto& p) {
          return !quoted.empty() && p.first == quoted.substr(1, quoted.size() - 2);
        });
        if (it == n.props.end())
          unsupported("required", at, fmt::format(" (required {} is not among the properties)", r.dump()));
        n.required |= uint64_t{1} << (it - n.props.begin());
      }
    }
    const json extra = s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
    // With properties, only they are generated (a subset of what the schema accepts); without,
    // keys are free and values follow additionalProperties.
    if (n.props.empty() && !(extra.is_boolean() && !extra.get<bool>()))
      n.additional = compile(extra, at + "/additionalProperties", depth + 1);
    else if (!extra.is_boolean() && !extra.is_object())
      unsupported("additionalProperties", at, " (it must be a boolean or a schema)");
    return add(n);
  }
};

std::shared_ptr<const JsonConstraint> JsonConstraint::compile(const json& schema, std::shared_ptr<const TokenBytes> vocab,
                                                              const std::string& prefix, const std::string& suffix) {
  std::shared_ptr<JsonConstraint> g(new JsonConstraint());
  g->vocab_ = std::move(vocab);
  JsonSchemaCompiler c{*g};
  if (schema.is_null()) {
    Node obj;
    obj.kind = kJcObject;
    obj.additional = c.any_value();
    g->root_ = c.add(obj);
  } else {
    g->root_ = c.compile(schema, "#", 0);
  }
  if (!prefix.empty()) {
    g->literals_.push_back(prefix);
    g->prefix_ = static_cast<int32_t>(g->literals_.size() - 1);
  }
  if (!suffix.empty()) {
    g->literals_.push_back(suffix);
    g->suffix_ = static_cast<int32_t>(g->literals_.size() - 1);
  }
  return g;
}

JsonConstraint::State JsonConstraint::start() const {
  Stack st;
  if (suffix_ >= 0) st.push_back(Frame{0, jcText, 0, 0, suffix_, 0, 0});
  st.push_back(Frame{root_, jcValue, 0, 0, 0, 0, 0});
  if (prefix_ >= 0) st.push_back(Frame{0, jcText, 0, 0, prefix_, 0, 0});
  return State{{st}};
}

void JsonConstraint::feed_stack(Stack st, uint8_t c, std::vector<Stack>& out) const {
  const bool space = jc_space(c);
  for (;;) {
    if (st.empty()) return;  // the document is over: no byte may follow
    Frame& f = st.back();
    const auto accept = [&] { out.push_back(std::move(st)); };
    if (f.kind != jcText && f.kind != jcString && f.kind != jcNumber && !(f.kind == jcObject && f.phase == jcKeyLit)) {
      if (space) {
        if (f.ws >= kMaxWhitespace) return;
        f.ws++;
        return accept();
      }
      f.ws = 0;
    }
    switch (f.kind) {
      case jcText: {
        const std::string& lit = literals_[static_cast<size_t>(f.a)];
        if (static_cast<size_t>(f.b) < lit.size()) {
          if (static_cast<uint8_t>(lit[static_cast<size_t>(f.b)]) != c) return;
          f.b++;
          return accept();
        }
        st.pop_back();  // done: the byte belongs to the frame below
        continue;
      }
      case jcValue: {
        const Node& n = nodes_[static_cast<size_t>(f.node)];
        const Frame was = f;
        switch (n.kind) {
          case kJcAnyOf:
            for (int32_t alt : n.alts) {
              Stack s2 = st;
              s2.back() = Frame{alt, jcValue, 0, was.ws, 0, 0, 0};
              feed_stack(std::move(s2), c, out);
            }
            return;
          case kJcLiterals:
            for (int32_t lit : n.alts)
              if (static_cast<uint8_t>(literals_[static_cast<size_t>(lit)][0]) == c) {
                Stack s2 = st;
                s2.back() = Frame{0, jcText, 0, 0, lit, 1, 0};
                out.push_back(std::move(s2));
              }
            return;
          case kJcObject:
            if (c != '{') return;
            f = Frame{was.node, jcObject, jcOpen, 0, 0, 0, 0};
            return accept();
          case kJcArray:
            if (c != '[') return;
            f = Frame{was.node, jcArray, jcArrOpen, 0, 0, 0, 0};
            return accept();
          case kJcString:
            if (c != '"') return;
            f = Frame{was.node, jcString, 0, 0, 0, 0, 0};
            return accept();
          default:  // number, integer
            if (c == '-') f = Frame{was.node, jcNumber, jcMinus, 0, 0, 0, 0};
            else if (c == '0') f = Frame{was.node, jcNumber, jcZero, 0, 0, 0, 0};
            else if (c >= '1' && c <= '9') f = Frame{was.node, jcNumber, jcInt, 0, 1, 0, 0};
            else return;
            return accept();
        }
        return;
      }
      case jcString: {
        const int rem = f.b >> 4, range = f.b & 15;
        if (rem > 0) {  // a UTF-8 continuation byte, in the range its lead byte allows
          static constexpr uint8_t lo[] = {0x80, 0xA0, 0x80, 0x90, 0x80}, hi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
          if (c < lo[range] || c > hi[range]) return;
          f.b = (rem - 1) << 4;
          return accept();
        }
        if (f.a == 1) {  // after a backslash
          if (c == 'u') f.a = 2;
          else if (std::strchr("\"\\/bfnrt", c) && c != 0) f.a = 0;
          else return;
          return accept();
        }
        if (f.a >= 2) {  // \uXXXX; no surrogates (D800-DFFF), which would need a pair
          if (f.a == 6) {
            if (c < '0' || c > '7') return;
            f.a = 4;
          } else {
            if (!jc_hex_digit(c)) return;
            f.a = f.a == 2 ? ((c == 'd' || c == 'D') ? 6 : 3) : f.a == 5 ? 0 : f.a + 1;
          }
          return accept();
        }
        if (c == '"') {
          st.pop_back();
          return accept();
        }
        if (c == '\\') f.a = 1;
        else if (c < 0x20) return;
        else if (c >= 0x80) {
          if (c >= 0xC2 && c <= 0xDF) f.b = 1 << 4;
          else if (c == 0xE0) f.b = (2 << 4) | 1;
          else if (c == 0xED) f.b = (2 << 4) | 2;
          else if (c >= 0xE1 && c <= 0xEF) f.b = 2 << 4;
          else if (c == 0xF0) f.b = (3 << 4) | 3;
          else if (c >= 0xF1 && c <= 0xF3) f.b = 3 << 4;
          else if (c == 0xF4) f.b = (3 << 4) | 4;
          else return;
        }
        return accept();
      }
      case jcNumber: {
        const bool integer = nodes_[static_cast<size_t>(f.node)].kind == kJcInteger;
        const bool digit = c >= '0' && c <= '9';
        const auto run = [&](uint8_t phase, int limit) {
          if (f.phase == phase) {
            if (f.a >= limit) return false;
            f.a++;
          } else {
            f.phase = phase;
            f.a = 1;
          }
          return true;
        };
        bool ok = false, pass = false;
        switch (f.phase) {
          case jcMinus:
            if (c == '0') f.phase = jcZero, ok = true;
            else if (digit) ok = run(jcInt, kMaxDigits);
            break;
          case jcZero:
          case jcInt:
          case jcFrac:
            if (digit && f.phase != jcZero) ok = run(f.phase, kMaxDigits);
            else if (!integer && c == '.' && f.phase != jcFrac) f.phase = jcDot, ok = true;
            else if (!integer && (c == 'e' || c == 'E')) f.phase = jcE, ok = true;
            else pass = !digit;
            break;
          case jcDot:
            if (digit) ok = run(jcFrac, kMaxDigits);
            break;
          case jcE:
            if (c == '+' || c == '-') f.phase = jcESign, ok = true;
            else if (digit) ok = run(jcExp, kJcMaxExponentDigits);
            break;
          case jcESign:
            if (digit) ok = run(jcExp, kJcMaxExponentDigits);
            break;
          default:  // jcExp
            if (digit) ok = run(jcExp, kJcMaxExponentDigits);
            else pass = true;
        }
        if (ok) return accept();
        if (!pass || !jc_number_accepting(f.phase)) return;
        st.pop_back();
        continue;
      }
      case jcArray: {
        const int32_t items = nodes_[static_cast<size_t>(f.node)].items;
        if (c == ']' && f.phase == jcArrOpen) {
          st.pop_back();
          return accept();
        }
        if (f.phase == jcArrOpen) {
          f.phase = jcArrAfterValue;
          st.push_back(Frame{items, jcValue, 0, 0, 0, 0, 0});
          continue;  // the byte starts the first item
        }
        if (c == ']') {
          st.pop_back();
          return accept();
        }
        if (c != ',') return;
        st.push_back(Frame{items, jcValue, 0, 0, 0, 0, 0});
        return accept();
      }
      default: {  // jcObject
        const Node& n = nodes_[static_cast<size_t>(f.node)];
        const uint64_t all = n.props.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.props.size()) - 1;
        switch (f.phase) {
          case jcOpen:
          case jcKeyStart:
            if (c == '}' && f.phase == jcOpen) {
              if ((n.required & ~f.used) != 0) return;
              st.pop_back();
              return accept();
            }
            if (c != '"') return;
            for (size_t i = 0; i < n.props.size(); ++i)
              if (!((f.used >> i) & 1)) {
                Stack s2 = st;
                s2.back().phase = jcKeyLit;
                s2.back().a = static_cast<int32_t>(i);
                s2.back().b = 0;
                out.push_back(std::move(s2));
              }
            if (n.additional >= 0) {
              f.phase = jcAfterKey;
              f.a = -1;
              st.push_back(Frame{0, jcString, 0, 0, 0, 0, 0});
              return accept();
            }
            return;
          case jcKeyLit: {
            const std::string& name = n.props[static_cast<size_t>(f.a)].first;
            if (static_cast<size_t>(f.b) < name.size()) {
              if (static_cast<uint8_t>(name[static_cast<size_t>(f.b)]) != c) return;
              f.b++;
              return accept();
            }
            if (c != '"') return;
            f.used |= uint64_t{1} << f.a;
            f.phase = jcAfterKey;
            return accept();
          }
          case jcAfterKey: {
            if (c != ':') return;
            const int32_t value = f.a >= 0 ? n.props[static_cast<size_t>(f.a)].second : n.additional;
            f.phase = jcAfterValue;
            st.push_back(Frame{value, jcValue, 0, 0, 0, 0, 0});
            return accept();
          }
          default:  // jcAfterValue
            if (c == '}') {
              if ((n.required & ~f.used) != 0) return;
              st.pop_back();
              return accept();
            }
            if (c != ',' || (n.additional < 0 && (f.used & all) == all)) return;
            f.phase = jcKeyStart;
            return accept();
        }
      }
    }
  }
}

bool JsonConstraint::stack_complete(const Stack& st, const JsonConstraint& g) {
  for (const Frame& f : st) {
    if (f.kind == jcText && static_cast<size_t>(f.b) == g.literals_[static_cast<size_t>(f.a)].size()) continue;
    if (f.kind == jcNumber && jc_number_accepting(f.phase)) continue;
    return false;
  }
  return true;
}

bool JsonConstraint::step(const State& from, uint8_t c, State& to) const {
  to.stacks.clear();
  for (const Stack& st : from.stacks) feed_stack(st, c, to.stacks);
  if (to.stacks.size() > 1) {
    std::sort(to.stacks.begin(), to.stacks.end());
    to.stacks.erase(std::unique(to.stacks.begin(), to.stacks.end()), to.stacks.end());
  }
  return !to.stacks.empty();
}

bool JsonConstraint::feed(State& s, const std::string& bytes) const {
  State next;
  for (char ch : bytes) {
    const bool alive = step(s, static_cast<uint8_t>(ch), next);
    std::swap(s, next);
    if (!alive) return false;
  }
  return true;
}

bool JsonConstraint::complete(const State& s) const {
  return std::any_of(s.stacks.begin(), s.stacks.end(), [&](const Stack& st) { return stack_complete(st, *this); });
}

bool JsonConstraint::finished(const State& s) const {
  if (s.stacks.empty()) return false;
  for (const Stack& st : s.stacks)
    for (const Frame& f : st)
      if (f.kind != jcText || static_cast<size_t>(f.b) != literals_[static_cast<size_t>(f.a)].size()) return false;
  return true;
}

bool JsonConstraint::advance(State& s, int64_t token) const {
  if (token < 0 || token >= vocab_->size() || !vocab_->bytes(token)) return false;
  return feed(s, *vocab_->bytes(token));
}

std::shared_ptr<const std::vector<uint8_t>> JsonConstraint::allowed(const State& s) const {
  std::string key;
  for (const Stack& st : s.stacks) {
    const auto n = static_cast<uint32_t>(st.size());
    key.append(reinterpret_cast<const char*>(&n), sizeof n);
    for (const Frame& f : st) {
      const int32_t fields[] = {f.node, f.kind, f.phase, f.ws, f.a, f.b};
      key.append(reinterpret_cast<const char*>(fields), sizeof fields);
      key.append(reinterpret_cast<const char*>(&f.used), sizeof f.used);
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
  }
  auto mask = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(vocab_->size()), 0);
  const std::vector<int64_t>& order = vocab_->order();
  const std::vector<uint32_t>& common = vocab_->common();
  std::vector<State> at{s};  // at[k]: the state after the first k bytes of the token walked last
  size_t dead = SIZE_MAX;    // the token walked last died after this many bytes
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t shared = common[i];
    if (dead != SIZE_MAX && shared >= dead) continue;  // below a rejected prefix
    dead = SIZE_MAX;
    if (at.size() > shared + 1) at.resize(shared + 1);
    const std::string& bytes = *vocab_->bytes(order[i]);
    bool ok = true;
    for (size_t k = at.size() - 1; k < bytes.size(); ++k) {
      State next;
      if (!step(at[k], static_cast<uint8_t>(bytes[k]), next)) {
        dead = k + 1;
        ok = false;
        break;
      }
      at.push_back(std::move(next));
    }
    if (ok) (*mask)[static_cast<size_t>(order[i])] = 1;
  }
  std::lock_guard<std::mutex> lk(mu_);
  // At most ~8 MB of masks (and 4096 states); then the cache starts over.
  const size_t limit = std::clamp<size_t>((size_t{8} << 20) / std::max<size_t>(mask->size(), 1), 16, 4096);
  if (cache_.size() >= limit) cache_.clear();
  cache_[key] = mask;
  return mask;
}

}  // namespace tpu::serve
