#include "sim/assembly.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "sim/error.h"
#include "sim/fields.h"

namespace tpu::sim {
namespace {
using namespace detail;

std::string fmt_float(float v) { return fmt::format("{}", v); }

std::string fmt_operand(const Instr& in, const Operand& o, Role role) {
  if (o.kind == Operand::Kind::imm) return fmt::format("#{}", o.imm);
  if (o.kind == Operand::Kind::none) return "none";
  std::string s = fmt::format("{}[{}]:{}", space_name(o.space), format_addr(o.addr), dtype_name(o.dtype));
  auto shape = operand_shape(in, role);
  if (!(o.row_stride == -1 || (o.row_stride == shape[1] && o.col_stride == 1)))
    s += fmt::format("{{{},{}}}", o.row_stride, o.col_stride);
  return s;
}

bool dense_strides(const Instr& in, const std::array<int64_t, 2>& s) {
  return (s[0] == -1 && s[1] == -1) || (s[1] == in.dma_shape[2] && s[0] == in.dma_shape[1] * in.dma_shape[2]);
}

// Appends " key=value" for one field; optional fields at their default are skipped.
void print_field(std::string& out, const Instr& in, const FieldDef& f) {
  std::string v;
  switch (f.kind) {
    case FK::reg: v = fmt::format("r{}", in.reg); break;
    case FK::reg_a: v = fmt::format("r{}", in.reg_a); break;
    case FK::imm: v = fmt::format("{}", in.imm); break;
    case FK::n:
      if (!f.required && in.imm == 1) return;
      v = fmt::format("{}", in.imm);
      break;
    case FK::sem:
      if (!f.required && in.sem < 0) return;
      v = fmt::format("{}", in.sem);
      break;
    case FK::q: v = fmt::format("{}", in.unit); break;
    case FK::mxu: v = fmt::format("{}", in.unit); break;
    case FK::dst_addr: v = fmt::format("{}[{}]", space_name(in.dst.space), format_addr(in.dst.addr)); break;
    case FK::src_addr: v = fmt::format("{}[{}]", space_name(in.a.space), format_addr(in.a.addr)); break;
    case FK::shape3: v = fmt::format("[{},{},{}]", in.dma_shape[0], in.dma_shape[1], in.dma_shape[2]); break;
    case FK::dst_stride:
      if (dense_strides(in, in.dst_stride)) return;
      v = fmt::format("[{},{}]", in.dst_stride[0], in.dst_stride[1]);
      break;
    case FK::src_stride:
      if (dense_strides(in, in.src_stride)) return;
      v = fmt::format("[{},{}]", in.src_stride[0], in.src_stride[1]);
      break;
    case FK::dst: v = fmt_operand(in, in.dst, Role::dst); break;
    case FK::a: v = fmt_operand(in, in.a, Role::a); break;
    case FK::b: v = fmt_operand(in, in.b, Role::b); break;
    case FK::c: v = fmt_operand(in, in.c, Role::c); break;
    case FK::rows: v = fmt::format("{}", in.rows); break;
    case FK::k: v = fmt::format("{}", in.k); break;
    case FK::cols: v = fmt::format("{}", in.cols); break;
    case FK::mode: v = std::string(mxu_mode_name(in.mode)); break;
    case FK::acc: v = std::string(1, in.acc ? '1' : '0'); break;
    case FK::shape2: v = fmt::format("[{},{}]", in.rows, in.cols); break;
    case FK::axis: v = fmt::format("{}", in.axis); break;
    case FK::value: v = fmt_float(in.fimm); break;
  }
  out += ' ';
  out += f.key;
  out += '=';
  out += v;
}

// ---- parsing ----

class LineParser {
 public:
  LineParser(std::string_view s, size_t line) : s_(s), line_(line) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw SimError(fmt::format("line {}:{}: {}", line_, pos_ + 1, why));
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r')) ++pos_;
  }
  bool at_end() {
    skip_ws();
    return pos_ >= s_.size();
  }
  bool peek(char c) {
    skip_ws();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  void expect(char c) {
    skip_ws();
    if (pos_ >= s_.size() || s_[pos_] != c) fail(fmt::format("expected '{}'", c));
    ++pos_;
  }
  std::string_view word() {
    skip_ws();
    size_t b = pos_;
    while (pos_ < s_.size() && (std::isalnum((unsigned char)s_[pos_]) || s_[pos_] == '_' || s_[pos_] == '.')) ++pos_;
    if (b == pos_) fail("expected a name");
    return s_.substr(b, pos_ - b);
  }
  int64_t integer() {
    skip_ws();
    size_t b = pos_;
    bool neg = false;
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) neg = s_[pos_++] == '-';
    int base = 10;
    if (pos_ + 1 < s_.size() && s_[pos_] == '0' && (s_[pos_ + 1] == 'x' || s_[pos_ + 1] == 'X')) {
      base = 16;
      pos_ += 2;
    }
    size_t digits = pos_;
    unsigned long long v = 0;
    while (pos_ < s_.size() && std::isxdigit((unsigned char)s_[pos_]) && (base == 16 || std::isdigit((unsigned char)s_[pos_]))) {
      int d = std::isdigit((unsigned char)s_[pos_]) ? s_[pos_] - '0' : (std::tolower(s_[pos_]) - 'a' + 10);
      if (v > (~0ull - d) / base) {
        pos_ = b;
        fail("integer out of range");
      }
      v = v * base + d;
      ++pos_;
    }
    if (digits == pos_) {
      pos_ = b;
      fail("expected an integer");
    }
    if (v > uint64_t(INT64_MAX)) {
      pos_ = b;
      fail("integer out of range");
    }
    return neg ? -int64_t(v) : int64_t(v);
  }
  float real() {
    skip_ws();
    size_t b = pos_;
    while (pos_ < s_.size() && !std::isspace((unsigned char)s_[pos_])) ++pos_;
    std::string tok(s_.substr(b, pos_ - b));
    if (tok.empty()) fail("expected a number");
    char* end = nullptr;
    errno = 0;
    float v = std::strtof(tok.c_str(), &end);
    if (end != tok.c_str() + tok.size()) {
      pos_ = b;
      fail(fmt::format("invalid number '{}'", tok));
    }
    return v;
  }
  int reg() {
    skip_ws();
    if (pos_ >= s_.size() || s_[pos_] != 'r') fail("expected a register like r3");
    ++pos_;
    int64_t v = integer();
    if (v < 0 || v > 255) fail("register index out of range [0, 255]");
    return int(v);
  }
  Space space() {
    size_t b = pos_;
    auto w = word();
    if (w == "hbm") return Space::hbm;
    if (w == "vmem") return Space::vmem;
    pos_ = b;
    fail(fmt::format("unknown memory space '{}' (hbm or vmem)", w));
  }
  // expr := term (('+'|'-') term)*,  term := INT | rN | rN*INT | INT*rN
  Addr addr() {
    expect('[');
    Addr a;
    int nterms = 0;
    bool neg = false;
    for (;;) {
      skip_ws();
      int64_t sign = neg ? -1 : 1;
      if (peek('r')) {
        int r = reg();
        int64_t scale = 1;
        if (peek('*')) {
          expect('*');
          scale = integer();
        }
        add_term(a, nterms, r, sign * scale);
      } else {
        int64_t v = integer();
        if (peek('*')) {
          expect('*');
          int r = reg();
          add_term(a, nterms, r, sign * v);
        } else {
          a.offset += sign * v;
        }
      }
      skip_ws();
      if (peek(']')) break;
      if (peek('+')) {
        ++pos_;
        neg = false;
      } else if (peek('-')) {
        ++pos_;
        neg = true;
      } else {
        fail("expected '+', '-' or ']' in address");
      }
    }
    expect(']');
    return a;
  }
  void add_term(Addr& a, int& n, int r, int64_t scale) {
    for (int i = 0; i < n; ++i)
      if (a.terms[i].reg == r) {
        a.terms[i].scale += scale;
        return;
      }
    if (n == 3) fail("an address may use at most 3 registers");
    a.terms[n].reg = int16_t(r);
    a.terms[n].scale = scale;
    ++n;
  }
  Operand operand(bool with_dtype) {
    Operand o;
    if (peek('#')) {
      ++pos_;
      o.kind = Operand::Kind::imm;
      o.imm = real();
      return o;
    }
    o.kind = Operand::Kind::mem;
    o.space = space();
    o.addr = addr();
    if (!with_dtype) return o;
    expect(':');
    size_t b = pos_;
    auto w = word();
    auto t = parse_dtype(w);
    if (!t) {
      pos_ = b;
      fail(fmt::format("unknown dtype '{}' (f32, bf16, i32, i8)", w));
    }
    o.dtype = *t;
    if (pos_ < s_.size() && s_[pos_] == '{') {
      ++pos_;
      o.row_stride = integer();
      expect(',');
      o.col_stride = integer();
      expect('}');
    }
    return o;
  }
  template <size_t N>
  std::array<int64_t, N> list(size_t min_n) {
    expect('[');
    std::vector<int64_t> v;
    if (!peek(']')) {
      v.push_back(integer());
      while (peek(',')) {
        ++pos_;
        v.push_back(integer());
      }
    }
    expect(']');
    if (v.size() < min_n || v.size() > N) fail(fmt::format("expected {} to {} values", min_n, N));
    std::array<int64_t, N> out;
    out.fill(1);
    std::copy(v.begin(), v.end(), out.begin() + (N - v.size()));
    return out;
  }
  size_t pos() const { return pos_; }
  void set_pos(size_t p) { pos_ = p; }

