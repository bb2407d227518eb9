#include "device/plugins/pjrt_sim/shlo_program.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include "tpucore/core/error.h"
#include "tpucore/ops.h"

namespace tpu::pjrt_sim {
namespace {

[[noreturn]] void bad(int line, const std::string& why) {
  fail("pjrt_tpucore_sim: StableHLO module, line {}: {}", line, why);
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

DType parse_elem(const std::string& e, int line) {
  if (e == "f32") return DType::f32;
  if (e == "bf16") return DType::bf16;
  if (e == "f16") return DType::f16;
  if (e == "i32") return DType::i32;
  if (e == "i64") return DType::i64;
  if (e == "i8") return DType::i8;
  if (e == "ui8") return DType::u8;
  if (e == "i1") return DType::boolean;
  if (e == "f8E4M3FN") return DType::f8e4m3;
  if (e == "f8E5M2") return DType::f8e5m2;
  bad(line, "unsupported element type '" + e + "'");
}

// "tensor<2x3xf32>" at the start of s (after spaces); advances pos.
TypeSpec parse_type(const std::string& s, size_t& pos, int line) {
  while (pos < s.size() && s[pos] == ' ') ++pos;
  if (s.compare(pos, 7, "tensor<") != 0) bad(line, "expected a tensor type at '" + s.substr(pos, 20) + "'");
  const size_t end = s.find('>', pos);
  if (end == std::string::npos) bad(line, "unterminated tensor type");
  const std::string body = s.substr(pos + 7, end - pos - 7);
  pos = end + 1;
  std::vector<int64_t> dims;
  size_t p = 0;
  while (true) {
    const size_t x = body.find('x', p);
    if (x == std::string::npos || !std::isdigit(static_cast<unsigned char>(body[p]))) break;
    try {
      dims.push_back(std::stoll(body.substr(p, x - p)));
    } catch (...) {
      bad(line, "bad dimension in 'tensor<" + body + ">'");
    }
    p = x + 1;
  }
  return {Shape(dims), parse_elem(body.substr(p), line)};
}

// "(t1, t2) -> t" or "(t1) -> (t2, t3)".
void parse_signature(const std::string& s, Op& op) {
  size_t pos = s.find('(');
  if (pos == std::string::npos) bad(op.line, "missing operand types");
  ++pos;
  while (pos < s.size() && s[pos] != ')') {
    op.in_types.push_back(parse_type(s, pos, op.line));
    while (pos < s.size() && (s[pos] == ',' || s[pos] == ' ')) ++pos;
  }
  pos = s.find("->", pos);
  if (pos == std::string::npos) bad(op.line, "missing result type");
  pos += 2;
  while (pos < s.size() && s[pos] == ' ') ++pos;
  if (s.compare(pos, 2, "()") == 0) return;
  const bool tuple = s[pos] == '(';
  if (tuple) ++pos;
  do {
    op.types.push_back(parse_type(s, pos, op.line));
    while (pos < s.size() && (s[pos] == ',' || s[pos] == ' ')) ++pos;
  } while (tuple && pos < s.size() && s[pos] != ')');
  op.type = op.types[0];
}

std::vector<std::string> split_operands(const std::string& s) {
  std::vector<std::string> r;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ',')) {
    t = trim(t);
    if (!t.empty()) r.push_back(t);
  }
  return r;
}

// One generic op line: [%r = ]"dialect.op"(operands) [{attrs}] : signature
Op parse_op_line(const std::string& l, int line) {
  Op op;
  op.line = line;
  std::string s = trim(l);
  if (s[0] == '%') {
    const size_t eq = s.find(" = ");
    if (eq == std::string::npos) bad(line, "expected '%name = \"op\"(...)'");
    op.result = s.substr(0, eq);
    if (const size_t colon = op.result.find(':'); colon != std::string::npos) {  // "%v3:2": several results
      try {
        op.num_results = std::stoi(op.result.substr(colon + 1));
      } catch (...) {
        bad(line, "bad result count in '" + op.result + "'");
      }
      op.result.resize(colon);
      if (op.num_results < 1) bad(line, "bad result count in '" + s.substr(0, eq) + "'");
    }
    s = s.substr(eq + 3);
  }
  if (s.empty() || s[0] != '"') bad(line, "expected a quoted op name");
  const size_t q = s.find('"', 1);
  if (q == std::string::npos) bad(line, "unterminated op name");
  const std::string full = s.substr(1, q - 1);
  const size_t dot = full.find('.');
  const std::string dialect = full.substr(0, dot);
  op.name = dot == std::string::npos ? full : full.substr(dot + 1);
  if (dialect == "func" && op.name == "return") op.name = "func_return";
  else if (dialect != "stablehlo") bad(line, "op '" + full + "' is not a StableHLO op");
  size_t p = q + 1;
  if (p >= s.size() || s[p] != '(') bad(line, "expected '(' after the op name");
  const size_t close = s.find(')', p);
  if (close == std::string::npos) bad(line, "unterminated operand list");
  op.operands = split_operands(s.substr(p + 1, close - p - 1));
  p = close + 1;
  if (s.compare(p, 3, " ({") == 0) return op;  // a region follows (reduce, scatter)
  const size_t lb = s.find('{', p);
  const size_t colon = s.rfind(" : ");
  if (colon == std::string::npos) bad(line, "missing ' : ' and the op's types");
  if (lb != std::string::npos && lb < colon) {
    const size_t rb = s.rfind('}', colon);
    op.attrs = s.substr(lb + 1, rb - lb - 1);
  }
  parse_signature(s.substr(colon + 3), op);
  return op;
}

}  // namespace

