// Eager reductions, softmax and norms on sim tensors: the input is viewed as rows x cols with
// the reduced (or normalized) dims last (a permuted view is gathered contiguous on the device
// first), one RowwiseKernel runs over it, and a permuted result is copied back into place.
// Reductions over rows too long for VMEM run in two stages (cols = c1 x c2).
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "codegen/launch.h"
#include "codegen/lowering.h"
#include "codegen/rowwise_kernel.h"
#include "codegen/sim_tensors.h"
#include "device/sim_driver.h"

namespace tpu::codegen {
namespace {


void run_rowwise(const RowwiseSpec& s, const Device& dev, const char* kernel, std::vector<int64_t> args) {
  const sim::ChipConfig& cfg = chip_config(dev);
  const LoadedProgram& p = cached_program(dev, rowwise_key(s), [&] { return make_rowwise_program(cfg, s); });
  launch(dev, p, kernel, std::move(args));
}

// x permuted so that `last` dims come last (in order), contiguous on the device.
std::optional<Tensor> rows_view(const Tensor& x, const std::vector<int>& last, std::vector<int64_t>& perm) {
  perm.clear();
  for (int d = 0; d < x.dim(); ++d)
    if (std::find(last.begin(), last.end(), d) == last.end()) perm.push_back(d);
  for (int d : last) perm.push_back(d);
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == int64_t(i);
  const Tensor v = identity ? x : x.permute(Shape(perm));
  return materialize_on_device(v);
}

bool reduce_eager(const ops::KernelArgs& k, RowOp op) {
  const Tensor& x = k.inputs[0];
  const Tensor& out = k.outputs[0];
  if (!float_chip(x.dtype()) || !float_chip(out.dtype()) || x.dtype() != out.dtype()) return false;
  if (out.numel() == 0) return true;
  std::vector<int> dims;
  if (x.dim() > 0)  // a 0-d input reduces over nothing (dims 0 / -1 name the scalar itself)
    for (int64_t d : k.attrs.get_ints("dims")) dims.push_back(int(d < 0 ? d + x.dim() : d));
  if (dims.empty())
    for (int d = 0; d < x.dim(); ++d) dims.push_back(d);
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  int64_t C = 1;
  for (int d : dims) C *= x.shape()[d];
  if (C == 0) return false;  // empty reductions: identities on the host
  const int64_t R = out.numel();
  std::vector<int64_t> perm;
  auto xv = rows_view(x, dims, perm);
  if (!xv) return false;
  const Device dev = x.device();
  const sim::ChipConfig& cfg = chip_config(dev);
  RowwiseSpec s{.op = op, .rows = R, .cols = C, .in_dtype = cd(x.dtype()), .out_dtype = cd(out.dtype())};
  s.scale = 1.0f / float(C);
  if (rowwise_tile_rows(cfg, s) > 0) {
    run_rowwise(s, dev, k.op.name.c_str(), {hbm_address(*xv), hbm_address(out)});
    return true;
  }
  // Two stages: [R*c1, c2] -> partial [R*c1] (f32), then [R, c1] -> out.
  int64_t c2 = 0;
  for (int64_t f = 2; f * f <= C; ++f)
    if (C % f == 0) {
      RowwiseSpec t = s;
      t.cols = C / f;
      if (rowwise_tile_rows(cfg, t) > 0) {
        c2 = C / f;
        break;
      }
    }
  if (c2 == 0) return false;
  const int64_t c1 = C / c2;
  Tensor part = ops::empty_tensor(Shape{R * c1}, DType::f32, x.device());
  RowwiseSpec s1 = s, s2 = s;
  s1.op = op == RowOp::mean ? RowOp::sum : op;
  s1.rows = R * c1;
  s1.cols = c2;
  s1.out_dtype = sim::DType::f32;
  s2.rows = R;
  s2.cols = c1;
  s2.in_dtype = sim::DType::f32;
  if (op == RowOp::min) {
    s2.op = RowOp::min;  // min of partial minima
  }
  run_rowwise(s1, dev, k.op.name.c_str(), {hbm_address(*xv), hbm_address(part)});
  run_rowwise(s2, dev, k.op.name.c_str(), {hbm_address(part), hbm_address(out)});
  return true;
}

bool sum_eager(const ops::KernelArgs& k) { return reduce_eager(k, RowOp::sum); }
bool mean_eager(const ops::KernelArgs& k) { return reduce_eager(k, RowOp::mean); }
bool amax_eager(const ops::KernelArgs& k) { return reduce_eager(k, RowOp::max); }
bool amin_eager(const ops::KernelArgs& k) { return reduce_eager(k, RowOp::min); }
bool logsumexp_eager(const ops::KernelArgs& k) { return reduce_eager(k, RowOp::logsumexp); }

// Runs a row program whose output has the input's shape: permuted inputs are gathered and the
// result copied back through the inverse permutation.
bool same_shape_rows(const ops::KernelArgs& k, RowwiseSpec s, const std::vector<int>& last,
                     const std::vector<int64_t>& param_addrs) {
  const Tensor& x = k.inputs[0];
  const Tensor& out = k.outputs[0];
  std::vector<int64_t> perm;
  auto xv = rows_view(x, last, perm);
  if (!xv) return false;
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == int64_t(i);
  const Device dev = x.device();
  Tensor dst = identity ? out : ops::empty_tensor(xv->shape(), out.dtype(), out.device());
  std::vector<int64_t> args{hbm_address(*xv)};
  args.insert(args.end(), param_addrs.begin(), param_addrs.end());
  args.push_back(hbm_address(dst));
  const sim::ChipConfig& cfg = chip_config(dev);
  if (rowwise_tile_rows(cfg, s) == 0) return false;
  run_rowwise(s, dev, k.op.name.c_str(), std::move(args));
  if (!identity) {
    std::vector<int64_t> inv(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inv[size_t(perm[i])] = int64_t(i);
    if (!copy_into(dst.permute(Shape(inv)), out)) return false;
  }
  return true;
}

bool softmax_impl(const ops::KernelArgs& k, RowOp op) {
  const Tensor& x = k.inputs[0];
  const Tensor& out = k.outputs[0];
  if (!float_chip(x.dtype()) || !float_chip(out.dtype())) return false;
  if (out.numel() == 0) return true;
  if (x.dim() == 0) return false;
  int d = int(k.attrs.get_int("dim"));
  if (d < 0) d += x.dim();
  const int64_t C = x.shape()[d];
  RowwiseSpec s{.op = op, .rows = x.numel() / C, .cols = C, .in_dtype = cd(x.dtype()), .out_dtype = cd(out.dtype())};
  return same_shape_rows(k, s, {d}, {});
}
bool softmax_eager(const ops::KernelArgs& k) { return softmax_impl(k, RowOp::softmax); }
bool log_softmax_eager(const ops::KernelArgs& k) { return softmax_impl(k, RowOp::log_softmax); }

bool norm_impl(const ops::KernelArgs& k, RowOp op) {
  const Tensor& x = k.inputs[0];
  const Tensor& out = k.outputs[0];
  if (!float_chip(x.dtype()) || !float_chip(out.dtype())) return false;
  if (out.numel() == 0) return true;
  const int nd = int(k.attrs.get_ints("normalized_shape").size());
  int64_t C = 1;
  std::vector<int> last;
  for (int d = x.dim() - nd; d < x.dim(); ++d) {
    C *= x.shape()[d];
    last.push_back(d);
  }
  if (C == 0) return false;
  RowwiseSpec s{.op = op, .rows = x.numel() / C, .cols = C, .in_dtype = cd(x.dtype()), .out_dtype = cd(out.dtype())};
  s.eps = float(k.attrs.get_float("eps"));
  s.has_weight = k.attrs.get_bool("has_weight");
  s.has_bias = op == RowOp::layer_norm && k.attrs.get_bool("has_bias");
  std::vector<int64_t> params;
  std::vector<Tensor> keep;
  DType pt = DType::f32;
  for (int i = 1; i <= 2; ++i) {
    if ((i == 1 && !s.has_weight) || (i == 2 && !s.has_bias)) continue;
    const Tensor& p = k.inputs[size_t(i)];
    if (!float_chip(p.dtype())) return false;
    if (i == 2 && s.has_weight && p.dtype() != pt) return false;
    pt = p.dtype();
    auto c = materialize_on_device(p);
    if (!c) return false;
    keep.push_back(*c);
    params.push_back(hbm_address(*c));
  }
  s.param_dtype = cd(pt);
  return same_shape_rows(k, s, last, params);
}
bool layer_norm_eager(const ops::KernelArgs& k) { return norm_impl(k, RowOp::layer_norm); }
bool rms_norm_eager(const ops::KernelArgs& k) { return norm_impl(k, RowOp::rms_norm); }

bool contiguous_eager(const ops::KernelArgs& k) {
  if (!chip_dtype(k.inputs[0].dtype()) && k.inputs[0].element_size() != 1 && k.inputs[0].element_size() != 2 &&
      k.inputs[0].element_size() != 4)
    return false;
  if (k.inputs[0].device() != k.outputs[0].device()) return false;
  return copy_into(k.inputs[0], k.outputs[0]);
}

template <bool (*F)(const ops::KernelArgs&)>
const Lowering* eager_rule() {
  static const Lowering l{.eager = F};
  return &l;
}

void install_rowwise_rules() {
  install_lowering("sum", eager_rule<&sum_eager>());
  install_lowering("mean", eager_rule<&mean_eager>());
  install_lowering("amax", eager_rule<&amax_eager>());
  install_lowering("amin", eager_rule<&amin_eager>());
  install_lowering("logsumexp", eager_rule<&logsumexp_eager>());
  install_lowering("softmax", eager_rule<&softmax_eager>());
  install_lowering("log_softmax", eager_rule<&log_softmax_eager>());
  install_lowering("layer_norm", eager_rule<&layer_norm_eager>());
  install_lowering("rms_norm", eager_rule<&rms_norm_eager>());
  install_lowering("contiguous", eager_rule<&contiguous_eager>());
}

[[maybe_unused]] const bool g_rowwise_rules_installed = (install_rowwise_rules(), true);

}  // namespace
}  // namespace tpu::codegen
