// StableHLO export: the writer of generic-form ops, the module around them, elementwise ops and
// views; composite ops are in stablehlo_ops.cpp. See graph/stablehlo.h.
#include "graph/stablehlo.h"

#include <cmath>
#include <cstring>
#include <algorithm>
#include <map>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "graph/stablehlo_writer.h"
#include "graph/tracer.h"
#include "tpucore/core/error.h"
#include "tpucore/ops.h"

namespace tpu::graph::shlo {

std::string Writer::elem_type(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::i8: return "i8";
    case DType::u8: return "ui8";
    case DType::boolean: return "i1";
    case DType::f8e4m3: return "f8E4M3FN";
    case DType::f8e5m2: return "f8E5M2";
  }
  return "?";
}

std::string Writer::type(const Shape& s, DType t) {
  std::string r = "tensor<";
  for (int i = 0; i < s.ndim(); ++i) r += std::to_string(s[i]) + "x";
  return r + elem_type(t) + ">";
}

std::string Writer::i64s(const std::vector<int64_t>& v) const {
  if (opt_.syntax == StableHloSyntax::mlir14)
    return fmt::format("dense<[{}]> : tensor<{}xi64>", fmt::join(v, ", "), v.size());
  return v.empty() ? std::string("array<i64>") : fmt::format("array<i64: {}>", fmt::join(v, ", "));
}

std::string Writer::compare_dir(const char* dir) const {
  return opt_.syntax == StableHloSyntax::mlir14 ? fmt::format("#stablehlo<\"comparison_direction {}\">", dir)
                                                : fmt::format("#stablehlo<comparison_direction {}>", dir);
}

Val Writer::op(const std::string& name, const std::vector<Val>& ins, const std::string& attrs, const Shape& s, DType t) {
  Val r{fresh(), s, t};
  std::vector<std::string> names, types;
  for (const Val& v : ins) {
    names.push_back(v.name);
    types.push_back(type(v));
  }
  body_ += fmt::format("    {} = \"stablehlo.{}\"({}){} : ({}) -> {}\n", r.name, name, fmt::join(names, ", "),
                       attrs.empty() ? "" : " {" + attrs + "}", fmt::join(types, ", "), type(r));
  return r;
}

namespace {
// An MLIR string literal: quotes, backslashes and non-printable bytes escaped.
std::string mlir_string(const std::string& s) {
  std::string r = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') r += fmt::format("\\{}", char(c));
    else if (c < 0x20 || c >= 0x7f) r += fmt::format("\\{:02X}", unsigned(c));
    else r += char(c);
  }
  return r + "\"";
}
}  // namespace

std::vector<Val> Writer::custom_call(const std::string& target, const std::vector<Val>& ins,
                                     const std::string& backend_config, const std::string& extra_attrs,
                                     const std::vector<ValueMeta>& outs) {
  const std::string base = fresh();
  std::vector<Val> res;
  std::vector<std::string> names, in_types, out_types;
  for (const Val& v : ins) {
    names.push_back(v.name);
    in_types.push_back(type(v));
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    res.push_back(Val{outs.size() == 1 ? base : fmt::format("{}#{}", base, i), outs[i].shape, outs[i].dtype});
    out_types.push_back(type(res.back()));
  }
  const std::string attrs =
      fmt::format("api_version = 2 : i32, backend_config = {}, call_target_name = {}, has_side_effect = false{}{}",
                  mlir_string(backend_config), mlir_string(target), extra_attrs.empty() ? "" : ", ", extra_attrs);
  const std::string result = outs.size() == 1 ? base : fmt::format("{}:{}", base, outs.size());
  const std::string rtype = outs.size() == 1 ? out_types[0] : fmt::format("({})", fmt::join(out_types, ", "));
  body_ += fmt::format("    {} = \"stablehlo.custom_call\"({}) {{{}}} : ({}) -> {}\n", result, fmt::join(names, ", "), attrs,
                       fmt::join(in_types, ", "), rtype);
  return res;
}

Val Writer::ew(const std::string& name, const std::vector<Val>& ins, DType t) { return op(name, ins, "", ins.at(0).shape, t); }