 private:
  std::string_view s_;
  size_t line_;
  size_t pos_ = 0;
};

void parse_field(LineParser& lp, Instr& in, const FieldDef& f) {
  switch (f.kind) {
    case FK::reg: in.reg = lp.reg(); break;
    case FK::reg_a: in.reg_a = lp.reg(); break;
    case FK::imm: in.imm = lp.integer(); break;
    case FK::n: in.imm = lp.integer(); break;
    case FK::sem: {
      int64_t v = lp.integer();
      if (v < -1 || v > 1 << 20) lp.fail("semaphore out of range");
      in.sem = int32_t(v);
      break;
    }
    case FK::q:
    case FK::mxu: {
      int64_t v = lp.integer();
      if (v < 0 || v > 1 << 20) lp.fail("unit index out of range");
      in.unit = int32_t(v);
      break;
    }
    case FK::dst_addr: in.dst = lp.operand(false); break;
    case FK::src_addr: in.a = lp.operand(false); break;
    case FK::shape3: in.dma_shape = lp.list<3>(1); break;
    case FK::dst_stride: in.dst_stride = lp.list<2>(2); break;
    case FK::src_stride: in.src_stride = lp.list<2>(2); break;
    case FK::dst: in.dst = lp.operand(true); break;
    case FK::a: in.a = lp.operand(true); break;
    case FK::b: in.b = lp.operand(true); break;
    case FK::c: in.c = lp.operand(true); break;
    case FK::rows: in.rows = lp.integer(); break;
    case FK::k: in.k = lp.integer(); break;
    case FK::cols: in.cols = lp.integer(); break;
    case FK::mode: {
      size_t b = lp.pos();
      auto w = lp.word();
      auto m = parse_mxu_mode(w);
      if (!m) {
        lp.set_pos(b);
        lp.fail(fmt::format("unknown mxu mode '{}' (bf16, f32, i8, bf16x3)", w));
      }
      in.mode = *m;
      break;
    }
    case FK::acc: {
      int64_t v = lp.integer();
      if (v != 0 && v != 1) lp.fail("acc must be 0 or 1");
      in.acc = v == 1;
      break;
    }
    case FK::shape2: {
      auto s = lp.list<2>(2);
      in.rows = s[0];
      in.cols = s[1];
      break;
    }
    case FK::axis: in.axis = int32_t(lp.integer()); break;
    case FK::value: in.fimm = lp.real(); break;
  }
}

}  // namespace

