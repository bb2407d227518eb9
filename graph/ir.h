// The graph IR: SSA values and nodes as plain data (op definition, input value ids, attrs,
// output metas), ggml-style. A Graph owns its values (inputs, constants, node outputs), its
// nodes in topological order, its outputs, and, after fusion, its regions and buffer plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/attrs.h"
#include "ops/registry.h"
#include "tpucore/core/tensor.h"

namespace tpu::graph {

using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

struct ValueMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
  bool wrapped = false;  // a wrapped Python-style number (lowest rank in type promotion)
  friend bool operator==(const ValueMeta& a, const ValueMeta& b) {
    return a.shape == b.shape && a.dtype == b.dtype && a.device == b.device && a.wrapped == b.wrapped;
  }
};

enum class ValueKind : uint8_t { input, constant, node };

struct Value {
  ValueMeta meta;
  ValueKind kind = ValueKind::node;
  int32_t producer = -1;  // node index (kind node) or input position (kind input)
  int32_t out_index = 0;  // which output of the producer
  Tensor constant;        // kind constant: a real cpu tensor
};

struct Node {
  const ops::OpDef* op = nullptr;
  std::vector<ValueId> inputs;
  ops::Attrs attrs;
  std::vector<ValueId> outputs;
  int32_t region = -1;  // fusion region, or -1
  bool dead = false;    // removed by a pass; dropped by Graph::compact()
};

// A fused region: nodes run together, one pass over memory, tile by tile over `domain`.
// Codegen consumes the same regions.
enum class RegionKind : uint8_t { elementwise, rowwise, matmul_epilogue };
struct Region {
  RegionKind kind = RegionKind::elementwise;
  std::vector<int32_t> nodes;     // node indices in execution order
  Shape domain;                   // the iteration space (largest output shape)
  int tile_dim_limit = 0;         // tiles may split dims [0, tile_dim_limit] only
  std::vector<ValueId> inputs;    // values read from outside the region
  std::vector<ValueId> outputs;   // values used after the region (materialized)
};

// Buffer plan: intermediate values share slots by liveness.
struct BufferPlan {
  std::vector<int64_t> slot_bytes;   // size of each slot
  std::vector<int32_t> slot_of;      // per value: slot index or -1 (not planned)
  int64_t planned_peak_bytes = 0;    // sum of slot sizes
  int64_t unplanned_bytes = 0;       // what one buffer per value would take
  bool valid = false;
};

class Graph {
 public:
  std::vector<Value> values;
  std::vector<Node> nodes;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::vector<Region> regions;
  BufferPlan plan;
  // Compiled with emulate_precision_casts (tpucore/compile.h): the executors round every
  // intermediate whose eager op would have rounded and compute each op as its eager kernel does,
  // so results equal eager's bit for bit on the same device. Part of the structural hash.
  bool emulate_precision_casts = false;

  ValueId add_input(const ValueMeta& m);
  ValueId add_constant(Tensor t, bool wrapped = false);
  // Appends a node; returns its index. Output values are created from `metas`.
  int add_node(const ops::OpDef& op, std::vector<ValueId> inputs, ops::Attrs attrs, const std::vector<ValueMeta>& metas);

  const ValueMeta& meta(ValueId v) const { return values[static_cast<size_t>(v)].meta; }
  const Value& value(ValueId v) const { return values[static_cast<size_t>(v)]; }
  // The node that produces v, or nullptr for inputs and constants.
  const Node* producer(ValueId v) const;
  Node* producer(ValueId v);

  // Replaces every use of `from` (node inputs and graph outputs) with `to`.
  void replace_uses(ValueId from, ValueId to);
  // Number of uses of each value (node inputs of live nodes + graph outputs).
  std::vector<int32_t> use_counts() const;
  // Drops dead nodes and unreferenced constants/node values, renumbering ids. Clears regions
  // and the buffer plan (they refer to old ids).
  void compact();
  // Number of live nodes.
  size_t num_live_nodes() const;
};

// Attribute equality and hashing (plain data; Scalars compared by kind and value).
bool attr_value_equal(const ops::AttrValue& a, const ops::AttrValue& b);
bool attrs_equal(const ops::Attrs& a, const ops::Attrs& b);
uint64_t hash_attrs(const ops::Attrs& a, uint64_t seed);
uint64_t hash_combine(uint64_t seed, uint64_t v);
// Interns a string so that it can be used as an attribute name (Attr::name is a C string).
const char* intern(std::string_view s);

// Structural hash of a graph: ops, edges, attrs, metas and constant values. Equal graphs hash
// equally; used as the key of compiled segments and of the on-disk cache.
uint64_t structural_hash(const Graph& g);

std::string meta_str(const ValueMeta& m);  // "f32[8, 128]" (+ "@sim:0" off the cpu)

}  // namespace tpu::graph
