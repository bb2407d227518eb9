// The chat-template parser: Jinja2's grammar and operator precedence for the statements chat
// templates use (if/elif/else, for with loop filters and else, set incl. namespace attributes and
// block sets, macro, break/continue, Transformers' generation tag). Any other statement is an
// error naming it and its position.
#include "tpucore/io/chat_template/ast.h"

namespace tpu::jinja {
namespace {

using TT = Token::Type;
constexpr int kMaxDepth = 200;  // nesting of expressions and blocks

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body run() {
    std::string end;
    Body body = block({}, end);
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == TT::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == TT::Name && cur().text == n; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }

  [[noreturn]] void unexpected(const std::string& wanted) const {
    std::string got = cur().type == TT::Eof ? "end of template" : cur().type == TT::BlockEnd ? "'%}'"
                      : cur().type == TT::VarEnd ? "'}}'" : "'" + cur().text + "'";
    fail_at(cur().pos, "expected " + wanted + ", found " + got);
  }
  void expect_op(const char* op) {
    if (!is_op(op)) unexpected(std::string("'") + op + "'");
    next();
  }
  std::string expect_name() {
    if (cur().type != TT::Name) unexpected("a name");
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != TT::BlockEnd) unexpected("'%}'");
    next();
  }
  void enter(Pos p) {
    if (++depth_ > kMaxDepth) fail_at(p, "template nested deeper than 200 levels");
  }