std::string format_addr(const Addr& a) {
  std::string s;
  bool any = false;
  if (a.offset != 0) {
    s = fmt::format("{}", a.offset);
    any = true;
  }
  for (const auto& t : a.terms) {
    if (t.reg < 0) continue;
    if (any) s += '+';
    s += fmt::format("r{}*{}", t.reg, t.scale);
    any = true;
  }
  return any ? s : std::string(1, '0');
}

std::string format_instr(const Instr& in) {
  const OpInfo& info = op_info(in.op);
  std::string s(info.name);
  for (const auto& f : fields_of(info.format)) print_field(s, in, f);
  return s;
}

std::string to_text(const Program& p) {
  if (p.megacore())
    throw SimError(fmt::format("program '{}' is a megacore program ({} parts): it has no text form; print each part "
                               "(Program::cores) instead", p.name, p.cores.size()));
  std::string out;
  if (!p.name.empty()) out += fmt::format("; program {}\n", p.name);
  int depth = 0;
  for (const auto& in : p.code) {
    if (in.op == Op::endloop && depth > 0) --depth;
    out.append(size_t(depth) * 2, ' ');
    out += format_instr(in);
    out += '\n';
    if (in.op == Op::loop || in.op == Op::loopr) ++depth;
  }
  return out;
}

