// The chat-template evaluator's state (eval.cpp) and the built-in filters, tests, methods and
// globals (builtins.cpp), with Jinja2's semantics in Transformers' ImmutableSandboxedEnvironment.
#pragma once

#include <string>
#include <vector>

#include "tpucore/io/chat_template/ast.h"

namespace tpu::jinja {

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  Frame* parent = nullptr;
  Value* find(const std::string& name);
  void set(const std::string& name, Value v);
};

struct Interp {
  Frame* root = nullptr;   // the template's top level (its parent holds the render variables)
  size_t max_output = 0;   // bytes of output and of any string built
  size_t steps_left = 0;   // evaluation steps before the render is refused as runaway
  int call_depth = 0;
  enum class Ctl : uint8_t { None, Break, Continue } ctl = Ctl::None;

  void step(Pos p);
  void charge(size_t n, Pos p);  // n steps at once (work proportional to n)
  void check_size(size_t n, Pos p) const;
  Value eval(const Expr& e, Frame& f);
  void exec(const Body& body, Frame& f, std::string& out);
};

/// A callable value.
Value make_function(std::string name, std::function<Value(Interp&, List&, Kwargs&, Pos)> fn);
/// The attribute `name` of a value as Jinja's getattr sees it (bound methods for str/dict/list).
Value get_attr(Interp& in, const Value& obj, const std::string& name, Pos p);
/// obj[key] as Jinja's getitem sees it.
Value get_item(Interp& in, const Value& obj, const Value& key, Pos p);
/// The items a for loop or a filter iterates over.
List iterate(const Value& v, Pos p);
Value apply_filter(Interp& in, const std::string& name, Value v, List& args, Kwargs& kw, Pos p);
bool apply_test(Interp& in, const std::string& name, const Value& v, List& args, Pos p);
/// The globals of Transformers' environment: range, namespace, dict, raise_exception, strftime_now.
void add_globals(Frame& f);

/// Takes keyword or positional argument `k` named `name`, or `def` if neither was given.
Value arg(List& args, Kwargs& kw, size_t k, const char* name, Value def = Value::undefined());
/// Fails if arguments are left that the callee does not take.
void no_more_args(const List& args, const Kwargs& kw, size_t n_pos, const std::string& callee, Pos p);

}  // namespace tpu::jinja
