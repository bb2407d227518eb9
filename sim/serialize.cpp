#include "sim/serialize.h"

#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/error.h"
#include "sim/fields.h"
#include "sim/json_int.h"
#include "sim/json_text.h"

namespace tpu::sim {
namespace {

using nlohmann::json;
using namespace detail;

json float_json(float v) {
  if (std::isfinite(v)) return double(v);
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}

json addr_json(const Addr& a) {
  json terms = json::array();
  for (const auto& t : a.terms)
    if (t.reg >= 0) terms.push_back(json::array({t.reg, t.scale}));
  return {{"offset", a.offset}, {"terms", terms}};
}

json operand_json(const Operand& o, bool with_dtype) {
  if (o.kind == Operand::Kind::imm) return {{"imm", float_json(o.imm)}};
  json j = addr_json(o.addr);
  j["space"] = std::string(space_name(o.space));
  if (with_dtype) {
    j["dtype"] = std::string(dtype_name(o.dtype));
    j["strides"] = json::array({o.row_stride, o.col_stride});
  }
  return j;
}

struct Ctx {
  size_t index;
  std::string key;
  [[noreturn]] void fail(const std::string& why) const {
    throw SimError(fmt::format("program JSON: instruction #{} field '{}': {}", index, key, why), long(index));
  }
  int64_t integer(const json& v) const {
    if (!v.is_number_integer()) fail("expected an integer");
    const std::optional<int64_t> x = tpu::detail::json_int(v);
    if (!x) fail("integer out of range");
    return *x;
  }
  float real(const json& v) const {
    if (v.is_number()) {
      const double d = v.get<double>();
      if (std::fabs(d) > double(std::numeric_limits<float>::max())) fail("number out of the f32 range");
      return float(d);
    }
    if (v.is_string()) {
      auto s = v.get<std::string>();
      if (s == "nan") return NAN;
      if (s == "inf") return INFINITY;
      if (s == "-inf") return -INFINITY;
    }
    fail("expected a number");
  }
  template <size_t N>
  std::array<int64_t, N> list(const json& v) const {
    if (!v.is_array() || v.size() < 1 || v.size() > N) fail(fmt::format("expected an array of 1 to {} integers", N));
    std::array<int64_t, N> out;
    out.fill(1);
    for (size_t i = 0; i < v.size(); ++i) out[N - v.size() + i] = integer(v[i]);
    return out;
  }
  Operand operand(const json& v, bool with_dtype) const {
    Operand o;
    if (!v.is_object()) fail("expected an operand object");
    if (v.contains("imm")) {
      o.kind = Operand::Kind::imm;
      o.imm = real(v["imm"]);
      return o;
    }
    o.kind = Operand::Kind::mem;
    if (!v.contains("space") || !v["space"].is_string()) fail("operand needs a 'space'");
    auto sp = v["space"].get<std::string>();
    if (sp == "hbm") o.space = Space::hbm;
    else if (sp == "vmem") o.space = Space::vmem;
    else fail("space must be hbm or vmem");
    if (v.contains("offset")) o.addr.offset = integer(v["offset"]);
    if (v.contains("terms")) {
      const json& t = v["terms"];
      if (!t.is_array() || t.size() > 3) fail("terms must be an array of at most 3 [reg, scale] pairs");
      for (size_t i = 0; i < t.size(); ++i) {
        if (!t[i].is_array() || t[i].size() != 2) fail("terms must be [reg, scale] pairs");
        int64_t r = integer(t[i][0]);
        if (r < 0 || r > 255) fail("register out of range");
        o.addr.terms[i].reg = int16_t(r);
        o.addr.terms[i].scale = integer(t[i][1]);
      }
    }
    if (with_dtype) {
      if (!v.contains("dtype") || !v["dtype"].is_string()) fail("operand needs a 'dtype'");
      auto t = parse_dtype(v["dtype"].get<std::string>());
      if (!t) fail("unknown dtype");
      o.dtype = *t;
      if (v.contains("strides")) {
        auto s = list<2>(v["strides"]);
        o.row_stride = s[0];
        o.col_stride = s[1];
      }
    }
    return o;
  }
};

}  // namespace

json program_to_json(const Program& p) {
  if (p.megacore())
    throw SimError(fmt::format("program '{}' is a megacore program ({} parts): it has no JSON form; serialize each "
                               "part (Program::cores) instead", p.name, p.cores.size()));
  json code = json::array();
  for (const auto& in : p.code) {
    json j;
    j["op"] = std::string(op_info(in.op).name);
    for (const auto& f : fields_of(op_info(in.op).format)) {
      const char* k = f.key;
      switch (f.kind) {
        case FK::reg: j[k] = in.reg; break;
        case FK::reg_a: j[k] = in.reg_a; break;
        case FK::imm: case FK::n: j[k] = in.imm; break;
        case FK::sem: j[k] = in.sem; break;
        case FK::q: case FK::mxu: j[k] = in.unit; break;
        case FK::dst_addr: j[k] = operand_json(in.dst, false); break;
        case FK::src_addr: j[k] = operand_json(in.a, false); break;
        case FK::shape3: j[k] = in.dma_shape; break;
        case FK::dst_stride: j[k] = in.dst_stride; break;
        case FK::src_stride: j[k] = in.src_stride; break;
        case FK::dst: j[k] = operand_json(in.dst, true); break;
        case FK::a: j[k] = operand_json(in.a, true); break;
        case FK::b: j[k] = operand_json(in.b, true); break;
        case FK::c: j[k] = operand_json(in.c, true); break;
        case FK::rows: j[k] = in.rows; break;
        case FK::k: j[k] = in.k; break;
        case FK::cols: j[k] = in.cols; break;
        case FK::mode: j[k] = std::string(mxu_mode_name(in.mode)); break;
        case FK::acc: j[k] = in.acc; break;
        case FK::shape2: j[k] = json::array({in.rows, in.cols}); break;
        case FK::axis: j[k] = in.axis; break;
        case FK::value: j[k] = float_json(in.fimm); break;
      }
    }
    code.push_back(std::move(j));
  }
  return {{"format", "tpusim-program"}, {"version", 1}, {"name", p.name}, {"code", code}};
}

static Program program_from_json_checked(const json& j);

Program program_from_json(const json& j) {
  try {
    return program_from_json_checked(j);
  } catch (const json::exception& e) {  // a backstop: the checks above should leave none
    throw SimError(fmt::format("program JSON: malformed value: {}", e.what()));
  }
}

static Program program_from_json_checked(const json& j) {
  if (!j.is_object() || !j.contains("format") || !j["format"].is_string() ||
      j["format"].get<std::string>() != "tpusim-program")
    throw SimError("program JSON: expected an object with \"format\": \"tpusim-program\"");
  if (!j.contains("version") || tpu::detail::json_int(j["version"]) != std::optional<int64_t>(1))
    throw SimError(fmt::format("program JSON: field 'version' must be the integer 1, got {}",
                               j.contains("version") ? j["version"].dump() : "nothing"));
  if (!j.contains("code") || !j["code"].is_array()) throw SimError("program JSON: missing array 'code'");
  Program p;
  if (j.contains("name") && j["name"].is_string()) p.name = j["name"].get<std::string>();
  const json& code = j["code"];
  for (size_t i = 0; i < code.size(); ++i) {
    const json& ji = code[i];
    Ctx ctx{i, "op"};
    if (!ji.is_object() || !ji.contains("op") || !ji["op"].is_string()) ctx.fail("missing 'op'");
    auto op = op_from_name(ji["op"].get<std::string>());
    if (!op) ctx.fail(fmt::format("unknown opcode '{}'", ji["op"].get<std::string>()));
    Instr in;
    in.op = *op;
    in.imm = op_info(*op).format == Format::sem ? 1 : 0;
    const auto& fields = fields_of(op_info(*op).format);
    for (auto it = ji.begin(); it != ji.end(); ++it) {
      if (it.key() == "op") continue;
      ctx.key = it.key();
      const FieldDef* def = nullptr;
      for (const auto& f : fields)
        if (it.key() == f.key) def = &f;
      if (!def) ctx.fail("no such field for this opcode");
      const json& v = it.value();
      auto small = [&](int64_t lo, int64_t hi) {
        int64_t x = ctx.integer(v);
        if (x < lo || x > hi) ctx.fail("out of range");
        return int32_t(x);
      };
      switch (def->kind) {
        case FK::reg: in.reg = small(0, 255); break;
        case FK::reg_a: in.reg_a = small(0, 255); break;
        case FK::imm: case FK::n: in.imm = ctx.integer(v); break;
        case FK::sem: in.sem = small(-1, 1 << 20); break;
        case FK::q: case FK::mxu: in.unit = small(0, 1 << 20); break;
        case FK::dst_addr: in.dst = ctx.operand(v, false); break;
        case FK::src_addr: in.a = ctx.operand(v, false); break;
        case FK::shape3: in.dma_shape = ctx.list<3>(v); break;
        case FK::dst_stride: in.dst_stride = ctx.list<2>(v); break;
        case FK::src_stride: in.src_stride = ctx.list<2>(v); break;
        case FK::dst: in.dst = ctx.operand(v, true); break;
        case FK::a: in.a = ctx.operand(v, true); break;
        case FK::b: in.b = ctx.operand(v, true); break;
        case FK::c: in.c = ctx.operand(v, true); break;
        case FK::rows: in.rows = ctx.integer(v); break;
        case FK::k: in.k = ctx.integer(v); break;
        case FK::cols: in.cols = ctx.integer(v); break;
        case FK::mode: {
          auto m = v.is_string() ? parse_mxu_mode(v.get<std::string>()) : std::nullopt;
          if (!m) ctx.fail("mode must be bf16, f32, i8 or bf16x3");
          in.mode = *m;
          break;
        }
        case FK::acc:
          if (!v.is_boolean()) ctx.fail("expected true or false");
          in.acc = v.get<bool>();
          break;
        case FK::shape2: {
          auto s = ctx.list<2>(v);
          in.rows = s[0];
          in.cols = s[1];
          break;
        }
        case FK::axis: in.axis = small(0, 1); break;
        case FK::value: in.fimm = ctx.real(v); break;
      }
    }
    for (const auto& f : fields)
      if (f.required && !ji.contains(f.key)) {
        ctx.key = f.key;
        ctx.fail("missing required field");
      }
    p.code.push_back(in);
  }
  p.finalize();
  return p;
}

std::string program_to_json_text(const Program& p, int indent) { return program_to_json(p).dump(indent); }

Program program_from_json_text(const std::string& text) {
  return program_from_json(parse_json_text(text, "program JSON"));
}

}  // namespace tpu::sim
