// The values of the chat-template interpreter (tpucore/chat_template.h): Python's objects as Jinja2
// sees them in Transformers' sandboxed environment (None, bool, int, float, str, list, tuple, dict,
// namespace, callables and Jinja's Undefined). Lists and dicts are shared by reference like
// Python's; the sandbox makes them immutable, so only a namespace's attributes change in place.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tpu::jinja {

/// A position in the template source (1-based), for error messages.
struct Pos {
  int line = 1;
  int col = 1;
};

[[noreturn]] void fail_at(Pos p, const std::string& what);

struct Value;
struct Dict;
struct Function;
struct Interp;
using List = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

struct Value {
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Tuple, Dict, Namespace, Function };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                    // String; for Undefined, the name that was looked up
  std::shared_ptr<const List> list;  // List, Tuple
  std::shared_ptr<Dict> dict;        // Dict (read only), Namespace (attributes set in place)
  std::shared_ptr<const Function> fn;

  static Value undefined(std::string name = {}) { Value v; v.s = std::move(name); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value real(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::String; v.s = std::move(x); return v; }
  static Value make_list(List items, bool tuple = false);
  static Value make_dict(std::shared_ptr<Dict> d, bool ns = false);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_sequence() const { return kind == Kind::List || kind == Kind::Tuple; }
  bool is_mapping() const { return kind == Kind::Dict; }
  double as_double() const { return kind == Kind::Float ? f : double(kind == Kind::Bool ? int64_t(b) : i); }
};

/// A dict in insertion order (Python's), keyed by string.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

/// A callable: a global function, a macro, or a bound method such as loop.cycle.
struct Function {
  std::string name;
  std::function<Value(Interp&, List&, Kwargs&, Pos)> call;
};

/// Python's truth value (Undefined is false).
bool truthy(const Value& v);
/// The name of the value's type as Python spells it, for error messages.
const char* type_name(const Value& v);
/// str(v) as Jinja prints it with `{{ v }}` (Undefined prints nothing).
std::string to_str(const Value& v);
/// repr(v), as Python prints an item inside a list or dict.
std::string repr(const Value& v);
/// json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) (Transformers' `tojson`).
/// indent < 0 means None; item_sep/key_sep empty mean the defaults.
std::string to_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                    bool sort_keys, Pos p);
/// Python's float repr (shortest round trip, exponent form outside 1e-4 <= |x| < 1e16).
std::string float_repr(double x);
/// Python's == between two values.
bool equal(const Value& a, const Value& b);
/// Python's < for numbers, strings and sequences; other pairs are an error.
bool less(const Value& a, const Value& b, Pos p);

/// A value from JSON (objects keep their key order) and back.
Value from_json(const nlohmann::ordered_json& j);

/// Bytes of a UTF-8 string, split into code points (invalid bytes stay single units).
std::vector<std::string> utf8_chars(const std::string& s);
/// Number of code points in a UTF-8 string (Python's len of the string).
int64_t utf8_length(const std::string& s);

}  // namespace tpu::jinja
