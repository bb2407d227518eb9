// Runs a parsed StableHLO program with tpucore's ops (see shlo_program.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "device/plugins/pjrt_sim/shlo_index.h"
#include "device/plugins/pjrt_sim/shlo_program.h"
#include "tpucore/core/error.h"
#include "tpucore/kernel.h"
#include "tpucore/ops.h"

namespace tpu::pjrt_sim {
namespace {

// array<i64: 1, 2> / array<i64> / dense<[1, 2]> : tensor<2xi64> / dense<1> : tensor<1xi64>.
std::vector<int64_t> i64s(const Op& op, const std::string& name) {
  const std::string a = attr(op, name);
  if (a.rfind("array<i64", 0) == 0) return int_list(a.substr(9, a.find('>') - 9));
  if (a.rfind("dense<", 0) == 0) {
    std::vector<int64_t> v = int_list(a.substr(6, a.find('>') - 6));
    const size_t t = a.find("tensor<");
    const int64_t n = t == std::string::npos ? int64_t(v.size()) : std::stoll(a.substr(t + 7));
    if (v.size() == 1 && n > 1) v.assign(size_t(n), v[0]);  // splat
    return v;
  }
  bad(op, "missing attribute '" + name + "'");
}

std::vector<int64_t> bracket_list(const Op& op, const std::string& name) {
  const std::string a = attr(op, name);
  if (a.empty()) return {};
  return int_list(a.substr(0, a.find(']')));
}

int64_t int_attr(const Op& op, const std::string& name) {
  const std::string a = attr(op, name);
  if (a.empty()) bad(op, "missing attribute '" + name + "'");
  return std::stoll(a);
}

Tensor constant(const Op& op, Device dev) {
  const std::string a = attr(op, "value");
  if (a.rfind("dense<", 0) != 0) bad(op, "expected 'value = dense<...>'");
  const std::string lit = a.substr(6, a.find("> :") - 6);
  const TypeSpec& t = op.type;
  const int64_t n = t.shape.numel();
  Tensor r = empty(t.shape, TensorOptions(t.dtype));
  auto* out = static_cast<uint8_t*>(r.raw_data());
  const size_t es = dtype_size(t.dtype);
  if (lit.rfind("\"0x", 0) == 0) {
    const std::string hex = lit.substr(3, lit.size() - 4);
    const size_t bytes = hex.size() / 2;
    if (hex.size() % 2 != 0 || (bytes != size_t(n) * es && bytes != es)) bad(op, "hex constant of the wrong size");
    std::vector<uint8_t> b(bytes);
    for (size_t i = 0; i < bytes; ++i) b[i] = uint8_t(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
    for (int64_t i = 0; i < n; ++i) std::memcpy(out + size_t(i) * es, b.data() + (bytes == es ? 0 : size_t(i) * es), es);
  } else if (t.dtype == DType::boolean) {
    std::vector<uint8_t> v;
    for (size_t p = 0; (p = lit.find_first_of("tf", p)) != std::string::npos; ++p) v.push_back(lit[p] == 't');
    if (v.size() != 1 && int64_t(v.size()) != n) bad(op, "bool constant of the wrong size");
    for (int64_t i = 0; i < n; ++i) out[i] = v.size() == 1 ? v[0] : v[size_t(i)];
  } else {
    bad(op, "unsupported constant literal '" + lit.substr(0, 30) + "'");
  }
  return r.to(dev);
}

Tensor reduce(const Op& op, const Tensor& x, const Tensor& init) {
  const std::vector<int64_t> d = i64s(op, "dimensions");
  Dims dims(d.begin(), d.end());
  Tensor r;
  const std::string& b = op.body;
  if (x.dim() == 0 || d.empty()) r = x;
  else if (b == "add") r = sum(x, dims);
  else if (b == "multiply") r = prod(x, dims);
  else if (b == "maximum") r = amax(x, dims);
  else if (b == "minimum") r = amin(x, dims);
  else if (b == "and") r = all(x, dims);
  else if (b == "or") r = any(x, dims);
  else bad(op, "reduce with body '" + b + "' is not supported");
  // Fold the init value in (a no-op for the identities the exporter writes).
  if (b == "add") return add(r, init).to(op.type.dtype);
  if (b == "multiply") return mul(r, init).to(op.type.dtype);
  if (b == "maximum") return maximum(r, init);
  if (b == "minimum") return minimum(r, init);
  if (b == "and") return logical_and(r, init);
  return logical_or(r, init);
}

Tensor dot_general(const Op& op, const Tensor& a, const Tensor& b) {
  const auto lb = bracket_list(op, "lhs_batching_dimensions"), rb = bracket_list(op, "rhs_batching_dimensions");
  const auto lc = bracket_list(op, "lhs_contracting_dimensions"), rc = bracket_list(op, "rhs_contracting_dimensions");
  if (lb.size() != rb.size() || lc.size() != rc.size()) bad(op, "mismatched dimension numbers");
  auto rest = [](int nd, const std::vector<int64_t>& x, const std::vector<int64_t>& y) {
    std::vector<int64_t> r;
    for (int d = 0; d < nd; ++d)
      if (std::find(x.begin(), x.end(), d) == x.end() && std::find(y.begin(), y.end(), d) == y.end()) r.push_back(d);
    return r;
  };
  const auto lf = rest(a.dim(), lb, lc), rf = rest(b.dim(), rb, rc);
  auto prod_of = [](const Tensor& t, const std::vector<int64_t>& ds) {
    int64_t p = 1;
    for (int64_t d : ds) p *= t.shape()[int(d)];
    return p;
  };
  std::vector<int64_t> pa = lb, pb = rb;
  pa.insert(pa.end(), lf.begin(), lf.end());
  pa.insert(pa.end(), lc.begin(), lc.end());
  pb.insert(pb.end(), rc.begin(), rc.end());
  pb.insert(pb.end(), rf.begin(), rf.end());
  const int64_t B = prod_of(a, lb), M = prod_of(a, lf), K = prod_of(a, lc), N = prod_of(b, rf);
  if (K != prod_of(b, rc) || B != prod_of(b, rb)) bad(op, "contracting or batch sizes differ");
  Tensor a3 = a.permute(Shape(pa)).contiguous().reshape({B, M, K});
  Tensor b3 = b.permute(Shape(pb)).contiguous().reshape({B, K, N});
  return matmul(a3, b3).reshape(op.type.shape);
}

Tensor broadcast_in_dim(const Op& op, const Tensor& x) {
  const std::vector<int64_t> dims = i64s(op, "broadcast_dimensions");
  const Shape& os = op.type.shape;
  if (int(dims.size()) != x.dim()) bad(op, "broadcast_dimensions does not match the operand's rank");
  if (!std::is_sorted(dims.begin(), dims.end())) bad(op, "unsorted broadcast_dimensions are not supported");
  std::vector<int64_t> s(size_t(os.ndim()), 1);
  for (size_t i = 0; i < dims.size(); ++i) s[size_t(dims[i])] = x.shape()[int(i)];
  return x.reshape(Shape(s)).expand(os).contiguous();
}

Tensor run_op(const Op& op, const std::vector<Tensor>& in, Device dev) {
  const std::string& n = op.name;
  auto need = [&](size_t k) {
    if (in.size() != k) bad(op, fmt::format("expected {} operand(s), got {}", k, in.size()));
  };
  static const std::unordered_map<std::string, Tensor (*)(const Tensor&)> unary = {
      {"negate", [](const Tensor& x) { return neg(x); }},       {"abs", [](const Tensor& x) { return abs(x); }},
      {"sign", [](const Tensor& x) { return sign(x); }},        {"floor", [](const Tensor& x) { return floor(x); }},
      {"ceil", [](const Tensor& x) { return ceil(x); }},        {"round_nearest_even", [](const Tensor& x) { return round(x); }},
      {"exponential", [](const Tensor& x) { return exp(x); }},  {"log", [](const Tensor& x) { return log(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},        {"logistic", [](const Tensor& x) { return sigmoid(x); }},
      {"log_plus_one", [](const Tensor& x) { return log1p(x); }}, {"exponential_minus_one", [](const Tensor& x) { return expm1(x); }},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }},        {"rsqrt", [](const Tensor& x) { return rsqrt(x); }},
      {"sine", [](const Tensor& x) { return sin(x); }},         {"cosine", [](const Tensor& x) { return cos(x); }},
      {"not", [](const Tensor& x) { return logical_not(x); }}};
  static const std::unordered_map<std::string, Tensor (*)(const Tensor&, const Tensor&)> binary = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"subtract", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"multiply", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"divide", [](const Tensor& a, const Tensor& b) { return div(a, b); }},
      {"power", [](const Tensor& a, const Tensor& b) { return pow(a, b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
      {"remainder", [](const Tensor& a, const Tensor& b) { return fmod(a, b); }},
      {"and", [](const Tensor& a, const Tensor& b) { return logical_and(a, b); }},
      {"or", [](const Tensor& a, const Tensor& b) { return logical_or(a, b); }},
      {"xor", [](const Tensor& a, const Tensor& b) { return logical_xor(a, b); }}};
  if (auto it = unary.find(n); it != unary.end()) {
    need(1);
    return it->second(in[0]);
  }
  if (auto it = binary.find(n); it != binary.end()) {
    need(2);
    if (in[0].shape() != in[1].shape()) bad(op, "operands of different shapes");
    return it->second(in[0], in[1]);
  }
  if (n == "constant") return constant(op, dev);
  if (n == "compare") {
    need(2);
    const std::string d = attr(op, "comparison_direction");
    const size_t p = d.find("comparison_direction ");
    const std::string dir = p == std::string::npos ? "" : d.substr(p + 21, 2);
    if (dir == "EQ") return eq(in[0], in[1]);
    if (dir == "NE") return ne(in[0], in[1]);
    if (dir == "LT") return lt(in[0], in[1]);
    if (dir == "LE") return le(in[0], in[1]);
    if (dir == "GT") return gt(in[0], in[1]);
    if (dir == "GE") return ge(in[0], in[1]);
    bad(op, "unknown comparison direction");
  }
  if (n == "select") {
    need(3);
    return where(in[0], in[1], in[2]);
  }
  if (n == "convert") return in.at(0).to(op.type.dtype);
  if (n == "reshape") return in.at(0).contiguous().reshape(op.type.shape);
  if (n == "transpose") return in.at(0).permute(Shape(i64s(op, "permutation"))).contiguous();
  if (n == "broadcast_in_dim") return broadcast_in_dim(op, in.at(0));
  if (n == "slice") {
    const auto st = i64s(op, "start_indices"), lim = i64s(op, "limit_indices"), str = i64s(op, "strides");
    Tensor x = in.at(0);
    if (int(st.size()) != x.dim() || lim.size() != st.size() || str.size() != st.size()) bad(op, "bad slice attributes");
    for (int d = 0; d < x.dim(); ++d) x = x.slice(d, st[size_t(d)], lim[size_t(d)], str[size_t(d)]);
    return x.contiguous();
  }
  if (n == "concatenate") return cat(in, int_attr(op, "dimension"));
  if (n == "iota") {
    const int64_t d = int_attr(op, "iota_dimension");
    const Shape& s = op.type.shape;
    if (d < 0 || d >= s.ndim()) bad(op, "iota_dimension out of range");
    std::vector<int64_t> v(size_t(s.ndim()), 1);
    v[size_t(d)] = s[int(d)];
    return arange(s[int(d)], TensorOptions(op.type.dtype, dev)).reshape(Shape(v)).expand(s).contiguous();
  }
  if (n == "reduce") {
    need(2);
    return reduce(op, in[0], in[1]);
  }
  if (n == "dot_general") {
    need(2);
    return dot_general(op, in[0], in[1]);
  }
  if (n == "gather") {
    need(2);
    return run_gather(op, in[0], in[1]);
  }
  if (n == "scatter") {
    need(3);
    return run_scatter(op, in[0], in[1], in[2]);
  }
  bad(op, "this op is outside the subset the simulator plugin runs");
}

// The string literal at the start of an attribute value, escapes decoded.
std::string string_literal(const Op& op, const std::string& name) {
  const std::string a = attr(op, name);
  if (a.empty() || a[0] != '"') bad(op, "missing string attribute '" + name + "'");
  std::string r;
  for (size_t i = 1; i < a.size(); ++i) {
    const char c = a[i];
    if (c == '"') return r;
    if (c != '\\') {
      r += c;
      continue;
    }
    if (i + 1 >= a.size()) break;
    const char e = a[++i];
    if (e == '"' || e == '\\') r += e;
    else if (e == 'n') r += '\n';
    else if (e == 't') r += '\t';
    else if (i + 1 < a.size() && std::isxdigit(static_cast<unsigned char>(e)) &&
             std::isxdigit(static_cast<unsigned char>(a[i + 1]))) {
      r += char(std::stoi(a.substr(i, 2), nullptr, 16));
      ++i;
    } else {
      bad(op, "bad escape in attribute '" + name + "'");
    }
  }
  bad(op, "unterminated string attribute '" + name + "'");
}

// A custom_call: the kernel op it names, run on the inputs' device (a chip program on sim:N).
std::vector<Tensor> run_custom_call(const Op& op, const std::vector<Tensor>& in) {
  const CustomCall cc = custom_call_of(op);
  std::vector<Tensor> out = kernel::Op(cc.target).call(in, kernel::Params(cc.params.begin(), cc.params.end()));
  if (out.size() != size_t(op.num_results))
    bad(op, fmt::format("kernel '{}' gave {} result(s) where the module declares {}", cc.target, out.size(),
                        op.num_results));
  return out;
}

}  // namespace

CustomCall custom_call_of(const Op& op) {
  CustomCall cc;
  cc.target = string_literal(op, "call_target_name");
  const int inputs = kernel::kernel_op_num_inputs(cc.target);
  if (inputs < 0)
    bad(op, fmt::format("custom_call target '{}' is not a kernel registered in this process "
                        "(tpu::kernel::register_op); the plugin runs no other custom calls", cc.target));
  if (size_t(inputs) != op.operands.size())
    bad(op, fmt::format("custom_call '{}' has {} operand(s); the kernel takes {}", cc.target, op.operands.size(),
                        inputs));
  const std::string cfg = attr(op, "backend_config").empty() ? std::string() : string_literal(op, "backend_config");
  size_t pos = 0;
  while (pos < cfg.size()) {
    size_t end = cfg.find(';', pos);
    if (end == std::string::npos) end = cfg.size();
    const std::string item = cfg.substr(pos, end - pos);
    const size_t eq = item.find('=');
    size_t used = 0;
    int64_t v = 0;
    try {
      if (eq != std::string::npos) v = std::stoll(item.substr(eq + 1), &used);
    } catch (...) {
      used = 0;
    }
    if (eq == std::string::npos || eq == 0 || used == 0 || eq + 1 + used != item.size())
      bad(op, fmt::format("custom_call '{}': backend_config entry '{}' is not 'name=integer'", cc.target, item));
    cc.params[item.substr(0, eq)] = v;
    pos = end + 1;
  }
  return cc;
}

std::vector<Tensor> run_program(const Program& p, const std::vector<Tensor>& inputs, Device dev) {
  TPU_CHECK(inputs.size() == p.args.size(), "pjrt_tpucore_sim: the program takes {} argument(s), got {}", p.args.size(),
            inputs.size());
  std::unordered_map<std::string, Tensor> env;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TPU_CHECK(inputs[i].shape() == p.args[i].shape && inputs[i].dtype() == p.args[i].dtype,
              "pjrt_tpucore_sim: argument {} is {} {}, the program expects {} {}", i, dtype_name(inputs[i].dtype()),
              inputs[i].shape().str(), dtype_name(p.args[i].dtype), p.args[i].shape.str());
    env["%arg" + std::to_string(i)] = inputs[i];
  }
  for (const Op& op : p.ops) {
    std::vector<Tensor> in;
    for (const std::string& o : op.operands) {
      auto it = env.find(o);
      if (it == env.end()) bad(op, "operand " + o + " is not defined");
      in.push_back(it->second);
    }
    if (op.name == "func_return") return in;
    std::vector<Tensor> rs;
    if (op.name == "custom_call") rs = run_custom_call(op, in);
    else rs.push_back(run_op(op, in, dev));
    for (size_t i = 0; i < rs.size(); ++i) {
      const Tensor& r = rs[i];
      const TypeSpec& t = op.types.at(i);
      if (r.shape() != t.shape || r.dtype() != t.dtype)
        bad(op, fmt::format("computed {} {} where the module declares {} {}", dtype_name(r.dtype()), r.shape().str(),
                            dtype_name(t.dtype), t.shape.str()));
      env[rs.size() == 1 ? op.result : fmt::format("{}#{}", op.result, i)] = r;
    }
  }
  fail("pjrt_tpucore_sim: the program ended without func.return");
}

}  // namespace tpu::pjrt_sim