Program parse_program(std::string_view text, std::string name) {
  Program p;
  p.name = std::move(name);
  std::vector<size_t> line_of;
  size_t line_no = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    std::string_view line = text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    ++line_no;
    size_t semi = line.find(';');
    if (semi != std::string_view::npos) {
      // "; program NAME" on the first line names the program (to_text writes it).
      std::string_view comment = line.substr(semi);
      if (line_no == 1 && p.name.empty() && comment.substr(0, 10) == "; program ") p.name = std::string(comment.substr(10));
      line = line.substr(0, semi);
    }
    LineParser lp(line, line_no);
    if (!lp.at_end()) {
      size_t op_pos = lp.pos();
      auto opname = lp.word();
      auto op = op_from_name(opname);
      if (!op) {
        lp.set_pos(op_pos);
        lp.fail(fmt::format("unknown opcode '{}'", opname));
      }
      Instr in;
      in.op = *op;
      in.imm = op_info(*op).format == Format::sem ? 1 : 0;
      const auto& fields = fields_of(op_info(*op).format);
      std::set<std::string> seen;
      while (!lp.at_end()) {
        size_t kpos = lp.pos();
        std::string key(lp.word());
        const FieldDef* def = nullptr;
        for (const auto& f : fields)
          if (key == f.key) def = &f;
        if (!def) {
          lp.set_pos(kpos);
          lp.fail(fmt::format("'{}' has no field '{}'", opname, key));
        }
        if (!seen.insert(key).second) {
          lp.set_pos(kpos);
          lp.fail(fmt::format("field '{}' given twice", key));
        }
        lp.expect('=');
        parse_field(lp, in, *def);
      }
      for (const auto& f : fields)
        if (f.required && !seen.count(f.key)) lp.fail(fmt::format("'{}' needs field '{}'", opname, f.key));
      p.code.push_back(in);
      line_of.push_back(line_no);
    }
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  try {
    p.finalize();
  } catch (const SimError& e) {
    if (e.instr_index() >= 0 && size_t(e.instr_index()) < line_of.size())
      throw SimError(fmt::format("line {}:1: {}", line_of[size_t(e.instr_index())], e.what()), e.instr_index());
    throw;
  }
  return p;
}

}  // namespace tpu::sim
