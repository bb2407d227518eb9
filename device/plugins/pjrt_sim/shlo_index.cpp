// The gather and scatter forms tpu::export_stablehlo writes (graph/stablehlo_index.cpp), run
// with tpucore's index_select and scatter_add on flat or sliced operands. Gather start indices
// are clamped into the operand and out-of-range scatter updates are skipped, as the StableHLO
// spec defines them. Other forms are an error naming the line.
#include "device/plugins/pjrt_sim/shlo_index.h"

#include <numeric>

#include <fmt/format.h>

#include "tpucore/core/error.h"
#include "tpucore/ops.h"

namespace tpu::pjrt_sim {
namespace {

// "[1, 2]" after name (empty when the field is absent, as the printer omits empty lists).
std::vector<int64_t> list(const Op& op, const std::string& name) {
  const std::string a = attr(op, name);
  if (a.empty()) return {};
  if (a[0] != '[') bad(op, "expected '[' after '" + name + " ='");
  return int_list(a.substr(0, a.find(']')));
}

int64_t index_vector_dim(const Op& op) {
  const std::string a = attr(op, "index_vector_dim");
  if (a.empty()) bad(op, "missing 'index_vector_dim'");
  return std::stoll(a);
}

// slice_sizes = array<i64: ...> or dense<[...]> : tensor<Nxi64>.
std::vector<int64_t> slice_sizes(const Op& op) {
  const std::string a = attr(op, "slice_sizes");
  if (a.rfind("array<i64", 0) == 0) return int_list(a.substr(9, a.find('>') - 9));
  if (a.rfind("dense<", 0) == 0) return int_list(a.substr(6, a.find('>') - 6));
  bad(op, "missing 'slice_sizes'");
}

std::vector<int64_t> iota_list(int n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Flat positions in x of full coordinates c ([..., rank] along the last dim), and which are in range.
std::pair<Tensor, Tensor> flat_positions(const Tensor& x, const Tensor& c, bool clamp_in) {
  const int r = x.dim();
  Tensor lin, ok;
  int64_t stride = 1;
  for (int k = r - 1; k >= 0; --k) {
    Tensor ck = c.select(-1, k).to(DType::i64);
    const int64_t n = x.shape()[k];
    Tensor in = logical_and(ge(ck, Scalar(int64_t(0))), lt(ck, Scalar(n)));
    ok = ok.defined() ? logical_and(ok, in) : in;
    if (clamp_in) ck = clamp(ck, Scalar(int64_t(0)), Scalar(n - 1));
    Tensor term = mul(ck, Scalar(stride));
    lin = lin.defined() ? add(lin, term) : term;
    stride *= n;
  }
  return {lin, ok};
}

}  // namespace

Tensor run_gather(const Op& op, const Tensor& x, const Tensor& idx) {
  const auto offset = list(op, "offset_dims"), collapsed = list(op, "collapsed_slice_dims"),
             smap = list(op, "start_index_map"), sizes = slice_sizes(op);
  const int64_t ivd = index_vector_dim(op);
  const int r = x.dim();
  if (int(sizes.size()) != r) bad(op, "slice_sizes does not match the operand's rank");
  if (!list(op, "operand_batching_dims").empty()) bad(op, "batching dims are not supported");
  const Tensor ids = idx.to(DType::i64);
  if (smap.size() == 1 && collapsed == smap) {  // slices along one dim (index_select, embedding)
    const int64_t d = smap[0];
    for (int k = 0; k < r; ++k)
      if (sizes[size_t(k)] != (k == d ? 1 : x.shape()[k])) bad(op, "only full slices along the other dims are supported");
    Tensor id = ids;
    if (ivd == ids.dim() - 1 && ids.dim() > 0 && ids.shape()[int(ivd)] == 1) id = ids.select(-1, 0);
    else if (ivd != ids.dim()) bad(op, "index_vector_dim must be the last (or an implicit trailing) dim");
    const int64_t b = id.dim();
    std::vector<int64_t> want;
    for (int64_t k = 0; k < r - 1 + b; ++k)
      if (k < d || k >= d + b) want.push_back(k);
    if (offset != want) bad(op, "offset_dims must put the index dims where the gathered dim was");
    const Tensor flat = clamp(id.reshape({id.numel()}), Scalar(int64_t(0)), Scalar(x.shape()[int(d)] - 1));
    return index_select(x, d, flat).reshape(op.type.shape);
  }
  const auto all = iota_list(r);
  if (collapsed == all && smap == all && offset.empty() && ids.dim() > 0 && ivd == ids.dim() - 1 && ids.shape()[int(ivd)] == r &&
      sizes == std::vector<int64_t>(size_t(r), 1)) {  // one element per full coordinate (torch-style gather)
    const Tensor lin = flat_positions(x, ids, true).first;
    return index_select(x.reshape({x.numel()}), 0, lin.reshape({lin.numel()})).reshape(op.type.shape);
  }
  bad(op, "this gather form is not supported (one collapsed dim with full slices, or full coordinates)");
}

Tensor run_scatter(const Op& op, const Tensor& x, const Tensor& idx, const Tensor& upd) {
  const int r = x.dim();
  const auto all = iota_list(r);
  if (op.body != "add" && !(op.body == "or" && x.dtype() == DType::boolean)) bad(op, "only an add region is supported");
  if (list(op, "inserted_window_dims") != all || list(op, "scatter_dims_to_operand_dims") != all ||
      !list(op, "update_window_dims").empty() || index_vector_dim(op) != idx.dim() - 1 || idx.dim() == 0 || idx.shape()[idx.dim() - 1] != r)
    bad(op, "only point scatters over full coordinates are supported");
  if (upd.dtype() != x.dtype()) bad(op, "updates of another dtype than the operand");
  auto [lin, ok] = flat_positions(x, idx, false);
  const Tensor pos = where(ok, lin, Scalar(int64_t(0)));  // out-of-range updates are skipped
  const Tensor u = where(ok, upd, zeros_like(upd));
  return scatter_add(x.contiguous().reshape({x.numel()}), 0, pos.reshape({pos.numel()}), u.contiguous().reshape({u.numel()}))
      .reshape(x.shape());
}

}  // namespace tpu::pjrt_sim