namespace {
// The bytes of `n` elements of dtype t as an MLIR hex blob.
std::string hex_blob(const uint8_t* p, size_t bytes) {
  std::string r = "\"0x";
  for (size_t i = 0; i < bytes; ++i) r += fmt::format("{:02X}", p[i]);
  return r + "\"";
}
}  // namespace

Val Writer::constant(const Tensor& t0) {
  const Tensor t = t0.to("cpu").contiguous();
  std::string lit;
  if (t.dtype() == DType::boolean) {
    const auto* b = static_cast<const uint8_t*>(t.raw_data());
    std::vector<std::string> e;
    for (int64_t i = 0; i < t.numel(); ++i) e.push_back(b[i] ? "true" : "false");
    lit = t.dim() == 0 ? e.at(0) : fmt::format("[{}]", fmt::join(e, ", "));
    if (t.dim() > 1) {  // nested lists for rank > 1: write a splat-free flat list through reshape
      Val flat = constant(t.reshape({t.numel()}));
      return reshape(flat, t.shape());
    }
  } else {
    lit = hex_blob(static_cast<const uint8_t*>(t.raw_data()), size_t(t.numel()) * dtype_size(t.dtype()));
  }
  return op("constant", {}, fmt::format("value = dense<{}> : {}", lit, type(t.shape(), t.dtype())), t.shape(),
            t.dtype());
}

Val Writer::scalar(double x, DType t, const Shape& s) {
  // (int64 extremes: 2^63 as a double is out of int64's range; clamp instead of converting)
  const int64_t xi = x >= 9.2233720368547758e18 ? INT64_MAX : x <= -9.2233720368547758e18 ? INT64_MIN : int64_t(x);
  Tensor c = full({}, t == DType::boolean ? Scalar(x != 0) : is_floating(t) ? Scalar(x) : Scalar(xi),
                  TensorOptions(t));
  Val v = constant(c);
  return s.ndim() == 0 ? v : broadcast_in_dim(v, s, {});
}

Val Writer::convert(const Val& v, DType t) {
  if (v.dtype == t) return v;
  if (t == DType::boolean) return compare(v, scalar(0, v.dtype, v.shape), "NE");
  return op("convert", {v}, "", v.shape, t);
}

Val Writer::reshape(const Val& v, const Shape& s) {
  if (v.shape == s) return v;
  return op("reshape", {v}, "", s, v.dtype);
}

Val Writer::transpose(const Val& v, const std::vector<int64_t>& perm) {
  Shape s = v.shape;
  bool id = true;
  for (size_t i = 0; i < perm.size(); ++i) {
    s[int(i)] = v.shape[int(perm[i])];
    id &= perm[i] == int64_t(i);
  }
  if (id) return v;
  return op("transpose", {v}, "permutation = " + i64s(perm), s, v.dtype);
}

Val Writer::broadcast_in_dim(const Val& v, const Shape& s, const std::vector<int64_t>& dims) {
  return op("broadcast_in_dim", {v}, "broadcast_dimensions = " + i64s(dims), s, v.dtype);
}

Val Writer::broadcast_to(const Val& v, const Shape& s) {
  if (v.shape == s) return v;
  const int off = s.ndim() - v.shape.ndim();
  TPU_CHECK(off >= 0, "export_stablehlo: cannot broadcast {} to {}", v.shape.str(), s.str());
  std::vector<int64_t> dims;
  for (int i = 0; i < v.shape.ndim(); ++i) dims.push_back(off + i);
  return broadcast_in_dim(v, s, dims);
}

Val Writer::slice(const Val& v, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
                  const std::vector<int64_t>& strides) {
  Shape s = v.shape;
  for (size_t i = 0; i < start.size(); ++i) s[int(i)] = (limit[i] - start[i] + strides[i] - 1) / strides[i];
  return op("slice", {v},
            fmt::format("start_indices = {}, limit_indices = {}, strides = {}", i64s(start), i64s(limit), i64s(strides)),
            s, v.dtype);
}

