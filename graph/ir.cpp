#include "graph/ir.h"

#include <cstring>
#include <mutex>
#include <unordered_set>

namespace tpu::graph {

ValueId Graph::add_input(const ValueMeta& m) {
  Value v;
  v.meta = m;
  v.kind = ValueKind::input;
  v.producer = static_cast<int32_t>(inputs.size());
  values.push_back(std::move(v));
  const auto id = static_cast<ValueId>(values.size() - 1);
  inputs.push_back(id);
  return id;
}

ValueId Graph::add_constant(Tensor t, bool wrapped) {
  // The tensor says so too: a folded cast of a wrapped number may still meet tensors of any
  // device when the graph runs.
  if (wrapped && t.defined()) t.impl().wrapped_number = true;
  Value v;
  v.meta = {t.shape(), t.dtype(), t.device(), wrapped};
  v.kind = ValueKind::constant;
  v.constant = std::move(t);
  values.push_back(std::move(v));
  return static_cast<ValueId>(values.size() - 1);
}

int Graph::add_node(const ops::OpDef& op, std::vector<ValueId> ins, ops::Attrs attrs,
                    const std::vector<ValueMeta>& metas) {
  Node n;
  n.op = &op;
  n.inputs = std::move(ins);
  n.attrs = std::move(attrs);
  const int idx = static_cast<int>(nodes.size());
  for (size_t i = 0; i < metas.size(); ++i) {
    Value v;
    v.meta = metas[i];
    v.kind = ValueKind::node;
    v.producer = idx;
    v.out_index = static_cast<int32_t>(i);
    values.push_back(std::move(v));
    n.outputs.push_back(static_cast<ValueId>(values.size() - 1));
  }
  nodes.push_back(std::move(n));
  return idx;
}

const Node* Graph::producer(ValueId v) const {
  const Value& val = values[static_cast<size_t>(v)];
  return val.kind == ValueKind::node ? &nodes[static_cast<size_t>(val.producer)] : nullptr;
}
Node* Graph::producer(ValueId v) {
  Value& val = values[static_cast<size_t>(v)];
  return val.kind == ValueKind::node ? &nodes[static_cast<size_t>(val.producer)] : nullptr;
}

void Graph::replace_uses(ValueId from, ValueId to) {
  for (Node& n : nodes)
    for (ValueId& i : n.inputs)
      if (i == from) i = to;
  for (ValueId& o : outputs)
    if (o == from) o = to;
}

std::vector<int32_t> Graph::use_counts() const {
  std::vector<int32_t> c(values.size(), 0);
  for (const Node& n : nodes) {
    if (n.dead) continue;
    for (ValueId i : n.inputs) ++c[static_cast<size_t>(i)];
  }
  for (ValueId o : outputs) ++c[static_cast<size_t>(o)];
  return c;
}

size_t Graph::num_live_nodes() const {
  size_t k = 0;
  for (const Node& n : nodes) k += !n.dead;
  return k;
}

void Graph::compact() {
  std::vector<int32_t> uses = use_counts();
  std::vector<ValueId> remap(values.size(), kNoValue);
  std::vector<Value> nv;
  std::vector<Node> nn;
  nv.reserve(values.size());
  // Inputs keep their positions.
  for (ValueId in : inputs) {
    remap[static_cast<size_t>(in)] = static_cast<ValueId>(nv.size());
    nv.push_back(values[static_cast<size_t>(in)]);
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const Value& v = values[i];
    if (v.kind == ValueKind::constant && uses[i] > 0) {
      remap[i] = static_cast<ValueId>(nv.size());
      nv.push_back(v);
    }
  }
  for (Node& n : nodes) {
    if (n.dead) continue;
    Node m = std::move(n);
    for (ValueId& i : m.inputs) i = remap[static_cast<size_t>(i)];
    const int idx = static_cast<int>(nn.size());
    for (size_t k = 0; k < m.outputs.size(); ++k) {
      ValueId old = m.outputs[k];
      Value v = values[static_cast<size_t>(old)];
      v.producer = idx;
      remap[static_cast<size_t>(old)] = static_cast<ValueId>(nv.size());
      nv.push_back(std::move(v));
      m.outputs[k] = remap[static_cast<size_t>(old)];
    }
    m.region = -1;
    nn.push_back(std::move(m));
  }
  for (ValueId& in : inputs) in = remap[static_cast<size_t>(in)];
  for (ValueId& o : outputs) o = remap[static_cast<size_t>(o)];
  values = std::move(nv);
  nodes = std::move(nn);
  regions.clear();
  plan = BufferPlan{};
}

// ---------------- attrs ----------------
bool attr_value_equal(const ops::AttrValue& a, const ops::AttrValue& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        const T& y = std::get<T>(b);
        if constexpr (std::is_same_v<T, std::monostate>) return true;
        else if constexpr (std::is_same_v<T, Scalar>) {
          if (x.kind() != y.kind()) return false;
          if (x.is_floating()) return std::memcmp(&x, &y, sizeof(Scalar)) == 0 || x.to_double() == y.to_double();
          return x.to_int() == y.to_int();
        } else if constexpr (std::is_same_v<T, double>) {
          return x == y || (x != x && y != y);
        } else {
          return x == y;
        }
      },
      a);
}

