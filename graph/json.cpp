// JSON form of a graph. Layout:
//   {"format": "tpucore.graph", "version": 1,
//    "values": [{"shape": [..], "dtype": "f32", "device": "cpu", "wrapped": false,
//                "kind": "input"|"constant"|"node", "data": [..] (constants)}],
//    "inputs": [ids], "outputs": [ids],
//    "nodes": [{"op": "add", "inputs": [ids], "outputs": [ids], "region": -1,
//               "attrs": [[name, type, value], ...]}],
//    "regions": [{"kind": .., "domain": [..], "tile_dim_limit": k, "nodes": [..],
//                 "inputs": [..], "outputs": [..]}],
//    "emulate_precision_casts": true (only when set)}
// Node outputs are listed by id; values of kind node take their producer from the node list.
#include <nlohmann/json.hpp>

#include "graph/passes/passes.h"
#include "graph/printer.h"
#include "sim/json_int.h"
#include "tpucore/ops.h"

namespace tpu::graph {
namespace {
using nlohmann::json;

json attr_json(const ops::Attr& a) {
  json v;
  std::string type;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) { type = "none"; v = nullptr; }
        else if constexpr (std::is_same_v<T, int64_t>) { type = "int"; v = x; }
        else if constexpr (std::is_same_v<T, double>) { type = "float"; v = x; }
        else if constexpr (std::is_same_v<T, bool>) { type = "bool"; v = x; }
        else if constexpr (std::is_same_v<T, DType>) { type = "dtype"; v = std::string(dtype_name(x)); }
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>) { type = "ints"; v = x; }
        else if constexpr (std::is_same_v<T, std::string>) { type = "string"; v = x; }
        else if constexpr (std::is_same_v<T, Device>) { type = "device"; v = x.str(); }
        else if constexpr (std::is_same_v<T, Scalar>) {
          if (x.is_floating()) { type = "scalar_float"; v = x.to_double(); }
          else if (x.is_bool()) { type = "scalar_bool"; v = x.to_bool(); }
          else { type = "scalar_int"; v = x.to_int(); }
        }
      },
      a.value);
  return json::array({a.name, type, v});
}

// Integer fields are read only from JSON integers that fit the target type (tpu::detail::json_int).
int64_t int_in(const json& j, const char* what, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
  TPU_CHECK(j.is_number_integer(), "graph JSON: {} must be an integer, got {}", what, j.dump());
  const std::optional<int64_t> v = tpu::detail::json_int(j, lo, hi);
  TPU_CHECK(v.has_value(), "graph JSON: {} is out of range: {} (must be in [{}, {}])", what, j.dump(), lo, hi);
  return *v;
}
int32_t int32_in(const json& j, const char* what) { return static_cast<int32_t>(int_in(j, what, INT32_MIN, INT32_MAX)); }
std::vector<int64_t> ints_in(const json& j, const char* what) {
  TPU_CHECK(j.is_array(), "graph JSON: {} must be an array of integers, got {}", what, j.dump());
  std::vector<int64_t> out;
  out.reserve(j.size());
  for (const json& x : j) out.push_back(int_in(x, what));
  return out;
}

// A shape: at most kMaxDims integers in [0, 2^40).
std::vector<int64_t> dims_in(const json& j, const char* what) {
  std::vector<int64_t> dims = ints_in(j, what);
  TPU_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), "graph JSON: {} has {} dims (max {})", what, dims.size(), kMaxDims);
  for (int64_t d : dims) TPU_CHECK(d >= 0 && d < (int64_t{1} << 40), "graph JSON: bad dimension {} in {}", d, what);
  return dims;
}

ops::AttrValue attr_from(const std::string& type, const json& v) {
  if (type == "none") return std::monostate{};
  if (type == "int") return int_in(v, "an int attribute");
  if (type == "float") return v.get<double>();
  if (type == "bool") return v.get<bool>();
  if (type == "dtype") return parse_dtype(v.get<std::string>());
  if (type == "ints") return ints_in(v, "an ints attribute");
  if (type == "string") return v.get<std::string>();
  if (type == "device") return Device(v.get<std::string>());
  if (type == "scalar_float") return Scalar(v.get<double>());
  if (type == "scalar_int") return Scalar(static_cast<long long>(int_in(v, "a scalar_int attribute")));
  if (type == "scalar_bool") return Scalar(v.get<bool>());
  fail("graph JSON: unknown attribute type '{}'", type);
}

const char* kind_name(ValueKind k) { return k == ValueKind::input ? "input" : k == ValueKind::constant ? "constant" : "node"; }
const char* region_name(RegionKind k) {
  return k == RegionKind::elementwise ? "elementwise" : k == RegionKind::rowwise ? "rowwise" : "matmul_epilogue";
}

