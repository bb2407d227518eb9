// Jinja2's filters and tests as chat templates use them (Transformers' tojson in place of Jinja's
// HTML-escaping one). An unknown filter or test is an error naming it.
#include <algorithm>
#include <cmath>

#include "tpucore/io/chat_template/interp.h"
#include "tpucore/io/chat_template/strings.h"

namespace tpu::jinja {
namespace {

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Jinja's title filter: words start after '-', whitespace or an opening bracket.
std::string jinja_title(const std::string& s) {
  const auto chars = utf8_chars(s);
  std::string out;
  bool start = true;
  for (const auto& ch : chars) {
    const bool sep = ch == "-" || ch == "(" || ch == "{" || ch == "[" || ch == "<" || py_strip(ch, true, true).empty();
    if (sep) {
      out += ch;
      start = true;
    } else {
      out += py_case(ch, start ? "upper" : "lower");
      start = false;
    }
  }
  return out;
}

// The value of attribute path `attr` ("a.b", digits index lists) of an item, as Jinja's
// make_attrgetter reads it.
Value attr_of(Interp& in, const Value& item, const std::string& attr, Pos p) {
  Value v = item;
  size_t pos = 0;
  while (true) {
    const size_t dot = attr.find('.', pos);
    const std::string part = attr.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = get_item(in, v, digits ? Value::integer(std::stoll(part)) : Value::string(part), p);
    if (dot == std::string::npos) return v;
    pos = dot + 1;
  }
}

Value select(Interp& in, const std::string& filter, Value v, List& args, Kwargs& kw, Pos p) {
  const bool by_attr = filter == "selectattr" || filter == "rejectattr";
  const bool keep = filter == "select" || filter == "selectattr";
  std::string attr;
  size_t k = 0;
  if (by_attr) {
    if (args.empty() || !args[0].is_string()) fail_at(p, filter + " needs an attribute name");
    attr = args[0].s;
    k = 1;
  }
  if (!kw.empty()) fail_at(p, filter + ": unsupported keyword argument '" + kw.front().first + "'");
  std::string test;
  if (k < args.size()) {
    if (!args[k].is_string()) fail_at(p, filter + ": the test name must be a string");
    test = args[k].s;
  }
  List test_args(args.begin() + long(std::min(args.size(), k + 1)), args.end());
  List out;
  for (const Value& item : iterate(v, p)) {
    in.step(p);
    const Value x = by_attr ? attr_of(in, item, attr, p) : item;
    List ta = test_args;
    const bool ok = test.empty() ? truthy(x) : apply_test(in, test, x, ta, p);
    if (ok == keep) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

}  // namespace

Value apply_filter(Interp& in, const std::string& name, Value v, List& args, Kwargs& kw, Pos p) {
  in.step(p);
  if (name == "length" || name == "count") {
    no_more_args(args, kw, 0, name, p);
    switch (v.kind) {
      case Value::Kind::String: return Value::integer(utf8_length(v.s));
      case Value::Kind::List: case Value::Kind::Tuple: return Value::integer(int64_t(v.list->size()));
      case Value::Kind::Dict: case Value::Kind::Namespace: return Value::integer(int64_t(v.dict->items.size()));
      case Value::Kind::Undefined: return Value::integer(0);
      default: fail_at(p, std::string("object of type '") + type_name(v) + "' has no len()");
    }
  }
  if (name == "tojson") {
    Value ascii = arg(args, kw, 0, "ensure_ascii", Value::boolean(false));
    Value indent = arg(args, kw, 1, "indent", Value::none());
    Value seps = arg(args, kw, 2, "separators", Value::none());
    Value sort = arg(args, kw, 3, "sort_keys", Value::boolean(false));
    no_more_args(args, kw, 4, "tojson", p);
    if (truthy(ascii)) fail_at(p, "unsupported construct: tojson(ensure_ascii=True)");
    int ind = -1;
    if (!indent.is_none()) {
      if (indent.kind != Value::Kind::Int) fail_at(p, "tojson: only an integer indent is supported");
      ind = int(std::clamp<int64_t>(indent.i, 0, 64));
    }
    std::string isep, ksep;
    if (!seps.is_none()) {
      if (!seps.is_sequence() || seps.list->size() != 2 || !(*seps.list)[0].is_string() || !(*seps.list)[1].is_string())
        fail_at(p, "tojson: separators must be a pair of strings");
      isep = (*seps.list)[0].s;
      ksep = (*seps.list)[1].s;
      if (isep.empty() || ksep.empty()) fail_at(p, "unsupported construct: tojson with an empty separator");
    }
    std::string out = to_json(v, ind, isep, ksep, truthy(sort), p);
    in.check_size(out.size(), p);
    return Value::string(std::move(out));
  }
  if (name == "trim") {
    Value chars = arg(args, kw, 0, "chars", Value::none());
    no_more_args(args, kw, 1, name, p);
    const std::string s = to_str(v);
    return Value::string(chars.is_none() ? py_strip(s, true, true) : py_strip_chars(s, to_str(chars), true, true));
  }
  if (name == "string") { no_more_args(args, kw, 0, name, p); return Value::string(to_str(v)); }
  if (name == "safe") { no_more_args(args, kw, 0, name, p); return v; }
  if (name == "e" || name == "escape") { no_more_args(args, kw, 0, name, p); return Value::string(html_escape(to_str(v))); }
  if (name == "upper" || name == "lower" || name == "capitalize") {
    no_more_args(args, kw, 0, name, p);
    return Value::string(py_case(to_str(v), name));
  }
  if (name == "title") { no_more_args(args, kw, 0, name, p); return Value::string(jinja_title(to_str(v))); }
  if (name == "default" || name == "d") {
    Value def = arg(args, kw, 0, "default_value", Value::string(""));
    Value boolean = arg(args, kw, 1, "boolean", Value::boolean(false));
    no_more_args(args, kw, 2, name, p);
    return (v.is_undefined() || (truthy(boolean) && !truthy(v))) ? def : v;
  }
  if (name == "first" || name == "last") {
    no_more_args(args, kw, 0, name, p);
    List items = iterate(v, p);
    if (items.empty()) return Value::undefined(name == "first" ? "first item" : "last item");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") { no_more_args(args, kw, 0, name, p); return Value::make_list(iterate(v, p)); }
  if (name == "reverse") {
    no_more_args(args, kw, 0, name, p);
    if (v.is_string()) {
      auto chars = utf8_chars(v.s);
      std::reverse(chars.begin(), chars.end());
      std::string s;
      for (auto& c : chars) s += c;
      return Value::string(std::move(s));
    }
    List items = iterate(v, p);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "sort") {
    const bool rev = truthy(arg(args, kw, 0, "reverse", Value::boolean(false)));
    const bool cs = truthy(arg(args, kw, 1, "case_sensitive", Value::boolean(false)));
    Value attr = arg(args, kw, 2, "attribute", Value::none());
    no_more_args(args, kw, 3, name, p);
    List items = iterate(v, p);
    std::vector<std::pair<Value, size_t>> keys;
    for (size_t k = 0; k < items.size(); ++k) {
      Value key = attr.is_none() ? items[k] : attr_of(in, items[k], to_str(attr), p);
      if (!cs && key.is_string()) key = Value::string(py_case(key.s, "lower"));
      keys.emplace_back(std::move(key), k);
    }
    std::stable_sort(keys.begin(), keys.end(), [&](const auto& a, const auto& b) {
      return rev ? less(b.first, a.first, p) : less(a.first, b.first, p);
    });
    List out;
    for (const auto& kv : keys) out.push_back(items[kv.second]);
    return Value::make_list(std::move(out));
  }
  if (name == "join") {
    const std::string sep = to_str(arg(args, kw, 0, "d", Value::string("")));
    Value attr = arg(args, kw, 1, "attribute", Value::none());
    no_more_args(args, kw, 2, name, p);
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v, p)) {
      if (!first) out += sep;
      out += to_str(attr.is_none() ? x : attr_of(in, x, to_str(attr), p));
      first = false;
      in.check_size(out.size(), p);
    }
    return Value::string(std::move(out));
  }
  if (name == "map") {
    Value attr = arg(args, kw, 999, "attribute", Value::none());
    Value def = arg(args, kw, 999, "default", Value::undefined());
    List out;
    if (!attr.is_none()) {
      no_more_args(args, kw, 0, name, p);
      for (const Value& x : iterate(v, p)) {
        Value y = attr_of(in, x, to_str(attr), p);
        out.push_back(y.is_undefined() && !def.is_undefined() ? def : y);
      }
    } else {
      if (args.empty() || !args[0].is_string()) fail_at(p, "map needs a filter name or attribute=");
      const std::string f = args[0].s;
      for (const Value& x : iterate(v, p)) {
        List rest(args.begin() + 1, args.end());
        Kwargs k2 = kw;
        out.push_back(apply_filter(in, f, x, rest, k2, p));
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") return select(in, name, v, args, kw, p);
  if (name == "items") {
    no_more_args(args, kw, 0, name, p);
    if (v.is_undefined()) return Value::make_list({});
    if (v.kind != Value::Kind::Dict) fail_at(p, std::string("items: can only get item pairs from a mapping, not ") + type_name(v));
    List out;
    for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_list({Value::string(k), x}, true));
    return Value::make_list(std::move(out));
  }
  if (name == "int" || name == "float") {
    Value def = arg(args, kw, 0, "default", name == "int" ? Value::integer(0) : Value::real(0));
    no_more_args(args, kw, 1, name, p);
    double d = 0;
    if (v.is_number()) d = v.as_double();
    else if (v.is_string()) {
      const std::string s = py_strip(v.s, true, true);
      char* end = nullptr;
      d = std::strtod(s.c_str(), &end);
      if (s.empty() || end != s.c_str() + s.size() || s.find_first_of("xXpP") != std::string::npos) return def;
    } else {
      return def;
    }
    if (name == "float") return Value::real(d);
    if (v.kind == Value::Kind::Int) return v;
    if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return def;
    return Value::integer(int64_t(d));
  }
  if (name == "abs") {
    no_more_args(args, kw, 0, name, p);
    if (v.kind == Value::Kind::Float) return Value::real(std::fabs(v.f));
    if (v.kind == Value::Kind::Int && v.i != INT64_MIN) return Value::integer(v.i < 0 ? -v.i : v.i);
    if (v.kind == Value::Kind::Bool) return Value::integer(v.b);
    fail_at(p, std::string("bad operand type for abs(): '") + type_name(v) + "'");
  }
  if (name == "replace") {
    const std::string a = to_str(arg(args, kw, 0, "old")), b = to_str(arg(args, kw, 1, "new"));
    Value count = arg(args, kw, 2, "count", Value::none());
    no_more_args(args, kw, 3, name, p);
    std::string out = py_replace(to_str(v), a, b, count.is_none() ? -1 : (count.kind == Value::Kind::Int ? count.i : -1));
    in.check_size(out.size(), p);
    return Value::string(std::move(out));
  }
  if (name == "indent") {
    Value width = arg(args, kw, 0, "width", Value::integer(4));
    const bool first = truthy(arg(args, kw, 1, "first", Value::boolean(false)));
    const bool blank = truthy(arg(args, kw, 2, "blank", Value::boolean(false)));
    no_more_args(args, kw, 3, name, p);
    std::string ind = width.is_string() ? width.s : std::string(size_t(std::clamp<int64_t>(width.kind == Value::Kind::Int ? width.i : 4, 0, 256)), ' ');
    const auto lines = py_splitlines(to_str(v) + "\n");
    std::string rv;
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) rv += "\n" + ((blank || !lines[k].empty()) ? ind : "");
      rv += lines[k];
      in.check_size(rv.size(), p);
    }
    return Value::string(first ? ind + rv : rv);
  }
  fail_at(p, "unsupported filter '" + name + "'");
}

bool apply_test(Interp& in, const std::string& name, const Value& v, List& args, Pos p) {
  using K = Value::Kind;
  auto want = [&](size_t n) {
    if (args.size() != n) fail_at(p, "test '" + name + "' takes " + std::to_string(n) + " argument(s)");
  };
  if (name == "defined") { want(0); return !v.is_undefined(); }
  if (name == "undefined") { want(0); return v.is_undefined(); }
  if (name == "none") { want(0); return v.is_none(); }
  if (name == "boolean") { want(0); return v.kind == K::Bool; }
  if (name == "true") { want(0); return v.kind == K::Bool && v.b; }
  if (name == "false") { want(0); return v.kind == K::Bool && !v.b; }
  if (name == "integer") { want(0); return v.kind == K::Int; }
  if (name == "float") { want(0); return v.kind == K::Float; }
  if (name == "number") { want(0); return v.is_number(); }
  if (name == "string") { want(0); return v.is_string(); }
  if (name == "mapping") { want(0); return v.kind == K::Dict; }
  if (name == "iterable") { want(0); return v.is_string() || v.is_sequence() || v.kind == K::Dict || v.is_undefined(); }
  if (name == "sequence") { want(0); return v.is_string() || v.is_sequence() || v.kind == K::Dict || v.is_undefined(); }
  if (name == "callable") { want(0); return v.kind == K::Function; }
  if (name == "odd" || name == "even") {
    want(0);
    if (v.kind != K::Int && v.kind != K::Bool) fail_at(p, "test '" + name + "' needs an integer");
    const int64_t i = v.kind == K::Bool ? v.b : v.i;
    return (i % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    want(1);
    if ((v.kind != K::Int) || args[0].kind != K::Int || args[0].i == 0) fail_at(p, "test 'divisibleby' needs non-zero integers");
    return v.i % args[0].i == 0;
  }
  if (name == "lower" || name == "upper") { want(0); return py_is(to_str(v), name == "lower" ? "islower" : "isupper"); }
  if (name == "sameas") {
    want(1);
    const Value& o = args[0];
    if (v.kind != o.kind) return false;
    if (v.kind == K::None || v.kind == K::Undefined) return true;
    if (v.kind == K::Bool) return v.b == o.b;
    if (v.is_sequence()) return v.list == o.list;
    if (v.kind == K::Dict || v.kind == K::Namespace) return v.dict == o.dict;
    fail_at(p, "unsupported construct: 'sameas' on a " + std::string(type_name(v)) + " (identity of Python values)");
  }
  static const std::pair<const char*, const char*> cmp[] = {
      {"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="}, {"lt", "<"}, {"lessthan", "<"},
      {"<", "<"}, {"le", "<="}, {"<=", "<="}, {"gt", ">"}, {"greaterthan", ">"}, {">", ">"}, {"ge", ">="}, {">=", ">="}};
  for (const auto& [n, op] : cmp)
    if (name == n) {
      want(1);
      const std::string o = op;
      if (o == "==") return equal(v, args[0]);
      if (o == "!=") return !equal(v, args[0]);
      if (o == "<") return less(v, args[0], p);
      if (o == ">") return less(args[0], v, p);
      if (o == "<=") return !less(args[0], v, p);
      return !less(v, args[0], p);
    }
  if (name == "in") {
    want(1);
    const Value& c = args[0];
    if (c.is_string()) return v.is_string() && c.s.find(v.s) != std::string::npos;
    for (const Value& x : iterate(c, p))
      if (equal(x, v)) return true;
    return false;
  }
  (void)in;
  fail_at(p, "unsupported test '" + name + "'");
}

}  // namespace tpu::jinja