bool attrs_equal(const ops::Attrs& a, const ops::Attrs& b) {
  const auto& x = a.items();
  const auto& y = b.items();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::strcmp(x[i].name, y[i].name) != 0) return false;
    if (!attr_value_equal(x[i].value, y[i].value)) return false;
  }
  return true;
}

uint64_t hash_combine(uint64_t seed, uint64_t v) {
  v *= 0x9E3779B97F4A7C15ULL;
  v ^= v >> 29;
  seed ^= v + 0x632BE59BD9B4E019ULL + (seed << 6) + (seed >> 2);
  return seed;
}

static uint64_t hash_bytes(const void* p, size_t n, uint64_t h) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t x = 0xcbf29ce484222325ULL ^ h;
  for (size_t i = 0; i < n; ++i) x = (x ^ b[i]) * 0x100000001b3ULL;
  return x;
}

static uint64_t hash_double(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

uint64_t hash_attrs(const ops::Attrs& a, uint64_t seed) {
  for (const auto& it : a.items()) {
    seed = hash_bytes(it.name, std::strlen(it.name), seed);
    seed = hash_combine(seed, it.value.index());
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, int64_t>) seed = hash_combine(seed, static_cast<uint64_t>(x));
          else if constexpr (std::is_same_v<T, double>) seed = hash_combine(seed, hash_double(x));
          else if constexpr (std::is_same_v<T, bool>) seed = hash_combine(seed, x);
          else if constexpr (std::is_same_v<T, DType>) seed = hash_combine(seed, static_cast<uint64_t>(x));
          else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
            for (int64_t v : x) seed = hash_combine(seed, static_cast<uint64_t>(v));
          } else if constexpr (std::is_same_v<T, std::string>) seed = hash_bytes(x.data(), x.size(), seed);
          else if constexpr (std::is_same_v<T, Scalar>) {
            seed = hash_combine(seed, static_cast<uint64_t>(x.kind()));
            seed = hash_combine(seed, x.is_floating() ? hash_double(x.to_double()) : static_cast<uint64_t>(x.to_int()));
          } else if constexpr (std::is_same_v<T, Device>) {
            seed = hash_combine(seed, static_cast<uint64_t>(x.type) * 1315423911u + static_cast<uint64_t>(x.index));
          }
        },
        it.value);
  }
  return seed;
}

const char* intern(std::string_view s) {
  static std::mutex mu;
  static auto* set = new std::unordered_set<std::string>();  // leaked: names outlive everything
  std::lock_guard<std::mutex> lk(mu);
  return set->emplace(s).first->c_str();
}

static uint64_t hash_meta(const ValueMeta& m, uint64_t h) {
  h = hash_combine(h, static_cast<uint64_t>(m.shape.ndim()));
  for (int64_t d : m.shape) h = hash_combine(h, static_cast<uint64_t>(d));
  h = hash_combine(h, static_cast<uint64_t>(m.dtype));
  h = hash_combine(h, static_cast<uint64_t>(m.device.type) * 131 + static_cast<uint64_t>(m.device.index));
  return hash_combine(h, m.wrapped);
}

uint64_t structural_hash(const Graph& g) {
  uint64_t h = 0x5bd1e995;
  for (const Value& v : g.values) {
    h = hash_meta(v.meta, h);
    h = hash_combine(h, static_cast<uint64_t>(v.kind));
    if (v.kind == ValueKind::constant) {
      Tensor c = v.constant.contiguous();
      h = hash_bytes(c.raw_data(), c.nbytes(), h);
    }
  }
  for (const Node& n : g.nodes) {
    if (n.dead) continue;
    h = hash_bytes(n.op->name.data(), n.op->name.size(), h);
    for (ValueId i : n.inputs) h = hash_combine(h, static_cast<uint64_t>(i));
    for (ValueId o : n.outputs) h = hash_combine(h, static_cast<uint64_t>(o));
    h = hash_attrs(n.attrs, h);
  }
  h = hash_combine(h, g.emulate_precision_casts ? 0xe3a1c5 : 0xabcdef);
  for (ValueId i : g.inputs) h = hash_combine(h, static_cast<uint64_t>(i));
  for (ValueId o : g.outputs) h = hash_combine(h, static_cast<uint64_t>(o));
  return h;
}

std::string meta_str(const ValueMeta& m) {
  if (m.device.is_cpu()) return fmt::format("{}{}", dtype_name(m.dtype), m.shape.str());
  return fmt::format("{}{}@{}", dtype_name(m.dtype), m.shape.str(), m.device.str());
}

}  // namespace tpu::graph
