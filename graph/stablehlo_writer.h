// Internals of the StableHLO export (graph/stablehlo.h): a writer of generic-form ops on typed
// SSA values, and the composite ops (reductions, dot_general, softmax, norms, attention).
#pragma once

#include <string>
#include <vector>

#include "graph/stablehlo.h"

namespace tpu::graph::shlo {

struct Val {
  std::string name;  // "%v3"
  Shape shape;
  DType dtype = DType::f32;
};

class Writer {
 public:
  explicit Writer(const StableHloOptions& o) : opt_(o) {}

  static std::string elem_type(DType t);
  static std::string type(const Shape& s, DType t);
  static std::string type(const Val& v) { return type(v.shape, v.dtype); }
  // Attribute encodings that differ between the syntaxes.
  std::string i64s(const std::vector<int64_t>& v) const;
  std::string compare_dir(const char* dir) const;

  // One op: `%vN = "stablehlo.<op>"(ins) {attrs} : (types) -> type`.
  Val op(const std::string& name, const std::vector<Val>& ins, const std::string& attrs, const Shape& s, DType t);
  // Elementwise op whose result has the shape of its first input.
  Val ew(const std::string& name, const std::vector<Val>& ins, DType t);
  Val ew(const std::string& name, const std::vector<Val>& ins) { return ew(name, ins, ins.at(0).dtype); }
  // A scalar constant broadcast to `s` (a 0-d constant when s is 0-d).
  Val scalar(double x, DType t, const Shape& s);
  // A constant of a tensor's values.
  Val constant(const Tensor& t);
  Val convert(const Val& v, DType t);
  Val reshape(const Val& v, const Shape& s);
  Val transpose(const Val& v, const std::vector<int64_t>& perm);
  // Broadcasts with trailing alignment (numpy rules) to `s`; identity when the shape matches.
  Val broadcast_to(const Val& v, const Shape& s);
  // broadcast_in_dim with explicit dims.
  Val broadcast_in_dim(const Val& v, const Shape& s, const std::vector<int64_t>& dims);
  Val slice(const Val& v, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
            const std::vector<int64_t>& strides);
  Val concatenate(const std::vector<Val>& ins, int64_t dim);
  Val compare(const Val& a, const Val& b, const char* dir);
  Val select(const Val& c, const Val& a, const Val& b);
  Val iota(const Shape& s, DType t, int64_t dim);
  // reduce over `dims` with a body op ("add", "maximum", "minimum", "multiply", "and", "or") and
  // init value; the result drops the reduced dims.
  Val reduce(const Val& v, const std::vector<int64_t>& dims, const std::string& body, double init);
  Val dot_general(const Val& a, const Val& b, const std::vector<int64_t>& lb, const std::vector<int64_t>& rb,
                  const std::vector<int64_t>& lc, const std::vector<int64_t>& rc, const Shape& s);

  // A point scatter (coords: [..., rank]) with an add region (or for booleans); stablehlo_index.cpp.
  Val scatter_add(const Val& x, const Val& coords, const Val& upd);

  // `stablehlo.custom_call` to `target` with the given backend_config and extra attributes
  // (already written, comma-separated); one result per entry of `outs`.
  std::vector<Val> custom_call(const std::string& target, const std::vector<Val>& ins, const std::string& backend_config,
                               const std::string& extra_attrs, const std::vector<ValueMeta>& outs);

  std::string take() { return std::move(body_); }

 private:
  std::string fresh() { return "%v" + std::to_string(next_++); }
  const StableHloOptions& opt_;
  std::string body_;
  int next_ = 0;
};

// Composite ops (stablehlo_ops.cpp). Each returns false when the node's form does not map.
bool emit_composite(Writer& w, const Node& n, const std::vector<Val>& in, const std::vector<ValueMeta>& outs,
                    std::vector<Val>& res);
// Indexing ops (stablehlo_index.cpp): gather, index_select, embedding, scatter_add.
bool emit_index(Writer& w, const Node& n, const std::vector<Val>& in, const ValueMeta& om, std::vector<Val>& res);
// erf(x) as a polynomial (Abramowitz & Stegun 7.1.26), in x's dtype.
Val erf_approx(Writer& w, const Val& x);

}  // namespace tpu::graph::shlo
