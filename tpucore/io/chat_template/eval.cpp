// The chat-template evaluator: statements and expressions with Jinja2's semantics (scoping of
// for-loop bodies and macros, the loop variable, Python's operators on Python's values).
#include <cmath>

#include "tpucore/io/chat_template/interp.h"

namespace tpu::jinja {

Value* Frame::find(const std::string& name) {
  for (Frame* f = this; f; f = f->parent)
    for (auto& [k, v] : f->vars)
      if (k == name) return &v;
  return nullptr;
}

void Frame::set(const std::string& name, Value v) {
  for (auto& [k, old] : vars)
    if (k == name) {
      old = std::move(v);
      return;
    }
  vars.emplace_back(name, std::move(v));
}

void Interp::step(Pos p) {
  if (steps_left == 0) fail_at(p, "the template ran too long (evaluation step limit reached)");
  --steps_left;
}

void Interp::charge(size_t n, Pos p) {
  if (steps_left < n) fail_at(p, "the template ran too long (evaluation step limit reached)");
  steps_left -= n;
}

void Interp::check_size(size_t n, Pos p) const {
  if (n > max_output) fail_at(p, "the template built a string longer than the limit of " + std::to_string(max_output) + " bytes");
}

namespace {

[[noreturn]] void undefined_error(const Value& v, Pos p) {
  fail_at(p, v.s.empty() ? std::string("use of an undefined value") : "'" + v.s + "' is undefined");
}

int64_t checked(__int128 r, Pos p) {
  if (r > INT64_MAX || r < INT64_MIN) fail_at(p, "integer overflow (the interpreter's integers are 64-bit)");
  return int64_t(r);
}

int64_t as_int(const Value& v) { return v.kind == Value::Kind::Bool ? int64_t(v.b) : v.i; }

Value arith(Interp& in, const std::string& op, const Value& a, const Value& b, Pos p) {
  using K = Value::Kind;
  if (op == "~") {
    std::string s = to_str(a) + to_str(b);
    in.check_size(s.size(), p);
    return Value::string(std::move(s));
  }
  if (a.is_undefined()) undefined_error(a, p);
  if (b.is_undefined()) undefined_error(b, p);
  if (a.is_number() && b.is_number()) {
    const bool fl = a.kind == K::Float || b.kind == K::Float;
    const double x = a.as_double(), y = b.as_double();
    const int64_t i = as_int(a), j = as_int(b);
    if (op == "+") return fl ? Value::real(x + y) : Value::integer(checked(__int128(i) + j, p));
    if (op == "-") return fl ? Value::real(x - y) : Value::integer(checked(__int128(i) - j, p));
    if (op == "*") return fl ? Value::real(x * y) : Value::integer(checked(__int128(i) * j, p));
    if (op == "/") {
      if (y == 0) fail_at(p, "division by zero");
      return Value::real(x / y);
    }
    if (op == "//" || op == "%") {
      if (fl ? y == 0 : j == 0) fail_at(p, op == "%" ? "modulo by zero" : "integer division by zero");
      if (fl) {
        const double m = std::fmod(x, y);
        const double mod = (m != 0 && ((m < 0) != (y < 0))) ? m + y : m;
        return op == "%" ? Value::real(mod) : Value::real(std::floor((x - mod) / y + 0.5));
      }
      if (i == INT64_MIN && j == -1) fail_at(p, "integer overflow (the interpreter's integers are 64-bit)");
      int64_t q = i / j, r = i % j;
      if (r != 0 && ((r < 0) != (j < 0))) { --q; r += j; }
      return Value::integer(op == "%" ? r : q);
    }
    if (op == "**") {
      if (!fl && j >= 0) {
        __int128 r = 1;
        for (int64_t k = 0; k < j; ++k) {
          r *= i;
          checked(r, p);
          if (r == 0 || r == 1) break;
          if (r == -1) { r = (j - k - 1) % 2 ? -r : r; break; }
        }
        return Value::integer(int64_t(r));
      }
      return Value::real(std::pow(x, y));
    }
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    in.check_size(a.s.size() + b.s.size(), p);
    return Value::string(a.s + b.s);
  }
  if (op == "+" && a.is_sequence() && a.kind == b.kind) {
    List l = *a.list;
    l.insert(l.end(), b.list->begin(), b.list->end());
    in.check_size(l.size() * sizeof(Value), p);
    return Value::make_list(std::move(l), a.kind == K::Tuple);
  }
  if (op == "*" && (a.is_string() || a.is_sequence()) && (b.kind == K::Int || b.kind == K::Bool)) {
    const int64_t n = std::max<int64_t>(0, as_int(b));
    const size_t unit = a.is_string() ? a.s.size() : a.list->size() * sizeof(Value);
    if (unit && uint64_t(n) > in.max_output / unit) in.check_size(in.max_output + 1, p);
    if (a.is_string()) {
      std::string s;
      for (int64_t k = 0; k < n; ++k) s += a.s;
      return Value::string(std::move(s));
    }
    List l;
    for (int64_t k = 0; k < n; ++k) l.insert(l.end(), a.list->begin(), a.list->end());
    return Value::make_list(std::move(l), a.kind == K::Tuple);
  }
  if (op == "*" && b.is_string() && (a.kind == K::Int || a.kind == K::Bool)) return arith(in, op, b, a, p);
  if (op == "%" && a.is_string()) fail_at(p, "unsupported construct: printf-style '%' string formatting");
  fail_at(p, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

bool contains(const Value& container, const Value& item, Pos p) {
  switch (container.kind) {
    case Value::Kind::String:
      if (!item.is_string()) fail_at(p, std::string("'in <string>' requires string as left operand, not ") + type_name(item));
      return container.s.find(item.s) != std::string::npos;
    case Value::Kind::List: case Value::Kind::Tuple:
      for (const Value& x : *container.list)
        if (equal(x, item)) return true;
      return false;
    case Value::Kind::Dict:
      return item.is_string() && container.dict->find(item.s) != nullptr;
    case Value::Kind::Undefined: return false;
    default: fail_at(p, std::string("argument of type '") + type_name(container) + "' is not iterable");
  }
}

bool compare(const std::string& op, const Value& a, const Value& b, Pos p) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in") return contains(b, a, p);
  if (op == "not in") return !contains(b, a, p);
  if (a.is_undefined()) undefined_error(a, p);
  if (b.is_undefined()) undefined_error(b, p);
  if (op == "<") return less(a, b, p);
  if (op == ">") return less(b, a, p);
  if (op == "<=") return !less(b, a, p);
  return !less(a, b, p);  // >=
}

// Steps charged for work proportional to a value's size (list items, string bytes / 32).
size_t work_of(const Value& v) {
  if (v.is_sequence()) return v.list->size();
  if (v.kind == Value::Kind::Dict) return v.dict->items.size();
  if (v.is_string()) return v.s.size() / 32;
  return 0;
}

Value slice(Interp& in, const Value& obj, const Value& a, const Value& b, const Value& c, Pos p) {
  auto opt = [&](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (v.kind != Value::Kind::Int && v.kind != Value::Kind::Bool) fail_at(p, std::string("slice ") + what + " must be an integer");
    return as_int(v);
  };
  const auto start = opt(a, "start"), stop = opt(b, "stop");
  const int64_t step = opt(c, "step").value_or(1);
  if (step == 0) fail_at(p, "slice step cannot be zero");
  std::vector<std::string> chars;
  if (obj.is_string()) chars = utf8_chars(obj.s);
  else if (!obj.is_sequence()) {
    if (obj.is_undefined()) undefined_error(obj, p);
    fail_at(p, std::string("cannot slice a value of type '") + type_name(obj) + "'");
  }
  const int64_t n = obj.is_string() ? int64_t(chars.size()) : int64_t(obj.list->size());
  auto clamp = [&](std::optional<int64_t> v, int64_t def, int64_t lo, int64_t hi) {
    if (!v) return def;
    int64_t k = *v < 0 ? *v + n : *v;
    return std::clamp(k, lo, hi);
  };
  const int64_t lo = step > 0 ? clamp(start, 0, 0, n) : clamp(start, n - 1, -1, n - 1);
  const int64_t hi = step > 0 ? clamp(stop, n, 0, n) : clamp(stop, -1, -1, n - 1);
  std::string s;
  List l;
  for (int64_t k = lo; step > 0 ? k < hi : k > hi; k += step) {
    in.step(p);
    if (obj.is_string()) s += chars[size_t(k)];
    else l.push_back((*obj.list)[size_t(k)]);
  }
  return obj.is_string() ? Value::string(std::move(s)) : Value::make_list(std::move(l), obj.kind == Value::Kind::Tuple);
}

}  // namespace

Value Interp::eval(const Expr& e, Frame& f) {
  step(e.pos);
  switch (e.kind) {
    case Expr::Kind::Literal: return e.value;
    case Expr::Kind::Name: {
      const Value* v = f.find(e.name);
      return v ? *v : Value::undefined(e.name);
    }
    case Expr::Kind::Attr: {
      Value obj = eval(*e.a[0], f);
      charge(work_of(obj), e.pos);
      return get_attr(*this, obj, e.name, e.pos);
    }
    case Expr::Kind::Index: return get_item(*this, eval(*e.a[0], f), eval(*e.a[1], f), e.pos);
    case Expr::Kind::Slice: {
      Value obj = eval(*e.a[0], f);
      Value parts[3];
      for (int k = 0; k < 3; ++k)
        if (e.a[size_t(k) + 1]) parts[k] = eval(*e.a[size_t(k) + 1], f);
      return slice(*this, obj, parts[0], parts[1], parts[2], e.pos);
    }
    case Expr::Kind::Call: {
      Value callee = eval(*e.a[0], f);
      List args;
      for (size_t k = 1; k < e.a.size(); ++k) args.push_back(eval(*e.a[k], f));
      Kwargs kw;
      for (const auto& [k, x] : e.kw) kw.emplace_back(k, eval(*x, f));
      if (callee.kind != Value::Kind::Function) {
        if (callee.is_undefined()) undefined_error(callee, e.pos);
        fail_at(e.pos, std::string("'") + type_name(callee) + "' object is not callable");
      }
      if (++call_depth > 100) fail_at(e.pos, "calls nested deeper than 100 levels");
      Value r = callee.fn->call(*this, args, kw, e.pos);
      --call_depth;
      return r;
    }
    case Expr::Kind::Filter: case Expr::Kind::Test: {
      Value v = eval(*e.a[0], f);
      charge(work_of(v), e.pos);
      List args;
      for (size_t k = 1; k < e.a.size(); ++k) args.push_back(eval(*e.a[k], f));
      Kwargs kw;
      for (const auto& [k, x] : e.kw) kw.emplace_back(k, eval(*x, f));
      if (e.kind == Expr::Kind::Filter) return apply_filter(*this, e.name, std::move(v), args, kw, e.pos);
      if (!kw.empty()) fail_at(e.pos, "test '" + e.name + "' takes no keyword arguments");
      return Value::boolean(apply_test(*this, e.name, v, args, e.pos) != e.negated);
    }
    case Expr::Kind::Not: return Value::boolean(!truthy(eval(*e.a[0], f)));
    case Expr::Kind::Neg: case Expr::Kind::Pos: {
      Value v = eval(*e.a[0], f);
      if (!v.is_number()) {
        if (v.is_undefined()) undefined_error(v, e.pos);
        fail_at(e.pos, std::string("bad operand type for unary ") + (e.kind == Expr::Kind::Neg ? "-" : "+") + ": '" + type_name(v) + "'");
      }
      if (e.kind == Expr::Kind::Pos) return v.kind == Value::Kind::Bool ? Value::integer(v.b) : v;
      if (v.kind == Value::Kind::Float) return Value::real(-v.f);
      return Value::integer(checked(-__int128(as_int(v)), e.pos));
    }
    case Expr::Kind::Binary: {
      Value a = eval(*e.a[0], f);
      Value b = eval(*e.a[1], f);
      charge(work_of(a) + work_of(b), e.pos);
      return arith(*this, e.name, a, b, e.pos);
    }
    case Expr::Kind::And: {
      Value a = eval(*e.a[0], f);
      return truthy(a) ? eval(*e.a[1], f) : a;
    }
    case Expr::Kind::Or: {
      Value a = eval(*e.a[0], f);
      return truthy(a) ? a : eval(*e.a[1], f);
    }
    case Expr::Kind::Compare: {
      Value left = eval(*e.a[0], f);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.a[k + 1], f);
        charge(work_of(left) + work_of(right), e.pos);
        if (!compare(e.ops[k], left, right, e.pos)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case Expr::Kind::Cond:
      if (truthy(eval(*e.a[0], f))) return eval(*e.a[1], f);
      return e.a[2] ? eval(*e.a[2], f) : Value::undefined();
    case Expr::Kind::List: case Expr::Kind::Tuple: {
      List l;
      for (const auto& x : e.a) l.push_back(eval(*x, f));
      return Value::make_list(std::move(l), e.kind == Expr::Kind::Tuple);
    }
    case Expr::Kind::DictLit: {
      auto d = std::make_shared<Dict>();
      for (size_t k = 0; k < e.a.size(); k += 2) {
        Value key = eval(*e.a[k], f);
        if (!key.is_string()) fail_at(e.a[k]->pos, std::string("unsupported construct: a dict key of type '") + type_name(key) + "'");
        d->set(key.s, eval(*e.a[k + 1], f));
      }
      return Value::make_dict(std::move(d));
    }
  }
  fail_at(e.pos, "unknown expression");
}

namespace {

void assign(Frame& f, const std::vector<std::string>& targets, Value v, Pos p) {
  if (targets.size() == 1) {
    f.set(targets[0], std::move(v));
    return;
  }
  List items = iterate(v, p);
  if (items.size() != targets.size())
    fail_at(p, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) + " names");
  for (size_t k = 0; k < targets.size(); ++k) f.set(targets[k], std::move(items[k]));
}

Value loop_object(const List& items, size_t k) {
  auto d = std::make_shared<Dict>();
  const auto n = int64_t(items.size()), i = int64_t(k);
  d->set("index", Value::integer(i + 1));
  d->set("index0", Value::integer(i));
  d->set("revindex", Value::integer(n - i));
  d->set("revindex0", Value::integer(n - i - 1));
  d->set("first", Value::boolean(i == 0));
  d->set("last", Value::boolean(i == n - 1));
  d->set("length", Value::integer(n));
  d->set("depth", Value::integer(1));
  d->set("depth0", Value::integer(0));
  d->set("previtem", k > 0 ? items[k - 1] : Value::undefined("loop.previtem"));
  d->set("nextitem", k + 1 < items.size() ? items[k + 1] : Value::undefined("loop.nextitem"));
  d->set("cycle", make_function("loop.cycle", [i](Interp&, List& args, Kwargs& kw, Pos p) {
    if (args.empty() || !kw.empty()) fail_at(p, "loop.cycle takes one or more positional arguments");
    return args[size_t(i) % args.size()];
  }));
  return Value::make_dict(std::move(d));
}

}  // namespace

void Interp::exec(const Body& body, Frame& f, std::string& out) {
  for (const Node& n : body) {
    step(n.pos);
    switch (n.kind) {
      case Node::Kind::Text: out += n.text; break;
      case Node::Kind::Output: out += to_str(eval(*n.e[0], f)); break;
      case Node::Kind::If: {
        size_t k = 0;
        while (k < n.e.size() && !truthy(eval(*n.e[k], f))) ++k;
        if (k < n.bodies.size()) exec(n.bodies[k], f, out);
        break;
      }
      case Node::Kind::For: {
        List all = iterate(eval(*n.e[0], f), n.pos), items;
        if (n.has_filter) {
          for (Value& v : all) {
            Frame tf{{}, &f};
            assign(tf, n.targets, v, n.pos);
            if (truthy(eval(*n.e[1], tf))) items.push_back(std::move(v));
          }
        } else {
          items = std::move(all);
        }
        for (size_t k = 0; k < items.size(); ++k) {
          step(n.pos);
          Frame body_frame{{}, &f};
          assign(body_frame, n.targets, items[k], n.pos);
          body_frame.set("loop", loop_object(items, k));
          exec(n.bodies[0], body_frame, out);
          if (ctl == Ctl::Break) { ctl = Ctl::None; break; }
          ctl = Ctl::None;
        }
        if (items.empty() && n.bodies.size() > 1) exec(n.bodies[1], f, out);
        break;
      }
      case Node::Kind::Set: {
        Value v = eval(*n.e[0], f);
        if (n.target_attr.empty()) {
          assign(f, n.targets, std::move(v), n.pos);
        } else {
          Value* ns = f.find(n.targets[0]);
          if (!ns || ns->kind != Value::Kind::Namespace)
            fail_at(n.pos, "cannot assign attribute on non-namespace object '" + n.targets[0] + "'");
          ns->dict->set(n.target_attr, std::move(v));
        }
        break;
      }
      case Node::Kind::SetBlock: {
        std::string s;
        exec(n.bodies[0], f, s);
        f.set(n.targets[0], Value::string(std::move(s)));
        break;
      }
      case Node::Kind::Macro: {
        const Node* m = &n;
        f.set(n.text, make_function(n.text, [m](Interp& in, List& args, Kwargs& kw, Pos p) {
          Frame mf{{}, in.root};
          const size_t n_req = m->targets.size() - m->e.size();
          if (args.size() > m->targets.size()) fail_at(p, "macro '" + m->text + "' takes not more than " + std::to_string(m->targets.size()) + " argument(s)");
          for (size_t k = 0; k < m->targets.size(); ++k) {
            Value v = arg(args, kw, k, m->targets[k].c_str());
            if (v.is_undefined() && k >= n_req) v = in.eval(*m->e[k - n_req], mf);
            mf.set(m->targets[k], std::move(v));
          }
          if (!kw.empty()) fail_at(p, "macro '" + m->text + "' has no parameter '" + kw.front().first + "'");
          std::string s;
          in.exec(m->bodies[0], mf, s);
          in.ctl = Ctl::None;
          return Value::string(std::move(s));
        }));
        break;
      }
      case Node::Kind::Break: case Node::Kind::Continue:
        ctl = n.kind == Node::Kind::Break ? Ctl::Break : Ctl::Continue;
        return;
      case Node::Kind::Generation: exec(n.bodies[0], f, out); break;
    }
    check_size(out.size(), n.pos);
    if (ctl != Ctl::None) return;
  }
}

}  // namespace tpu::jinja
