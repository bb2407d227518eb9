// StableHLO export, indexing ops: index_select and embedding as a slice-gather, torch-style
// gather(x, dim, index) as a point gather over full coordinates (iota for every dim but `dim`),
// scatter_add as a point scatter with an add region. Out-of-range indices follow StableHLO:
// gather clamps each start index into the operand, scatter skips the update (documented in
// tpucore/export.h; the cpu kernels raise an error instead).
#include <fmt/format.h>

#include "graph/stablehlo_writer.h"

namespace tpu::graph::shlo {
namespace {

std::string dims_field(const char* key, const std::vector<int64_t>& v) {
  return v.empty() ? std::string() : fmt::format("{} = [{}], ", key, fmt::join(v, ", "));
}

// Index values as i32 or i64 (narrower integer ids are widened).
Val index_val(Writer& w, const Val& v) {
  return v.dtype == DType::i32 || v.dtype == DType::i64 ? v : w.convert(v, DType::i64);
}

Val gather(Writer& w, const Val& x, const Val& idx, const std::vector<int64_t>& offset,
           const std::vector<int64_t>& collapsed, const std::vector<int64_t>& start_map, int64_t ivd,
           const std::vector<int64_t>& sizes, const Shape& s) {
  const std::string dn = dims_field("offset_dims", offset) + dims_field("collapsed_slice_dims", collapsed) +
                         dims_field("start_index_map", start_map) + fmt::format("index_vector_dim = {}", ivd);
  return w.op("gather", {x, idx},
              fmt::format("dimension_numbers = #stablehlo.gather<{}>, indices_are_sorted = false, slice_sizes = {}", dn,
                          w.i64s(sizes)),
              s, x.dtype);
}

// Full coordinates of index's elements in x: shape index.shape + [rank], the index values at
// `dim`, the element's own coordinate elsewhere.
Val coordinates(Writer& w, const Val& index, int64_t dim) {
  const Val id = index_val(w, index);
  const int r = id.shape.ndim();
  Shape one = id.shape;
  one.push_back(1);
  std::vector<Val> parts;
  for (int k = 0; k < r; ++k) parts.push_back(w.reshape(k == dim ? id : w.iota(id.shape, id.dtype, k), one));
  return w.concatenate(parts, r);
}

int64_t wrap(int64_t d, int nd) { return d < 0 ? d + nd : d; }

}  // namespace

Val Writer::scatter_add(const Val& x, const Val& coords, const Val& upd) {
  const int r = x.shape.ndim();
  std::vector<int64_t> all;
  for (int k = 0; k < r; ++k) all.push_back(k);
  const std::string dn = dims_field("inserted_window_dims", all) + dims_field("scatter_dims_to_operand_dims", all) +
                         fmt::format("index_vector_dim = {}", r);
  Val res{fresh(), x.shape, x.dtype};
  const std::string st = type({}, x.dtype);
  body_ += fmt::format("    {} = \"stablehlo.scatter\"({}, {}, {}) ({{\n", res.name, x.name, coords.name, upd.name);
  body_ += fmt::format("    ^bb0({0}a: {1}, {0}b: {1}):\n", res.name, st);
  body_ += fmt::format("      {0}r = \"stablehlo.{1}\"({0}a, {0}b) : ({2}, {2}) -> {2}\n", res.name,
                       x.dtype == DType::boolean ? "or" : "add", st);
  body_ += fmt::format("      \"stablehlo.return\"({}r) : ({}) -> ()\n", res.name, st);
  body_ += fmt::format(
      "    }}) {{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<{}>, unique_indices = "
      "false}} : ({}, {}, {}) -> {}\n",
      dn, type(x), type(coords), type(upd), type(res));
  return res;
}

bool emit_index(Writer& w, const Node& n, const std::vector<Val>& in, const ValueMeta& om, std::vector<Val>& res) {
  const std::string& name = n.op->name;
  if (name == "index_select") {
    const Val& x = in[0];
    const int r = x.shape.ndim();
    if (r == 0) return false;
    const int64_t d = wrap(n.attrs.get_int("dim"), r);
    const Val id = w.reshape(index_val(w, in[1]), Shape{in[1].shape.numel()});
    std::vector<int64_t> offset, sizes = x.shape.vec();
    for (int k = 0; k < r; ++k)
      if (k != d) offset.push_back(k);
    sizes[size_t(d)] = 1;
    res.push_back(gather(w, x, id, offset, {d}, {d}, 1, sizes, om.shape));
    return true;
  }
  if (name == "embedding") {
    const Val& wt = in[0];
    const Val id = index_val(w, in[1]);
    const int64_t b = id.shape.ndim();
    res.push_back(gather(w, wt, id, {b}, {0}, {0}, b, {1, wt.shape[1]}, om.shape));
    return true;
  }
  if (name == "gather" || name == "scatter_add") {
    const Val& x = in[0];
    const int r = x.shape.ndim();
    if (r == 0) return false;
    const int64_t d = wrap(n.attrs.get_int("dim"), r);
    const Val c = coordinates(w, in[1], d);
    std::vector<int64_t> all, ones(size_t(r), 1);
    for (int k = 0; k < r; ++k) all.push_back(k);
    if (name == "gather") {
      res.push_back(gather(w, x, c, {}, all, all, r, ones, om.shape));
      return true;
    }
    // src may be larger than index: only its index-shaped corner is added.
    Val src = in[2];
    if (src.shape != in[1].shape)
      src = w.slice(src, std::vector<int64_t>(size_t(r), 0), in[1].shape.vec(), ones);
    res.push_back(w.scatter_add(x, c, src));
    return true;
  }
  return false;
}

}  // namespace tpu::graph::shlo
