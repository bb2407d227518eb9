// Built-ins of the chat-template interpreter: Jinja2's filters and tests, the Python str/dict/list
// methods that templates call, and Transformers' globals (raise_exception, strftime_now and the
// tojson filter as Transformers redefines it). Anything else is an error naming it.
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/locid.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "tpucore/core/error.h"
#include "tpucore/io/chat_template/interp.h"
#include "tpucore/io/chat_template/strings.h"

namespace tpu::jinja {

Value make_function(std::string name, std::function<Value(Interp&, List&, Kwargs&, Pos)> fn) {
  auto f = std::make_shared<Function>();
  f->name = std::move(name);
  f->call = std::move(fn);
  Value v;
  v.kind = Value::Kind::Function;
  v.fn = std::move(f);
  return v;
}

Value arg(List& args, Kwargs& kw, size_t k, const char* name, Value def) {
  for (auto it = kw.begin(); it != kw.end(); ++it)
    if (it->first == name) {
      Value v = std::move(it->second);
      kw.erase(it);
      return v;
    }
  return k < args.size() ? args[k] : def;
}

void no_more_args(const List& args, const Kwargs& kw, size_t n_pos, const std::string& callee, Pos p) {
  if (args.size() > n_pos) fail_at(p, callee + " takes at most " + std::to_string(n_pos) + " positional argument(s)");
  if (!kw.empty()) fail_at(p, callee + ": unsupported keyword argument '" + kw.front().first + "'");
}

List iterate(const Value& v, Pos p) {  // callers charge the steps of the work on the items
  switch (v.kind) {
    case Value::Kind::List: case Value::Kind::Tuple: return *v.list;
    case Value::Kind::Dict: {
      List keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Value::Kind::String: {
      List chars;
      for (auto& c : utf8_chars(v.s)) chars.push_back(Value::string(std::move(c)));
      return chars;
    }
    case Value::Kind::Undefined: return {};
    default: fail_at(p, std::string("'") + type_name(v) + "' object is not iterable");
  }
}

namespace {

int64_t want_int(const Value& v, const char* what, Pos p) {
  if (v.kind != Value::Kind::Int && v.kind != Value::Kind::Bool) fail_at(p, std::string(what) + " must be an integer, not " + type_name(v));
  return v.kind == Value::Kind::Bool ? v.b : v.i;
}

const std::string& want_str(const Value& v, const char* what, Pos p) {
  if (!v.is_string()) fail_at(p, std::string(what) + " must be a string, not " + type_name(v));
  return v.s;
}

Value bound(const std::string& name, std::function<Value(Interp&, List&, Kwargs&, Pos)> fn) {
  return make_function(name, std::move(fn));
}

Value str_method(const Value& self, const std::string& m, Pos p) {
  static const char* known[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper",
                                "lower", "title", "capitalize", "replace", "find", "rfind", "count", "join",
                                "splitlines", "isdigit", "isalpha", "isspace", "isupper", "islower", "isalnum", "index"};
  if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return m == k; }) == std::end(known)) {
    if (m == "format") fail_at(p, "unsupported construct: str.format");
    return Value::undefined("str." + m);
  }
  const std::string s = self.s;
  return bound("str." + m, [s, m](Interp& in, List& args, Kwargs& kw, Pos p) -> Value {
    const std::string name = "str." + m;
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
      Value chars = arg(args, kw, 0, "chars", Value::none());
      no_more_args(args, kw, 1, name, p);
      const bool l = m != "rstrip", r = m != "lstrip";
      return Value::string(chars.is_none() ? py_strip(s, l, r) : py_strip_chars(s, want_str(chars, "chars", p), l, r));
    }
    if (m == "split" || m == "rsplit") {
      Value sep = arg(args, kw, 0, "sep", Value::none());
      const int64_t maxsplit = want_int(arg(args, kw, 1, "maxsplit", Value::integer(-1)), "maxsplit", p);
      no_more_args(args, kw, 2, name, p);
      if (sep.is_string() && sep.s.empty()) fail_at(p, "str.split: empty separator");
      List out;
      for (auto& x : py_split(s, sep.is_none() ? nullptr : &want_str(sep, "sep", p), maxsplit, m == "rsplit")) out.push_back(Value::string(std::move(x)));
      return Value::make_list(std::move(out));
    }
    if (m == "startswith" || m == "endswith") {
      Value x = arg(args, kw, 0, "prefix");
      no_more_args(args, kw, 1, name, p);
      List opts = x.kind == Value::Kind::Tuple ? *x.list : List{x};
      for (const Value& o : opts) {
        const std::string& t = want_str(o, m == "startswith" ? "prefix" : "suffix", p);
        if (t.size() <= s.size() && (m == "startswith" ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0)) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (m == "upper" || m == "lower" || m == "title" || m == "capitalize") {
      no_more_args(args, kw, 0, name, p);
      return Value::string(py_case(s, m));
    }
    if (m == "replace") {
      const std::string a = want_str(arg(args, kw, 0, "old"), "old", p);
      const std::string b = want_str(arg(args, kw, 1, "new"), "new", p);
      const int64_t count = want_int(arg(args, kw, 2, "count", Value::integer(-1)), "count", p);
      no_more_args(args, kw, 3, name, p);
      std::string out = py_replace(s, a, b, count);
      in.check_size(out.size(), p);
      return Value::string(std::move(out));
    }
    if (m == "find" || m == "rfind" || m == "index" || m == "count") {
      const std::string t = want_str(arg(args, kw, 0, "sub"), "sub", p);
      no_more_args(args, kw, 1, name, p);
      if (m == "count") return Value::integer(py_count(s, t));
      const size_t at = m == "rfind" ? s.rfind(t) : s.find(t);
      if (at == std::string::npos) {
        if (m == "index") fail_at(p, "str.index: substring not found");
        return Value::integer(-1);
      }
      return Value::integer(utf8_length(s.substr(0, at)));
    }
    if (m == "join") {
      Value items = arg(args, kw, 0, "iterable");
      no_more_args(args, kw, 1, name, p);
      std::string out;
      bool first = true;
      for (const Value& v : iterate(items, p)) {
        if (!first) out += s;
        out += want_str(v, "str.join item", p);
        first = false;
        in.check_size(out.size(), p);
      }
      return Value::string(std::move(out));
    }
    if (m == "splitlines") {
      no_more_args(args, kw, 0, name, p);
      List out;
      for (auto& x : py_splitlines(s)) out.push_back(Value::string(std::move(x)));
      return Value::make_list(std::move(out));
    }
    no_more_args(args, kw, 0, name, p);
    return Value::boolean(py_is(s, m));
  });
}

}  // namespace