  // Parses nodes until a block tag whose name is in `ends`; that name goes to `end` (the tag's
  // name token is consumed, the rest of the tag is left to the caller).
  Body block(const std::vector<std::string>& ends, std::string& end) {
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == TT::Eof) {
        if (!ends.empty()) fail_at(tk.pos, "unexpected end of template: missing '{% " + ends.back() + " %}'");
        return body;
      }
      if (tk.type == TT::Text) {
        Node n;
        n.kind = Node::Kind::Text;
        n.pos = tk.pos;
        n.text = tk.text;
        body.push_back(std::move(n));
        next();
      } else if (tk.type == TT::VarBegin) {
        next();
        Node n;
        n.kind = Node::Kind::Output;
        n.pos = tk.pos;
        n.e.push_back(tuple_expr());
        if (cur().type != TT::VarEnd) unexpected("'}}'");
        next();
        body.push_back(std::move(n));
      } else if (tk.type == TT::BlockBegin) {
        next();
        if (cur().type != TT::Name) unexpected("a statement name");
        const std::string name = cur().text;
        for (const auto& e : ends)
          if (name == e) {
            next();
            end = name;
            return body;
          }
        body.push_back(statement());
      } else {
        unexpected("text or a tag");
      }
    }
  }

  Node statement() {
    const Token& tk = cur();
    const std::string name = tk.text;
    Node n;
    n.pos = tk.pos;
    enter(tk.pos);
    next();
    std::string end;
    if (name == "if") {
      n.kind = Node::Kind::If;
      n.e.push_back(expr());
      expect_block_end();
      while (true) {
        n.bodies.push_back(block({"elif", "else", "endif"}, end));
        if (end == "elif") {
          n.e.push_back(expr());
          expect_block_end();
        } else if (end == "else") {
          expect_block_end();
          n.bodies.push_back(block({"endif"}, end));
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (name == "for") {
      n.kind = Node::Kind::For;
      n.targets = target_names();
      if (!is_name("in")) unexpected("'in'");
      next();
      n.e.push_back(or_expr_no_cond());
      if (is_name("if")) {
        next();
        n.e.push_back(or_expr_no_cond());
        n.has_filter = true;
      }
      if (is_name("recursive")) fail_at(cur().pos, "unsupported construct: recursive for loop");
      expect_block_end();
      n.bodies.push_back(block({"else", "endfor"}, end));
      expect_block_end();
      if (end == "else") {
        n.bodies.push_back(block({"endfor"}, end));
        expect_block_end();
      }
    } else if (name == "set") {
      n.targets = target_names();
      if (n.targets.size() == 1 && is_op(".")) {
        next();
        n.target_attr = expect_name();
      }
      if (is_op("=")) {
        next();
        n.kind = Node::Kind::Set;
        n.e.push_back(tuple_expr());
        expect_block_end();
      } else {
        if (n.targets.size() != 1 || !n.target_attr.empty()) unexpected("'='");
        if (is_op("|")) fail_at(cur().pos, "unsupported construct: filtered block set");
        n.kind = Node::Kind::SetBlock;
        expect_block_end();
        n.bodies.push_back(block({"endset"}, end));
        expect_block_end();
      }
    } else if (name == "macro") {
      n.kind = Node::Kind::Macro;
      n.text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        n.targets.push_back(expect_name());
        if (is_op("=")) {
          next();
          n.e.push_back(expr());
        } else if (!n.e.empty()) {
          fail_at(cur().pos, "macro '" + n.text + "': a parameter without default after one with a default");
        }
        if (!is_op(")")) expect_op(",");
      }
      next();
      expect_block_end();
      n.bodies.push_back(block({"endmacro"}, end));
      if (cur().type == TT::Name) next();  // {% endmacro name %}
      expect_block_end();
    } else if (name == "break" || name == "continue") {
      n.kind = name == "break" ? Node::Kind::Break : Node::Kind::Continue;
      expect_block_end();
    } else if (name == "generation") {
      n.kind = Node::Kind::Generation;
      expect_block_end();
      n.bodies.push_back(block({"endgeneration"}, end));
      expect_block_end();
    } else {
      fail_at(tk.pos, "unsupported construct: '{% " + name + " %}'");
    }
    --depth_;
    return n;
  }

  std::vector<std::string> target_names() {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) next();
    names.push_back(expect_name());
    while (is_op(",")) {
      next();
      if (cur().type != TT::Name) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  ExprPtr make(Expr::Kind k, Pos p) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = p;
    return e;
  }

  // An expression, or several separated by commas (a tuple without parentheses).
  ExprPtr tuple_expr() {
    const Pos p = cur().pos;
    ExprPtr first = expr();
    if (!is_op(",")) return first;
    auto t = make(Expr::Kind::Tuple, p);
    t->a.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (cur().type == TT::VarEnd || cur().type == TT::BlockEnd) break;
      t->a.push_back(expr());
    }
    return t;
  }

  ExprPtr expr() {
    enter(cur().pos);
    ExprPtr e = or_expr();
    while (is_name("if")) {
      auto c = make(Expr::Kind::Cond, cur().pos);
      next();
      c->a.push_back(or_expr());
      c->a.push_back(std::move(e));
      if (is_name("else")) {
        next();
        c->a.push_back(expr());
      } else {
        c->a.push_back(nullptr);
      }
      e = std::move(c);
    }
    --depth_;
    return e;
  }

  ExprPtr or_expr_no_cond() { return or_expr(); }

  ExprPtr or_expr() {
    ExprPtr l = and_expr();
    while (is_name("or")) {
      auto n = make(Expr::Kind::Or, cur().pos);
      next();
      n->a.push_back(std::move(l));
      n->a.push_back(and_expr());
      l = std::move(n);
    }
    return l;
  }

  ExprPtr and_expr() {
    ExprPtr l = not_expr();
    while (is_name("and")) {
      auto n = make(Expr::Kind::And, cur().pos);
      next();
      n->a.push_back(std::move(l));
      n->a.push_back(not_expr());
      l = std::move(n);
    }
    return l;
  }

  ExprPtr not_expr() {
    if (is_name("not")) {
      auto n = make(Expr::Kind::Not, cur().pos);
      next();
      enter(n->pos);
      n->a.push_back(not_expr());
      --depth_;
      return n;
    }
    return compare();
  }

  ExprPtr compare() {
    const Pos p = cur().pos;
    ExprPtr first = math1();
    std::unique_ptr<Expr> c;
    while (true) {
      std::string op;
      if (cur().type == TT::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                   cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == TT::Name && peek().text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!c) {
        c = make(Expr::Kind::Compare, p);
        c->a.push_back(std::move(first));
      }
      c->ops.push_back(op);
      c->a.push_back(math1());
    }
    return c ? std::move(c) : std::move(first);
  }

  ExprPtr binary(ExprPtr l, ExprPtr r, const std::string& op, Pos p) {
    auto n = make(Expr::Kind::Binary, p);
    n->name = op;
    n->a.push_back(std::move(l));
    n->a.push_back(std::move(r));
    return n;
  }

  ExprPtr math1() {
    ExprPtr l = concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      l = binary(std::move(l), concat(), op.text, op.pos);
    }
    return l;
  }

  ExprPtr concat() {
    ExprPtr l = math2();
    while (is_op("~")) {
      const Token& op = next();
      l = binary(std::move(l), math2(), "~", op.pos);
    }
    return l;
  }

  ExprPtr math2() {
    ExprPtr l = pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      l = binary(std::move(l), pow(), op.text, op.pos);
    }
    return l;
  }

  ExprPtr pow() {
    ExprPtr l = unary(true);
    while (is_op("**")) {
      const Token& op = next();
      l = binary(std::move(l), unary(true), "**", op.pos);
    }
    return l;
  }

  ExprPtr unary(bool with_filter) {
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      auto n = make(is_op("-") ? Expr::Kind::Neg : Expr::Kind::Pos, cur().pos);
      next();
      enter(n->pos);
      n->a.push_back(unary(false));
      --depth_;
      node = std::move(n);
    } else {
      node = primary();
    }
    node = postfix(std::move(node));
    if (with_filter) node = filters(std::move(node));
    return node;
  }

  ExprPtr primary() {
    const Token& tk = cur();
    switch (tk.type) {
      case TT::Name: {
        next();
        const std::string& n = tk.text;
        if (n == "true" || n == "True") { auto e = make(Expr::Kind::Literal, tk.pos); e->value = Value::boolean(true); return e; }
        if (n == "false" || n == "False") { auto e = make(Expr::Kind::Literal, tk.pos); e->value = Value::boolean(false); return e; }
        if (n == "none" || n == "None") { auto e = make(Expr::Kind::Literal, tk.pos); e->value = Value::none(); return e; }
        auto e = make(Expr::Kind::Name, tk.pos);
        e->name = n;
        return e;
      }
      case TT::String: {
        auto e = make(Expr::Kind::Literal, tk.pos);
        std::string s;
        while (cur().type == TT::String) s += next().text;  // adjacent literals join
        e->value = Value::string(std::move(s));
        return e;
      }
      case TT::Int: case TT::Float: {
        next();
        auto e = make(Expr::Kind::Literal, tk.pos);
        e->value = tk.type == TT::Int ? Value::integer(tk.i) : Value::real(tk.f);
        return e;
      }
      case TT::Op:
        if (tk.text == "(") {
          next();
          if (is_op(")")) { next(); return make(Expr::Kind::Tuple, tk.pos); }
          ExprPtr first = expr();
          if (is_op(")")) { next(); return first; }
          auto t = make(Expr::Kind::Tuple, tk.pos);
          t->a.push_back(std::move(first));
          while (is_op(",")) {
            next();
            if (is_op(")")) break;
            t->a.push_back(expr());
          }
          expect_op(")");
          return t;
        }
        if (tk.text == "[") {
          next();
          auto l = make(Expr::Kind::List, tk.pos);
          while (!is_op("]")) {
            l->a.push_back(expr());
            if (!is_op("]")) expect_op(",");
          }
          next();
          return l;
        }
        if (tk.text == "{") {
          next();
          auto d = make(Expr::Kind::DictLit, tk.pos);
          while (!is_op("}")) {
            d->a.push_back(expr());
            expect_op(":");
            d->a.push_back(expr());
            if (!is_op("}")) expect_op(",");
          }
          next();
          return d;
        }
        [[fallthrough]];
      default:
        unexpected("an expression");
    }
  }

  void call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail_at(cur().pos, "unsupported construct: *args or **kwargs in a call");
      if (cur().type == TT::Name && peek().type == TT::Op && peek().text == "=") {
        std::string k = next().text;
        next();
        call.kw.emplace_back(std::move(k), expr());
      } else {
        if (!call.kw.empty()) fail_at(cur().pos, "positional argument after a keyword argument");
        call.a.push_back(expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    next();
  }

  ExprPtr postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        const Token& dot = next();
        if (cur().type == TT::Int) {
          auto n = make(Expr::Kind::Index, dot.pos);
          auto lit = make(Expr::Kind::Literal, cur().pos);
          lit->value = Value::integer(next().i);
          n->a.push_back(std::move(node));
          n->a.push_back(std::move(lit));
          node = std::move(n);
          continue;
        }
        auto n = make(Expr::Kind::Attr, dot.pos);
        n->name = expect_name();
        n->a.push_back(std::move(node));
        node = std::move(n);
      } else if (is_op("[")) {
        const Token& br = next();
        std::vector<ExprPtr> parts(3);
        bool slice = false;
        int k = 0;
        while (true) {
          if (is_op(":")) {
            next();
            slice = true;
            if (++k > 2) unexpected("']'");
            continue;
          }
          if (is_op("]")) break;
          if (parts[size_t(k)]) unexpected("':' or ']'");
          parts[size_t(k)] = expr();
          if (is_op(",")) fail_at(cur().pos, "unsupported construct: tuple subscript");
        }
        next();
        auto n = make(slice ? Expr::Kind::Slice : Expr::Kind::Index, br.pos);
        n->a.push_back(std::move(node));
        if (!slice) {
          if (!parts[0]) fail_at(br.pos, "empty subscript");
          n->a.push_back(std::move(parts[0]));
        } else {
          for (auto& pt : parts) n->a.push_back(std::move(pt));
        }
        node = std::move(n);
      } else if (is_op("(")) {
        auto n = make(Expr::Kind::Call, cur().pos);
        n->a.push_back(std::move(node));
        call_args(*n);
        node = std::move(n);
      } else {
        return node;
      }
    }
  }

  ExprPtr filters(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        const Token& bar = next();
        auto n = make(Expr::Kind::Filter, bar.pos);
        n->name = expect_name();
        while (is_op(".")) {  // dotted filter names
          next();
          n->name += '.';
          n->name += expect_name();
        }
        n->a.push_back(std::move(node));
        if (is_op("(")) call_args(*n);
        node = std::move(n);
      } else if (is_name("is")) {
        const Token& is = next();
        auto n = make(Expr::Kind::Test, is.pos);
        if (is_name("not")) {
          next();
          n->negated = true;
        }
        // `none`, `true` and `false` are test names here, not constants.
        n->name = expect_name();
        n->a.push_back(std::move(node));
        if (is_op("(")) {
          call_args(*n);
        } else if (cur().type == TT::String || cur().type == TT::Int || cur().type == TT::Float ||
                   (cur().type == TT::Name && cur().text != "and" && cur().text != "or" && cur().text != "else" &&
                    cur().text != "if" && cur().text != "in" && cur().text != "is" && cur().text != "not")) {
          n->a.push_back(unary(false));  // `x is divisibleby 3`, `x is sameas y`
        }
        node = std::move(n);
      } else if (is_op("(")) {
        auto n = make(Expr::Kind::Call, cur().pos);
        n->a.push_back(std::move(node));
        call_args(*n);
        node = std::move(n);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse(const std::string& source) { return Parser(tokenize(source)).run(); }

}  // namespace tpu::jinja