Val Writer::concatenate(const std::vector<Val>& ins, int64_t dim) {
  Shape s = ins.at(0).shape;
  int64_t n = 0;
  for (const Val& v : ins) n += v.shape[int(dim)];
  s[int(dim)] = n;
  return op("concatenate", ins, fmt::format("dimension = {} : i64", dim), s, ins[0].dtype);
}

Val Writer::compare(const Val& a, const Val& b, const char* dir) {
  return op("compare", {a, b}, "comparison_direction = " + compare_dir(dir), a.shape, DType::boolean);
}

Val Writer::select(const Val& c, const Val& a, const Val& b) { return op("select", {c, a, b}, "", a.shape, a.dtype); }

Val Writer::iota(const Shape& s, DType t, int64_t dim) {
  return op("iota", {}, fmt::format("iota_dimension = {} : i64", dim), s, t);
}

Val Writer::reduce(const Val& v, const std::vector<int64_t>& dims, const std::string& body, double init) {
  Val i = scalar(init, v.dtype, {});
  std::vector<int64_t> kept;
  for (int d = 0; d < v.shape.ndim(); ++d)
    if (std::find(dims.begin(), dims.end(), int64_t(d)) == dims.end()) kept.push_back(v.shape[d]);
  const Shape s(kept);
  Val r{fresh(), s, v.dtype};
  const std::string st = type({}, v.dtype);
  body_ += fmt::format("    {} = \"stablehlo.reduce\"({}, {}) ({{\n", r.name, v.name, i.name);
  body_ += fmt::format("    ^bb0({0}a: {1}, {0}b: {1}):\n", r.name, st);
  body_ += fmt::format("      {0}r = \"stablehlo.{1}\"({0}a, {0}b) : ({2}, {2}) -> {2}\n", r.name, body, st);
  body_ += fmt::format("      \"stablehlo.return\"({}r) : ({}) -> ()\n", r.name, st);
  body_ += fmt::format("    }}) {{dimensions = {}}} : ({}, {}) -> {}\n", i64s(dims), type(v), st, type(r));
  return r;
}

Val Writer::dot_general(const Val& a, const Val& b, const std::vector<int64_t>& lb, const std::vector<int64_t>& rb,
                        const std::vector<int64_t>& lc, const std::vector<int64_t>& rc, const Shape& s) {
  std::vector<std::string> parts;
  auto add = [&](const char* k, const std::vector<int64_t>& v) {
    if (!v.empty()) parts.push_back(fmt::format("{} = [{}]", k, fmt::join(v, ", ")));
  };
  add("lhs_batching_dimensions", lb);
  add("rhs_batching_dimensions", rb);
  add("lhs_contracting_dimensions", lc);
  add("rhs_contracting_dimensions", rc);
  return op("dot_general", {a, b}, fmt::format("dot_dimension_numbers = #stablehlo.dot<{}>", fmt::join(parts, ", ")), s,
            a.dtype);
}