Value get_attr(Interp& in, const Value& obj, const std::string& name, Pos p) {
  switch (obj.kind) {
    case Value::Kind::Undefined:
      fail_at(p, (obj.s.empty() ? std::string("an undefined value") : "'" + obj.s + "' is undefined and") + " has no attribute '" + name + "'");
    case Value::Kind::Namespace: {
      const Value* v = obj.dict->find(name);
      return v ? *v : Value::undefined(name);
    }
    case Value::Kind::Dict: {
      if (name == "items" || name == "keys" || name == "values" || name == "get") {
        const Value self = obj;
        return bound("dict." + name, [self, name](Interp&, List& args, Kwargs& kw, Pos p) -> Value {
          if (name == "get") {
            Value k = arg(args, kw, 0, "key"), def = arg(args, kw, 1, "default", Value::none());
            no_more_args(args, kw, 2, "dict.get", p);
            const Value* v = k.is_string() ? self.dict->find(k.s) : nullptr;
            return v ? *v : def;
          }
          no_more_args(args, kw, 0, "dict." + name, p);
          List out;
          for (const auto& [k, v] : self.dict->items)
            out.push_back(name == "keys" ? Value::string(k) : name == "values" ? v : Value::make_list({Value::string(k), v}, true));
          return Value::make_list(std::move(out));
        });
      }
      if (name == "pop" || name == "update" || name == "setdefault" || name == "clear" || name == "popitem")
        fail_at(p, "dict." + name + " modifies a dict, which the sandbox forbids");
      const Value* v = obj.dict->find(name);
      return v ? *v : Value::undefined(name);
    }
    case Value::Kind::String: return str_method(obj, name, p);
    case Value::Kind::List: case Value::Kind::Tuple:
      if (name == "append" || name == "extend" || name == "pop" || name == "insert" || name == "remove" ||
          name == "sort" || name == "reverse" || name == "clear")
        fail_at(p, "list." + name + " modifies a list, which the sandbox forbids");
      if (name == "index" || name == "count") {
        const Value self = obj;
        return bound("list." + name, [self, name](Interp&, List& args, Kwargs& kw, Pos p) -> Value {
          Value x = arg(args, kw, 0, "value");
          no_more_args(args, kw, 1, "list." + name, p);
          int64_t count = 0;
          for (size_t k = 0; k < self.list->size(); ++k)
            if (equal((*self.list)[k], x)) {
              if (name == "index") return Value::integer(int64_t(k));
              ++count;
            }
          if (name == "index") fail_at(p, "list.index: value not in list");
          return Value::integer(count);
        });
      }
      return Value::undefined(name);
    default:
      return Value::undefined(name);
  }
}