ValueId id_in(const json& j, size_t n, const char* what) {
  const int64_t v = int_in(j, what);
  TPU_CHECK(v >= 0 && static_cast<size_t>(v) < n, "graph JSON: {} refers to value %{}, but there are {} values", what, v, n);
  return static_cast<ValueId>(v);
}

}  // namespace

std::string to_json(const Graph& g) {
  json j;
  j["format"] = "tpucore.graph";
  j["version"] = 1;
  json vals = json::array();
  for (const Value& v : g.values) {
    json jv{{"shape", v.meta.shape.vec()}, {"dtype", std::string(dtype_name(v.meta.dtype))}, {"device", v.meta.device.str()},
            {"wrapped", v.meta.wrapped}, {"kind", kind_name(v.kind)}};
    if (v.kind == ValueKind::constant) {
      std::vector<double> d;
      for (float x : v.constant.to_vector<float>()) d.push_back(x);
      if (is_integral(v.meta.dtype) || v.meta.dtype == DType::boolean) {
        d.clear();
        for (int32_t x : tpu::to(v.constant, DType::i32).to_vector<int32_t>()) d.push_back(x);
      }
      jv["data"] = d;
    }
    vals.push_back(std::move(jv));
  }
  j["values"] = std::move(vals);
  j["inputs"] = g.inputs;
  j["outputs"] = g.outputs;
  json nodes = json::array();
  for (const Node& n : g.nodes) {
    if (n.dead) continue;
    json attrs = json::array();
    for (const auto& a : n.attrs.items()) attrs.push_back(attr_json(a));
    nodes.push_back({{"op", n.op->name}, {"inputs", n.inputs}, {"outputs", n.outputs}, {"attrs", attrs}, {"region", n.region}});
  }
  j["nodes"] = std::move(nodes);
  json regions = json::array();
  for (const Region& r : g.regions)
    regions.push_back({{"kind", region_name(r.kind)}, {"domain", r.domain.vec()}, {"tile_dim_limit", r.tile_dim_limit},
                       {"nodes", r.nodes}, {"inputs", r.inputs}, {"outputs", r.outputs}});
  j["regions"] = std::move(regions);
  if (g.emulate_precision_casts) j["emulate_precision_casts"] = true;
  if (g.plan.valid)
    j["plan"] = {{"slot_bytes", g.plan.slot_bytes}, {"slot_of", g.plan.slot_of}, {"planned_peak_bytes", g.plan.planned_peak_bytes},
                 {"unplanned_bytes", g.plan.unplanned_bytes}};
  return j.dump();
}