namespace {

struct CustomCallTable {
  std::mutex mu;
  std::map<std::string, CustomCallParams, std::less<>> by_op;
};
CustomCallTable& custom_calls() {
  static CustomCallTable* t = new CustomCallTable();
  return *t;
}

// A node of a custom-call op as `stablehlo.custom_call`; false when its op is not one.
bool emit_custom_call(Writer& w, const Node& n, const std::vector<Val>& in, const std::vector<ValueMeta>& outs,
                      std::vector<Val>& res) {
  CustomCallParams params;
  {
    CustomCallTable& t = custom_calls();
    std::lock_guard<std::mutex> lk(t.mu);
    auto it = t.by_op.find(n.op->name);
    if (it == t.by_op.end()) return false;
    params = it->second;
  }
  std::string config;
  std::vector<std::string> dict;
  for (const auto& [k, v] : params(n.attrs)) {
    config += fmt::format("{}{}={}", config.empty() ? "" : ";", k, v);
    dict.push_back(fmt::format("{} = {} : i64", mlir_string(k), v));
  }
  const std::string extra = dict.empty() ? "" : fmt::format("tpucore.params = {{{}}}", fmt::join(dict, ", "));
  res = w.custom_call(n.op->name, in, config, extra, outs);
  return true;
}

const std::map<std::string, std::string>& simple_ops() {
  static const std::map<std::string, std::string> m = {
      {"add", "add"}, {"sub", "subtract"}, {"mul", "multiply"}, {"div", "divide"}, {"pow", "power"},
      {"maximum", "maximum"}, {"minimum", "minimum"}, {"fmod", "remainder"}, {"neg", "negate"}, {"abs", "abs"},
      {"sign", "sign"}, {"floor", "floor"}, {"ceil", "ceil"}, {"round", "round_nearest_even"}, {"exp", "exponential"},
      {"log", "log"}, {"tanh", "tanh"}, {"sigmoid", "logistic"}, {"log1p", "log_plus_one"},
      {"expm1", "exponential_minus_one"}, {"sqrt", "sqrt"}, {"rsqrt", "rsqrt"}, {"sin", "sine"}, {"cos", "cosine"},
      {"logical_and", "and"}, {"logical_or", "or"}, {"logical_xor", "xor"}, {"logical_not", "not"}};
  return m;
}

const std::map<std::string, const char*>& compare_ops() {
  static const std::map<std::string, const char*> m = {{"eq", "EQ"}, {"ne", "NE"}, {"lt", "LT"},
                                                       {"le", "LE"}, {"gt", "GT"}, {"ge", "GE"}};
  return m;
}

// Elementwise ops and views; false when the op is not one of them.
bool emit_simple(Writer& w, const Node& n, const std::vector<Val>& in, const ValueMeta& om, std::vector<Val>& res) {
  const std::string& name = n.op->name;
  const Shape& os = om.shape;
  auto bin = [&](size_t i) { return w.broadcast_to(in[i], os); };
  auto logical = [&](size_t i) { return w.convert(bin(i), DType::boolean); };
  if (auto it = simple_ops().find(name); it != simple_ops().end()) {
    std::vector<Val> a;
    const bool is_logical = name.rfind("logical_", 0) == 0;
    for (size_t i = 0; i < in.size(); ++i) a.push_back(is_logical ? logical(i) : bin(i));
    if ((name == "add" || name == "sub") && n.attrs.has("alpha")) {
      const double al = n.attrs.get_scalar("alpha").to_double();
      if (al != 1.0) a[1] = w.ew("multiply", {a[1], w.scalar(al, a[1].dtype, os)});
    }
    res.push_back(w.ew(it->second, a, om.dtype));
    return true;
  }
  if (auto it = compare_ops().find(name); it != compare_ops().end()) {
    res.push_back(w.compare(bin(0), bin(1), it->second));
    return true;
  }
  if (name == "relu") res.push_back(w.ew("maximum", {in[0], w.scalar(0, in[0].dtype, os)}));
  else if (name == "silu") res.push_back(w.ew("multiply", {in[0], w.ew("logistic", {in[0]})}));
  else if (name == "reciprocal") res.push_back(w.ew("divide", {w.scalar(1, in[0].dtype, os), in[0]}));
  else if (name == "erf") {  // the polynomial in f32 for half types
    const bool h = in[0].dtype == DType::f16 || in[0].dtype == DType::bf16;
    res.push_back(w.convert(erf_approx(w, h ? w.convert(in[0], DType::f32) : in[0]), in[0].dtype));
  }
  else if (name == "isnan") res.push_back(w.compare(in[0], in[0], "NE"));
  else if (name == "where") res.push_back(w.select(logical(0), bin(1), bin(2)));
  else if (name == "clamp") {
    Val x = in[0];
    if (n.attrs.has("min")) x = w.ew("maximum", {x, w.scalar(n.attrs.get_scalar("min").to_double(), x.dtype, os)});
    if (n.attrs.has("max")) x = w.ew("minimum", {x, w.scalar(n.attrs.get_scalar("max").to_double(), x.dtype, os)});
    res.push_back(x);
  } else if (name == "to_dtype") res.push_back(w.convert(in[0], om.dtype));
  else if (name == "contiguous") res.push_back(in[0]);
  else if (name == "view") res.push_back(w.reshape(in[0], os));
  else if (name == "permute") res.push_back(w.transpose(in[0], n.attrs.get_ints("dims")));
  else if (name == "expand") res.push_back(w.broadcast_to(in[0], os));
  else if (name == "slice" || name == "select") {
    const Shape& s = in[0].shape;
    const int nd = s.ndim();
    int64_t d = n.attrs.get_int("dim");
    if (d < 0) d += nd;
    std::vector<int64_t> st(size_t(nd), 0), lim = s.vec(), str(size_t(nd), 1);
    if (name == "slice") {
      int64_t a = n.attrs.get_int("start");
      if (a < 0) a += s[int(d)];
      a = std::clamp<int64_t>(a, 0, s[int(d)]);
      const int64_t step = n.attrs.get_int("step"), cnt = os[int(d)];
      st[size_t(d)] = a;
      lim[size_t(d)] = cnt == 0 ? a : a + (cnt - 1) * step + 1;
      str[size_t(d)] = step;
      res.push_back(w.slice(in[0], st, lim, str));
    } else {
      int64_t i = n.attrs.get_int("index");
      if (i < 0) i += s[int(d)];
      st[size_t(d)] = i;
      lim[size_t(d)] = i + 1;
      res.push_back(w.reshape(w.slice(in[0], st, lim, str), os));
    }
  } else if (name == "cat" || name == "stack") {
    int64_t d = n.attrs.get_int("dim");
    if (d < 0) d += os.ndim();
    std::vector<Val> parts;
    for (const Val& v : in) {
      if (name == "cat" && v.shape.numel() == 0 && v.shape.ndim() == 1) continue;  // torch-style empty [0]
      Shape ps = os;
      ps[int(d)] = name == "stack" ? 1 : v.shape[int(d)];
      parts.push_back(w.reshape(w.convert(v, om.dtype), ps));
    }
    res.push_back(w.concatenate(parts, d));
  } else if (name == "full") {
    res.push_back(w.scalar(n.attrs.get_scalar("value").to_double(), om.dtype, os));
  } else if (name == "arange" && (is_floating(om.dtype) || om.dtype == DType::i32 || om.dtype == DType::i64)) {
    // start + step * iota (narrow integer types are left out: the cpu saturates out-of-range values)
    const double start = n.attrs.get_float("start"), step = n.attrs.get_float("step");
    const bool integral = !is_floating(om.dtype) && start == std::floor(start) && step == std::floor(step);
    const DType ct = integral ? DType::i64 : DType::f32;
    Val v = w.ew("multiply", {w.iota(os, ct, 0), w.scalar(step, ct, os)});
    res.push_back(w.convert(w.ew("add", {v, w.scalar(start, ct, os)}), om.dtype));
  } else {
    return false;
  }
  return true;
}

}  // namespace
}  // namespace tpu::graph::shlo