Value get_item(Interp& in, const Value& obj, const Value& key, Pos p) {
  switch (obj.kind) {
    case Value::Kind::Undefined:
      fail_at(p, (obj.s.empty() ? std::string("an undefined value") : "'" + obj.s + "' is undefined and") + " cannot be subscripted");
    case Value::Kind::Dict:
      if (key.is_string()) {
        if (const Value* v = obj.dict->find(key.s)) return *v;
        return get_attr(in, obj, key.s, p);
      }
      return Value::undefined();
    case Value::Kind::List: case Value::Kind::Tuple: case Value::Kind::String:
      if (key.kind == Value::Kind::Int || key.kind == Value::Kind::Bool) {
        const int64_t k0 = key.kind == Value::Kind::Bool ? key.b : key.i;
        if (obj.is_string()) {
          auto chars = utf8_chars(obj.s);
          const int64_t k = k0 < 0 ? k0 + int64_t(chars.size()) : k0;
          return k >= 0 && k < int64_t(chars.size()) ? Value::string(chars[size_t(k)]) : Value::undefined();
        }
        const int64_t k = k0 < 0 ? k0 + int64_t(obj.list->size()) : k0;
        return k >= 0 && k < int64_t(obj.list->size()) ? (*obj.list)[size_t(k)] : Value::undefined();
      }
      if (key.is_string()) return get_attr(in, obj, key.s, p);
      return Value::undefined();
    default:
      return key.is_string() ? get_attr(in, obj, key.s, p) : Value::undefined();
  }
}

void add_globals(Frame& f) {
  f.set("range", make_function("range", [](Interp& in, List& args, Kwargs& kw, Pos p) {
    no_more_args(args, kw, 3, "range", p);
    if (args.empty()) fail_at(p, "range expected at least 1 argument");
    int64_t a = 0, b = 0, s = 1;
    if (args.size() == 1) b = want_int(args[0], "range argument", p);
    else {
      a = want_int(args[0], "range argument", p);
      b = want_int(args[1], "range argument", p);
      if (args.size() == 3) s = want_int(args[2], "range step", p);
    }
    if (s == 0) fail_at(p, "range() arg 3 must not be zero");
    const __int128 n = s > 0 ? (b > a ? (__int128(b) - a + s - 1) / s : 0) : (a > b ? (__int128(a) - b - s - 1) / -s : 0);
    if (n > 100000) fail_at(p, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    in.charge(size_t(n), p);
    List out;
    for (int64_t k = 0; k < int64_t(n); ++k) out.push_back(Value::integer(a + k * s));
    return Value::make_list(std::move(out));
  }));
  auto kw_dict = [](List& args, Kwargs& kw, const char* name, Pos p, bool ns) {
    auto d = std::make_shared<Dict>();
    if (args.size() > 1) fail_at(p, std::string(name) + " takes at most one positional argument");
    if (!args.empty()) {
      if (args[0].kind != Value::Kind::Dict) fail_at(p, std::string(name) + ": the positional argument must be a dict");
      d->items = args[0].dict->items;
    }
    for (auto& [k, v] : kw) d->set(k, v);
    return Value::make_dict(std::move(d), ns);
  };
  f.set("namespace", make_function("namespace", [kw_dict](Interp&, List& args, Kwargs& kw, Pos p) { return kw_dict(args, kw, "namespace", p, true); }));
  f.set("dict", make_function("dict", [kw_dict](Interp&, List& args, Kwargs& kw, Pos p) { return kw_dict(args, kw, "dict", p, false); }));
  f.set("raise_exception", make_function("raise_exception", [](Interp&, List& args, Kwargs& kw, Pos p) -> Value {
    Value m = arg(args, kw, 0, "message");
    tpu::fail("chat template raised an exception: {}", to_str(m));
  }));
  f.set("strftime_now", make_function("strftime_now", [](Interp&, List& args, Kwargs& kw, Pos p) {
    const std::string fmt = want_str(arg(args, kw, 0, "format"), "strftime_now format", p);
    no_more_args(args, kw, 1, "strftime_now", p);
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    if (n == 0 && !fmt.empty()) fail_at(p, "strftime_now: the format gives an empty or too long string");
    return Value::string(std::string(buf, n));
  }));
}

}  // namespace tpu::jinja
