// Tokens and syntax tree of the chat-template interpreter (the Jinja2 subset that Hugging Face chat
// templates use). lexer.cpp turns the source into tokens with Transformers' whitespace settings
// (trim_blocks, lstrip_blocks, no trailing newline kept), parser.cpp builds the tree, eval.cpp and
// builtins.cpp run it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tpucore/io/chat_template/value.h"

namespace tpu::jinja {

struct Token {
  enum class Type : uint8_t { Text, BlockBegin, BlockEnd, VarBegin, VarEnd, Name, String, Int, Float, Op, Eof };
  Type type = Type::Eof;
  std::string text;  // Text: the literal text; Name/Op: the spelling; String: the unescaped value
  int64_t i = 0;
  double f = 0;
  Pos pos;
};

/// Splits a template into tokens. Syntax errors are tpu::Error naming the position.
std::vector<Token> tokenize(const std::string& source);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind : uint8_t {
    Literal,   // value
    Name,      // name
    Attr,      // a[0].name
    Index,     // a[0][a[1]]
    Slice,     // a[0][a[1]:a[2]:a[3]] (null parts absent)
    Call,      // a[0](a[1..]), keyword arguments in kw
    Filter,    // a[0] | name(a[1..], kw)
    Test,      // a[0] is [not] name(a[1..])
    Not,       // not a[0]
    Neg,       // -a[0]
    Pos,       // +a[0]
    Binary,    // a[0] op a[1]
    And,       // a[0] and a[1]
    Or,        // a[0] or a[1]
    Compare,   // a[0] ops[0] a[1] ops[1] a[2] ... (chained)
    Cond,      // a[1] if a[0] else a[2] (a[2] may be null: Undefined)
    List,      // [a...]
    Tuple,     // (a...)
    DictLit,   // {a[0]: a[1], a[2]: a[3], ...}
  };
  Kind kind = Kind::Literal;
  Pos pos;
  Value value;
  std::string name;               // Name, Attr, Call-free names, Filter, Test, Binary's operator
  std::vector<std::string> ops;   // Compare
  bool negated = false;           // Test: `is not`
  std::vector<ExprPtr> a;
  std::vector<std::pair<std::string, ExprPtr>> kw;
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Kind : uint8_t {
    Text,      // text
    Output,    // {{ e[0] }}
    If,        // if e[i] then bodies[i]; bodies has one more entry than e when there is an else
    For,       // for targets in e[0] [if e[1]]: bodies[0]; else bodies[1]
    Set,       // set targets (or ns.attr: target_attr) = e[0]
    SetBlock,  // set targets[0] %} bodies[0] {% endset
    Macro,     // macro name(targets with defaults e) bodies[0]
    Break,
    Continue,
    Generation,  // {% generation %} bodies[0] {% endgeneration %} (Transformers' assistant-mask tag)
  };
  Kind kind = Kind::Text;
  Pos pos;
  std::string text;
  std::vector<std::string> targets;
  std::string target_attr;   // Set on a namespace attribute: targets[0].target_attr
  std::vector<ExprPtr> e;    // Macro: the defaults, aligned with the last params
  std::vector<Body> bodies;
  bool has_filter = false;   // For: an `if` filter in e[1]
};

/// Parses a template into its top-level body.
Body parse(const std::string& source);

}  // namespace tpu::jinja