namespace tpu {
namespace graph {

void register_custom_call(std::string_view op, CustomCallParams params) {
  TPU_CHECK(static_cast<bool>(params), "export_stablehlo: custom call '{}' registered without a parameter reader", op);
  shlo::CustomCallTable& t = shlo::custom_calls();
  std::lock_guard<std::mutex> lk(t.mu);
  t.by_op.insert_or_assign(std::string(op), std::move(params));
}

std::string to_stablehlo(const Graph& g, const std::vector<Tensor>& captured, const StableHloOptions& opt) {
  using namespace shlo;
  TPU_CHECK(captured.size() == g.inputs.size(), "export_stablehlo: {} captured slots for {} graph inputs",
            captured.size(), g.inputs.size());
  Writer w(opt);
  std::vector<std::optional<Val>> vals(g.values.size());
  std::vector<std::string> args;
  int nargs = 0;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const ValueMeta& m = g.meta(g.inputs[i]);
    if (captured[i].defined()) continue;
    Val v{"%arg" + std::to_string(nargs++), m.shape, m.dtype};
    args.push_back(v.name + ": " + Writer::type(v));
    vals[size_t(g.inputs[i])] = v;
  }
  for (size_t i = 0; i < g.inputs.size(); ++i)
    if (captured[i].defined()) vals[size_t(g.inputs[i])] = w.constant(captured[i]);
  // Live nodes: those the outputs depend on.
  std::vector<char> live(g.nodes.size(), 0), need(g.values.size(), 0);
  for (ValueId o : g.outputs) need[size_t(o)] = 1;
  for (size_t k = g.nodes.size(); k-- > 0;) {
    const Node& n = g.nodes[k];
    if (n.dead) continue;
    for (ValueId o : n.outputs) live[k] |= need[size_t(o)];
    if (live[k])
      for (ValueId i : n.inputs) need[size_t(i)] = 1;
  }
  std::vector<std::string> unmapped;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    if (!live[k]) continue;
    const Node& n = g.nodes[k];
    std::vector<Val> in;
    for (ValueId i : n.inputs) {
      const Value& v = g.value(i);
      if (!vals[size_t(i)] && v.kind == ValueKind::constant) vals[size_t(i)] = w.constant(v.constant);
      in.push_back(vals[size_t(i)].value_or(Val{"%missing", v.meta.shape, v.meta.dtype}));
    }
    std::vector<ValueMeta> outs;
    for (ValueId o : n.outputs) outs.push_back(g.meta(o));
    std::vector<Val> res;
    const bool ok = emit_custom_call(w, n, in, outs, res) || emit_simple(w, n, in, outs.at(0), res) || emit_index(w, n, in, outs.at(0), res) ||
                     emit_composite(w, n, in, outs, res);
    if (!ok || res.size() != n.outputs.size()) {
      unmapped.push_back(fmt::format("'{}' (node {})", n.op->name, k));
      for (size_t j = 0; j < n.outputs.size(); ++j)
        vals[size_t(n.outputs[j])] = Val{"%unmapped", outs[j].shape, outs[j].dtype};
      continue;
    }
    for (size_t j = 0; j < res.size(); ++j) {
      TPU_CHECK(res[j].shape == outs[j].shape && res[j].dtype == outs[j].dtype,
                "export_stablehlo: internal: op '{}' gave {} {} where the graph has {} {}", n.op->name,
                res[j].shape.str(), dtype_name(res[j].dtype), outs[j].shape.str(), dtype_name(outs[j].dtype));
      vals[size_t(n.outputs[j])] = res[j];
    }
  }
  if (!unmapped.empty())
    fail("export_stablehlo: {} op(s) have no StableHLO {} counterpart in this exporter: {}", unmapped.size(),
         kStableHloVersion, fmt::join(unmapped, ", "));
  std::vector<std::string> onames, otypes;
  for (ValueId o : g.outputs) {
    if (!vals[size_t(o)] && g.value(o).kind == ValueKind::constant) vals[size_t(o)] = w.constant(g.value(o).constant);
    const Val& v = *vals[size_t(o)];
    onames.push_back(v.name);
    otypes.push_back(Writer::type(v));
  }
  std::vector<std::string> atypes;
  for (const std::string& a : args) atypes.push_back(a.substr(a.find(": ") + 2));
  std::string r = fmt::format("// StableHLO {} module (generic form{}) exported by tpucore\n", kStableHloVersion,
                              opt.syntax == StableHloSyntax::mlir14 ? ", MLIR 14 attribute syntax" : "");
  r += "\"builtin.module\"() ({\n  \"func.func\"() ({\n";
  r += fmt::format("  ^bb0({}):\n", fmt::join(args, ", "));
  r += w.take();
  r += fmt::format("    \"func.return\"({}) : ({}) -> ()\n", fmt::join(onames, ", "), fmt::join(otypes, ", "));
  r += fmt::format("  }}) {{function_type = ({}) -> ({}), sym_name = \"{}\"}} : () -> ()\n}}) : () -> ()\n",
                   fmt::join(atypes, ", "), fmt::join(otypes, ", "), opt.function_name);
  return r;
}

}  // namespace graph

}  // namespace tpu