Program parse_program(const std::string& text) {
  Program p;
  std::vector<std::string> lines;
  {
    std::stringstream ss(text);
    std::string l;
    while (std::getline(ss, l)) lines.push_back(l);
  }
  bool saw_func = false, saw_args = false, saw_return = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int ln = int(i) + 1;
    const std::string s = trim(lines[i]);
    if (s.empty() || s.rfind("//", 0) == 0 || s.rfind("\"builtin.module\"", 0) == 0 || s.rfind("})", 0) == 0) continue;
    if (s.rfind("\"func.func\"", 0) == 0) {
      if (saw_func) bad(ln, "only one function per module is supported");
      saw_func = true;
      continue;
    }
    if (s.rfind("^bb0(", 0) == 0 && !saw_args) {
      saw_args = true;
      size_t pos = 5;
      while (pos < s.size() && s[pos] != ')') {
        const size_t c = s.find(':', pos);
        if (c == std::string::npos) bad(ln, "bad block argument list");
        pos = c + 1;
        p.args.push_back(parse_type(s, pos, ln));
        while (pos < s.size() && (s[pos] == ',' || s[pos] == ' ')) ++pos;
      }
      continue;
    }
    if (!saw_args) bad(ln, "expected the function's entry block '^bb0(...)' before '" + s.substr(0, 40) + "'");
    Op op = parse_op_line(s, ln);
    if ((op.name == "reduce" || op.name == "scatter") && op.attrs.empty() && op.in_types.empty()) {
      // ^bb0(...):, the body op, stablehlo.return, then "}) {dimensions = ...} : (...) -> ..."
      if (i + 4 >= lines.size()) bad(ln, "unterminated " + op.name + " region");
      const Op body = parse_op_line(lines[i + 2], ln + 2);
      op.body = body.name;
      const std::string tail = trim(lines[i + 4]);
      if (tail.rfind("})", 0) != 0) bad(ln + 4, "expected '})' closing the " + op.name + " region");
      const size_t lb = tail.find('{', 2), colon = tail.rfind(" : ");
      if (lb == std::string::npos || colon == std::string::npos) bad(ln + 4, "bad " + op.name + " attributes");
      op.attrs = tail.substr(lb + 1, tail.rfind('}', colon) - lb - 1);
      parse_signature(tail.substr(colon + 3), op);
      i += 4;
    }
    if (op.name == "custom_call") (void)custom_call_of(op);  // an unknown target fails the compile
    if (size_t(op.num_results) != std::max<size_t>(1, op.types.size()) && op.name != "func_return")
      bad(ln, fmt::format("'{}' declares {} result(s) and {} result type(s)", op.name, op.num_results, op.types.size()));
    if (op.name == "func_return") {
      for (const TypeSpec& t : op.in_types) p.results.push_back(t);
      saw_return = true;
    }
    p.ops.push_back(std::move(op));
  }
  if (!saw_func || !saw_args) fail("pjrt_tpucore_sim: the StableHLO module has no function with an entry block");
  if (!saw_return) fail("pjrt_tpucore_sim: the StableHLO module's function has no func.return");
  return p;
}

[[noreturn]] void bad(const Op& op, const std::string& why) {
  fail("pjrt_tpucore_sim: StableHLO module, line {} ('stablehlo.{}'): {}", op.line, op.name, why);
}

// The text after "name = " in the attributes, or empty.
std::string attr(const Op& op, const std::string& name) {
  const size_t p = op.attrs.find(name + " = ");
  return p == std::string::npos ? std::string() : op.attrs.substr(p + name.size() + 3);
}

std::vector<int64_t> int_list(const std::string& s) {
  std::vector<int64_t> r;
  size_t p = 0;
  while (p < s.size()) {
    while (p < s.size() && !(std::isdigit(static_cast<unsigned char>(s[p])) || s[p] == '-')) ++p;
    if (p >= s.size()) break;
    size_t used = 0;
    r.push_back(std::stoll(s.substr(p), &used));
    p += used;
  }
  return r;
}

}  // namespace tpu::pjrt_sim