Graph from_json(const std::string& text) {
  Graph g;
  try {
    json j = json::parse(text);
    TPU_CHECK(j.is_object() && j.value("format", "") == "tpucore.graph", "graph JSON: not a tpucore graph (missing format tag)");
    TPU_CHECK(int_in(j.at("version"), "version") == 1, "graph JSON: unsupported version {}", j.at("version").dump());
    const json& vals = j.at("values");
    TPU_CHECK(vals.is_array(), "graph JSON: 'values' must be an array");
    for (const json& jv : vals) {
      Value v;
      auto shape = dims_in(jv.at("shape"), "a shape");
      v.meta = {Shape(shape), parse_dtype(jv.at("dtype").get<std::string>()), Device(jv.at("device").get<std::string>()),
                jv.value("wrapped", false)};
      const std::string kind = jv.at("kind").get<std::string>();
      if (kind == "input") {
        v.kind = ValueKind::input;
      } else if (kind == "constant") {
        v.kind = ValueKind::constant;
        auto data = jv.at("data").get<std::vector<double>>();
        TPU_CHECK(static_cast<int64_t>(data.size()) == v.meta.shape.numel(), "graph JSON: constant has {} numbers for shape {}",
                  data.size(), v.meta.shape.str());
        TPU_CHECK(v.meta.device.is_cpu(), "graph JSON: constants must live on the cpu");
        Tensor c = from_vector(data, v.meta.shape);
        v.constant = tpu::to(c, v.meta.dtype).contiguous();
        v.constant.impl().wrapped_number = v.meta.wrapped;
      } else if (kind == "node") {
        v.kind = ValueKind::node;
        v.producer = -2;  // set from the node list
      } else {
        fail("graph JSON: unknown value kind '{}'", kind);
      }
      g.values.push_back(std::move(v));
    }
    const size_t nv = g.values.size();
    for (const json& i : j.at("inputs")) {
      ValueId v = id_in(i, nv, "inputs");
      TPU_CHECK(g.values[static_cast<size_t>(v)].kind == ValueKind::input, "graph JSON: input %{} is not of kind input", v);
      g.values[static_cast<size_t>(v)].producer = static_cast<int32_t>(g.inputs.size());
      g.inputs.push_back(v);
    }
    for (const json& jn : j.at("nodes")) {
      Node n;
      const std::string op = jn.at("op").get<std::string>();
      n.op = ops::find_op(op);
      TPU_CHECK(n.op != nullptr, "graph JSON: unknown op '{}'", op);
      for (const json& i : jn.at("inputs")) n.inputs.push_back(id_in(i, nv, "a node input"));
      const int idx = static_cast<int>(g.nodes.size());
      int k = 0;
      for (const json& o : jn.at("outputs")) {
        ValueId v = id_in(o, nv, "a node output");
        Value& val = g.values[static_cast<size_t>(v)];
        TPU_CHECK(val.kind == ValueKind::node && val.producer == -2, "graph JSON: value %{} is produced twice or is not a node value", v);
        val.producer = idx;
        val.out_index = k++;
        n.outputs.push_back(v);
      }
      for (const json& a : jn.at("attrs")) {
        TPU_CHECK(a.is_array() && a.size() == 3, "graph JSON: an attribute must be [name, type, value]");
        n.attrs.set(intern(a[0].get<std::string>()), attr_from(a[1].get<std::string>(), a[2]));
      }
      n.region = jn.contains("region") ? int32_in(jn.at("region"), "a node region") : -1;
      g.nodes.push_back(std::move(n));
    }
    for (size_t v = 0; v < nv; ++v)
      TPU_CHECK(g.values[v].kind != ValueKind::node || g.values[v].producer >= 0, "graph JSON: value %{} has no producer", v);
    for (const json& o : j.at("outputs")) g.outputs.push_back(id_in(o, nv, "outputs"));
    if (j.contains("regions")) {
      for (const json& jr : j.at("regions")) {
        Region r;
        const std::string kind = jr.at("kind").get<std::string>();
        r.kind = kind == "elementwise" ? RegionKind::elementwise : kind == "rowwise" ? RegionKind::rowwise : RegionKind::matmul_epilogue;
        TPU_CHECK(kind == "elementwise" || kind == "rowwise" || kind == "matmul_epilogue", "graph JSON: unknown region kind '{}'", kind);
        r.domain = Shape(dims_in(jr.at("domain"), "a region domain"));
        r.tile_dim_limit = int32_in(jr.at("tile_dim_limit"), "tile_dim_limit");
        TPU_CHECK(r.tile_dim_limit >= 0 && r.tile_dim_limit < std::max(1, r.domain.ndim()), "graph JSON: bad tile_dim_limit");
        for (const json& x : jr.at("nodes")) {
          int64_t ni = int_in(x, "a region node");
          TPU_CHECK(ni >= 0 && static_cast<size_t>(ni) < g.nodes.size(), "graph JSON: region refers to node {}", ni);
          r.nodes.push_back(static_cast<int32_t>(ni));
        }
        for (const json& x : jr.at("inputs")) r.inputs.push_back(id_in(x, nv, "a region input"));
        for (const json& x : jr.at("outputs")) r.outputs.push_back(id_in(x, nv, "a region output"));
        g.regions.push_back(std::move(r));
      }
    }
    if (j.contains("emulate_precision_casts")) {
      const json& e = j.at("emulate_precision_casts");
      TPU_CHECK(e.is_boolean(), "graph JSON: emulate_precision_casts must be a boolean, got {}", e.dump());
      g.emulate_precision_casts = e.get<bool>();
    }
    if (j.contains("plan")) {
      const json& p = j.at("plan");
      g.plan.slot_bytes = ints_in(p.at("slot_bytes"), "plan.slot_bytes");
      for (const json& x : p.at("slot_of")) g.plan.slot_of.push_back(int32_in(x, "plan.slot_of"));
      g.plan.planned_peak_bytes = int_in(p.at("planned_peak_bytes"), "plan.planned_peak_bytes");
      g.plan.unplanned_bytes = int_in(p.at("unplanned_bytes"), "plan.unplanned_bytes");
      TPU_CHECK(g.plan.slot_of.size() == nv, "graph JSON: the buffer plan covers {} values of {}", g.plan.slot_of.size(), nv);
      for (int32_t s : g.plan.slot_of)
        TPU_CHECK(s >= -1 && s < static_cast<int32_t>(g.plan.slot_bytes.size()), "graph JSON: bad buffer slot {}", s);
      for (size_t v = 0; v < nv; ++v)
        if (g.plan.slot_of[v] >= 0)
          TPU_CHECK(g.plan.slot_bytes[static_cast<size_t>(g.plan.slot_of[v])] >=
                        g.values[v].meta.shape.numel() * static_cast<int64_t>(dtype_size(g.values[v].meta.dtype)),
                    "graph JSON: buffer slot too small for value %{}", v);
      g.plan.valid = true;
    }
  } catch (const nlohmann::json::exception& e) {
    fail("graph JSON: malformed: {}", e.what());
  }
  verify(g, "loaded from JSON");
  return g;
}

}  // namespace tpu::graph
